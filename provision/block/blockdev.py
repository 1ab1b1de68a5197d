"""What is really on a block device: size, signatures, mounts, holders, loop backing.

sysfs and /proc first (no subprocess for what the kernel already tells), `blkid` and
`wipefs` for on-disk signatures. Every function reads; none changes anything.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hotcache.provision.block import probe
from hotcache.provision.block.host import Host
from hotcache.provision.errors import ProbeFailed
from hotcache.provision.system.mountinfo import Mount


def mount_at(host: Host, mountpoint: str) -> Mount | None:
    target = host.realpath(mountpoint)
    found = [m for m in host.mounts() if m.mountpoint == target]
    return found[-1] if found else None


def sysfs(host: Host, node: str) -> Path:
    """The local folder of /sys/class/block/<kernel name> of `node`."""
    return host.path(host.sysfs(node))


def size_bytes(host: Host, node: str) -> int:
    return int((sysfs(host, node) / "size").read_text()) * 512


def holders(host: Host, node: str) -> list[str]:
    d = sysfs(host, node) / "holders"
    return sorted(os.listdir(d)) if d.is_dir() else []


def rotational(host: Host, node: str) -> bool | None:
    p = sysfs(host, node)
    # Partitions have no queue/ of their own: ask the parent disk.
    q = p / "queue" / "rotational"
    if not q.exists():
        q = p.resolve().parent / "queue" / "rotational"
    return q.read_text().strip() == "1" if q.exists() else None


def mountpoints_of(host: Host, node: str) -> list[str]:
    """Mounts of the device itself and of its partitions."""
    nums = {host.devnum(node)}
    base = sysfs(host, node)
    for child in base.iterdir() if base.is_dir() else []:
        dev = child / "dev"
        if (child / "partition").exists() and dev.exists():
            nums.add(dev.read_text().strip())
    return [m.mountpoint for m in host.mounts() if m.source_dev in nums]


# Root filesystems that live on no local disk: nothing to protect.
DISKLESS_ROOTS = {"tmpfs", "ramfs", "rootfs", "nfs", "nfs4", "9p", "virtiofs", "cifs", "smb3"}


class RootDevices(set[str]):
    """Kernel names of every device beneath `/`. `unknown` says why they could not be
    determined; then no device is safe (see DeviceReport.problems)."""

    unknown: str | None = None


def root_devices(host: Host) -> RootDevices:
    """The device holding / and every device beneath it (partition -> disk, dm/md ->
    slaves), through btrfs (all its devices), overlay (the filesystems of its upper and
    lower folders) and ZFS (the pool's members)."""
    roots = RootDevices()
    try:
        _devices_under(host, "/", roots, depth=0)
    except _Unknown as exc:
        roots.unknown = str(exc)
    return roots


class _Unknown(Exception):
    pass


def _devices_under(host: Host, path: str, roots: set[str], depth: int,
                   above: Mount | None = None) -> None:
    mnt = _mount_containing(host, path)
    if mnt is None:
        raise _Unknown(f"no mount holds {path}")
    if above is not None and (mnt == above or depth > 8):   # depth > 0 only with above
        raise _Unknown(f"the folders under the {above.fstype} on {above.mountpoint} are on "
                       "no filesystem visible here (a container?)")
    link = host.path(f"/sys/dev/block/{mnt.source_dev}")
    if link.exists():
        return _walk(link.resolve(), roots)
    fstype = mnt.fstype
    if fstype in DISKLESS_ROOTS or fstype.startswith("fuse."):
        return None
    if fstype == "btrfs":
        member = host.kname(mnt.source)
        for fs in host.path("/sys/fs/btrfs").glob("*/devices"):
            names = {d.name for d in fs.iterdir()}
            if member in names:
                for d in fs.iterdir():
                    _walk(d.resolve(), roots)
                return None
        raise _Unknown(f"btrfs on {mnt.mountpoint}: {mnt.source} is in no /sys/fs/btrfs "
                       "device list")
    if fstype == "overlay":
        dirs = [opt.split("=", 1)[1] for opt in mnt.options
                if opt.startswith(("upperdir=", "lowerdir=", "workdir="))]
        if not dirs:
            raise _Unknown(f"overlay on {mnt.mountpoint} shows no upper or lower folder")
        for folders in dirs:
            for folder in folders.split(":"):
                _devices_under(host, folder, roots, depth + 1, mnt)
        return None
    if fstype == "zfs":
        pool = mnt.source.split("/")[0]
        res = probe.run(host.runner, ["lsblk", "--json", "--output", "KNAME,FSTYPE,LABEL"])
        rows = probe.json_doc(res).get("blockdevices")
        if not isinstance(rows, list):
            raise ProbeFailed(res.argv, 0, res.stderr, why="its JSON has no blockdevices list")
        members = [r["kname"] for r in rows if isinstance(r, dict)
                   and r.get("fstype") == "zfs_member" and r.get("label") == pool]
        if not members:
            raise _Unknown(f"zfs pool {pool} on {mnt.mountpoint}: lsblk shows none of its "
                           "member devices")
        for name in members:
            _walk(host.path(f"/sys/class/block/{name}").resolve(), roots)
        return None
    raise _Unknown(f"{fstype} on {mnt.mountpoint} ({mnt.source}) names no block device")


def _mount_containing(host: Host, path: str) -> Mount | None:
    target = os.path.normpath(path)
    best = None
    for m in host.mounts():
        mp = m.mountpoint.rstrip("/") or "/"
        if target == mp or target.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/"):
                best = m
    return best


def _walk(start: Path, roots: set[str]) -> None:
    todo = [start]
    while todo:
        p = todo.pop()
        if p.name in roots:
            continue
        roots.add(p.name)
        if (p / "partition").exists():
            todo.append(p.parent)
        slaves = p / "slaves"
        if slaves.is_dir():
            todo += [(slaves / s).resolve() for s in os.listdir(slaves)]


# Signatures that mean a partition is part of something else even when nothing is
# mounted: erasing the disk's partition table would destroy it.
IN_USE_TYPES = {"LVM2_member": "an LVM physical volume", "linux_raid_member":
                "an md RAID member", "crypto_LUKS": "a LUKS device", "swap": "swap space",
                "zfs_member": "a ZFS pool member", "bcache": "a bcache device"}


def partitions(host: Host, node: str) -> list[str]:
    """Kernel names of the partitions of a whole disk (sysfs lists them inside it)."""
    base = sysfs(host, node)
    if not base.is_dir():
        return []
    return sorted(c.name for c in base.iterdir() if (c / "partition").exists())


def active_swaps(host: Host) -> set[str]:
    try:
        lines = host.path("/proc/swaps").read_text().splitlines()[1:]
    except FileNotFoundError:
        return set()
    return {host.kname(line.split()[0]) for line in lines if line.strip()}


def partitions_in_use(host: Host, node: str) -> list[str]:
    """Why partitions of `node` are in use: holders (an active LV, md, dm-crypt, bcache),
    active swap, or a signature saying it belongs to LVM, md, LUKS, swap or ZFS. Mounts
    are in mountpoints_of. Any of these refuses the whole disk, even with wipe: true."""
    swaps = active_swaps(host)
    out = []
    for part in partitions(host, node):
        dev = f"/dev/{part}"
        held = holders(host, dev)
        if held:
            out.append(f"its partition {dev} is in use by {', '.join(held)} (holders)")
        if part in swaps:
            out.append(f"its partition {dev} is active swap")
        kind = IN_USE_TYPES.get(fs_identity(host, dev).get("TYPE", ""))
        if kind:
            out.append(f"its partition {dev} is {kind}")
    return out


def by_id_links(host: Host, node: str) -> list[str]:
    target = host.realpath(node)
    return [f"/dev/disk/by-id/{name}" for name in host.listdir("/dev/disk/by-id")
            if host.realpath(f"/dev/disk/by-id/{name}") == target]


def signatures(host: Host, node: str) -> list[dict[str, Any]]:
    """Every signature `wipefs` sees: filesystems, RAID, LVM, bcache, partition tables.
    wipefs prints nothing (older) or an empty list for a blank device; any failure, or
    output that is not its JSON, raises ProbeFailed."""
    res = probe.run(host.runner, ["wipefs", "--no-act", "--json", node])
    if not res.stdout.strip():
        return []
    sigs = probe.json_doc(res).get("signatures")
    if not isinstance(sigs, list):
        raise ProbeFailed(res.argv, 0, res.stderr, why="its JSON has no `signatures` list")
    return sigs


def fs_identity(host: Host, node: str, *, offset: int = 0) -> dict[str, str]:
    """TYPE, UUID, LABEL as blkid reads them from the device itself (no cache), or from
    `offset` bytes in (a filesystem behind hotcache's header). blkid exits 2 for
    "nothing found" and, silently, for a device it could not open: only a quiet exit 2
    on a device we can open reads as blank. While a plan is made (Host.holding_probes)
    a device is read once."""
    return dict(host.held(("blkid", node, str(offset)), lambda: _blkid(host, node, offset)))


def _blkid(host: Host, node: str, offset: int) -> dict[str, str]:
    at = ["--offset", str(offset)] if offset else []
    argv = ["blkid", "--probe", *at, "--output", "export", node]
    res = probe.run(host.runner, argv, absent_rc=(2,))
    if res is None:
        if probe.readable(host.path(node)):
            return {}
        raise ProbeFailed(argv, 2, "", why=f"it found nothing and {node} cannot be opened")
    info = {}
    for line in res.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not line.strip():
            continue
        if not sep:
            raise ProbeFailed(argv, 0, res.stderr, why=f"unexpected output line {line!r}")
        info[key] = value
    return info


# --- loop devices ---------------------------------------------------------------

def loop_for_file(host: Host, image: str) -> str | None:
    """The /dev/loopN whose backing file is `image`, from sysfs; None if not attached."""
    target = os.path.realpath(image)
    for entry in sorted(host.path("/sys/class/block").glob("loop*/loop/backing_file")):
        try:
            backing = entry.read_text().strip()
        except FileNotFoundError:      # detached between the listing and the read
            continue
        if backing == target:
            return f"/dev/{entry.parent.parent.name}"
    return None


def loop_backing_file(host: Host, node: str) -> str | None:
    f = sysfs(host, node) / "loop" / "backing_file"
    return f.read_text().strip() if f.exists() else None


@dataclass
class DeviceReport:
    """One device as `hotcache devices` and preflight see it."""

    node: str
    size: int
    rotational: bool | None
    model: str | None = None
    serial: str | None = None
    by_id: list[str] = field(default_factory=list)
    signatures: list[dict[str, Any]] = field(default_factory=list)
    mountpoints: list[str] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)
    loop_file: str | None = None
    holds_root: bool = False
    unreadable: str | None = None     # why its signatures could not be probed
    root_unknown: str | None = None   # why the devices under / could not be determined
    in_use: list[str] = field(default_factory=list)   # partitions in use, active swap

    @property
    def kind(self) -> str:
        return {True: "HDD", False: "SSD", None: "?"}[self.rotational]

    def problems(self) -> list[str]:
        """Why this device is not safe to use as it is (empty: safe)."""
        out = self.hard_problems()
        if self.unreadable:
            out.insert(0, f"its signatures cannot be read ({self.unreadable})")
        if self.signatures:
            kinds = sorted({s.get("type", "?") for s in self.signatures})
            out.append(f"it carries signatures: {', '.join(kinds)}")
        return out

    def hard_problems(self) -> list[str]:
        """What no `wipe: true` overrides: root, mounts, holders, partitions in use."""
        out = []
        if self.holds_root:
            out.append("it holds the root filesystem")
        elif self.root_unknown:
            out.append(f"it may hold the root filesystem: hotcache cannot tell which disk "
                       f"holds / ({self.root_unknown}), so it refuses every device")
        out += self.in_use
        if self.mountpoints:
            out.append(f"it is mounted at {', '.join(self.mountpoints)}")
        if self.holders:
            out.append(f"it is in use by {', '.join(self.holders)} (holders)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind, "safe": not self.problems(),
                "problems": self.problems()}


def report(host: Host, node: str, *, roots: set[str] | None = None,
           strict: bool = True) -> DeviceReport:
    """The device as it is. A failed signature probe raises (strict: planning) or is
    noted in `unreadable`, which makes the device unsafe (listing devices)."""
    roots = root_devices(host) if roots is None else roots
    unreadable, in_use = None, []
    try:
        sigs = signatures(host, node)
        in_use = partitions_in_use(host, node)
        if host.kname(node) in active_swaps(host):
            in_use.append("it is active swap")
    except ProbeFailed as exc:
        if strict:
            raise
        sigs, unreadable = [], exc.message
    name = host.kname(node)
    base = sysfs(host, node)

    def attr(*rel: str) -> str | None:
        for r in rel:
            p = base / r
            if p.exists():
                return p.read_text().strip() or None
        return None

    return DeviceReport(
        node=f"/dev/{name}", size=size_bytes(host, node), rotational=rotational(host, node),
        model=attr("device/model"), serial=attr("device/serial", "serial"),
        by_id=by_id_links(host, node), signatures=sigs, unreadable=unreadable,
        mountpoints=mountpoints_of(host, node), holders=holders(host, node),
        loop_file=loop_backing_file(host, node), holds_root=name in roots,
        root_unknown=getattr(roots, "unknown", None), in_use=in_use,
    )

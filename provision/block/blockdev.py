"""What is really on a block device: size, signatures, mounts, holders, loop backing.

sysfs and /proc first (no subprocess for what the kernel already tells), `blkid` and
`wipefs` for on-disk signatures. Every function reads; none changes anything.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hotcache.provision.block import probe
from hotcache.provision.errors import ProbeFailed
from hotcache.provision.system import mountinfo
from hotcache.provision.system.mountinfo import Mount
from hotcache.provision.system.runner import Runner

SYS_BLOCK = Path("/sys/class/block")


def mounts() -> list[Mount]:
    """/proc/self/mountinfo: the kernel's own view, with major:minor numbers."""
    return mountinfo.read()


def mount_at(mountpoint: str) -> Mount | None:
    target = os.path.realpath(mountpoint)
    found = [m for m in mounts() if m.mountpoint == target]
    return found[-1] if found else None


def devnum(node: str) -> str:
    dev = sysfs(node) / "dev"
    if dev.exists():
        return dev.read_text().strip()
    st = os.stat(node)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def kname(node: str) -> str:
    return os.path.basename(os.path.realpath(node))


def sysfs(node: str) -> Path:
    return SYS_BLOCK / kname(node)


def size_bytes(node: str) -> int:
    return int((sysfs(node) / "size").read_text()) * 512


def holders(node: str) -> list[str]:
    d = sysfs(node) / "holders"
    return sorted(os.listdir(d)) if d.is_dir() else []


def rotational(node: str) -> bool | None:
    p = sysfs(node)
    # Partitions have no queue/ of their own: ask the parent disk.
    q = p / "queue" / "rotational"
    if not q.exists():
        q = p.resolve().parent / "queue" / "rotational"
    return q.read_text().strip() == "1" if q.exists() else None


def mountpoints_of(node: str) -> list[str]:
    """Mounts of the device itself and of its partitions."""
    nums = {devnum(node)}
    base = sysfs(node)
    for child in base.iterdir() if base.is_dir() else []:
        dev = child / "dev"
        if (child / "partition").exists() and dev.exists():
            nums.add(dev.read_text().strip())
    return [m.mountpoint for m in mounts() if m.source_dev in nums]


SYS_DEV_BLOCK = Path("/sys/dev/block")
SYS_FS_BTRFS = Path("/sys/fs/btrfs")
PROC_SWAPS = Path("/proc/swaps")
# Root filesystems that live on no local disk: nothing to protect.
DISKLESS_ROOTS = {"tmpfs", "ramfs", "rootfs", "nfs", "nfs4", "9p", "virtiofs", "cifs", "smb3"}


class RootDevices(set):
    """Kernel names of every device beneath `/`. `unknown` says why they could not be
    determined; then no device is safe (see DeviceReport.problems)."""

    unknown: str | None = None


def root_devices(runner: Runner | None = None) -> RootDevices:
    """The device holding / and every device beneath it (partition -> disk, dm/md ->
    slaves), through btrfs (all its devices), overlay (the filesystems of its upper and
    lower folders) and ZFS (the pool's members)."""
    roots = RootDevices()
    try:
        _devices_under("/", roots, runner or Runner(), depth=0)
    except _Unknown as exc:
        roots.unknown = str(exc)
    return roots


class _Unknown(Exception):
    pass


def _devices_under(path: str, roots: set[str], runner: Runner, depth: int,
                   above: Mount | None = None) -> None:
    mnt = _mount_containing(path)
    if mnt is None:
        raise _Unknown(f"no mount holds {path}")
    if mnt == above or depth > 8:
        raise _Unknown(f"the folders under the {above.fstype} on {above.mountpoint} are on "
                       "no filesystem visible here (a container?)")
    link = SYS_DEV_BLOCK / mnt.source_dev
    if link.exists():
        return _walk(link.resolve(), roots)
    fstype = mnt.fstype
    if fstype in DISKLESS_ROOTS or fstype.startswith("fuse."):
        return None
    if fstype == "btrfs":
        member = kname(mnt.source)
        for fs in SYS_FS_BTRFS.glob("*/devices"):
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
                _devices_under(folder, roots, runner, depth + 1, mnt)
        return None
    if fstype == "zfs":
        pool = mnt.source.split("/")[0]
        res = probe.run(runner, ["lsblk", "--json", "--output", "KNAME,FSTYPE,LABEL"])
        rows = probe.json_doc(res).get("blockdevices")
        if not isinstance(rows, list):
            raise ProbeFailed(res.argv, 0, res.stderr, why="its JSON has no blockdevices list")
        members = [r["kname"] for r in rows if isinstance(r, dict)
                   and r.get("fstype") == "zfs_member" and r.get("label") == pool]
        if not members:
            raise _Unknown(f"zfs pool {pool} on {mnt.mountpoint}: lsblk shows none of its "
                           "member devices")
        for name in members:
            _walk((SYS_BLOCK / name).resolve(), roots)
        return None
    raise _Unknown(f"{fstype} on {mnt.mountpoint} ({mnt.source}) names no block device")


def _mount_containing(path: str) -> Mount | None:
    target = os.path.normpath(path)
    best = None
    for m in mounts():
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


def partitions(node: str) -> list[str]:
    """Kernel names of the partitions of a whole disk (sysfs lists them inside it)."""
    base = sysfs(node)
    if not base.is_dir():
        return []
    return sorted(c.name for c in base.iterdir() if (c / "partition").exists())


def active_swaps() -> set[str]:
    try:
        lines = PROC_SWAPS.read_text().splitlines()[1:]
    except FileNotFoundError:
        return set()
    return {kname(line.split()[0]) for line in lines if line.strip()}


def partitions_in_use(node: str, runner: Runner) -> list[str]:
    """Why partitions of `node` are in use: holders (an active LV, md, dm-crypt, bcache),
    active swap, or a signature saying it belongs to LVM, md, LUKS, swap or ZFS. Mounts
    are in mountpoints_of. Any of these refuses the whole disk, even with wipe: true."""
    swaps = active_swaps()
    out = []
    for part in partitions(node):
        dev = f"/dev/{part}"
        held = holders(dev)
        if held:
            out.append(f"its partition {dev} is in use by {', '.join(held)} (holders)")
        if part in swaps:
            out.append(f"its partition {dev} is active swap")
        kind = IN_USE_TYPES.get(fs_identity(dev, runner).get("TYPE", ""))
        if kind:
            out.append(f"its partition {dev} is {kind}")
    return out


def by_id_links(node: str) -> list[str]:
    d = Path("/dev/disk/by-id")
    if not d.is_dir():
        return []
    target = os.path.realpath(node)
    return sorted(str(p) for p in d.iterdir() if os.path.realpath(p) == target)


def signatures(node: str, runner: Runner) -> list[dict]:
    """Every signature `wipefs` sees: filesystems, RAID, LVM, bcache, partition tables.
    wipefs prints nothing (older) or an empty list for a blank device; any failure, or
    output that is not its JSON, raises ProbeFailed."""
    res = probe.run(runner, ["wipefs", "--no-act", "--json", node])
    if not res.stdout.strip():
        return []
    sigs = probe.json_doc(res).get("signatures")
    if not isinstance(sigs, list):
        raise ProbeFailed(res.argv, 0, res.stderr, why="its JSON has no `signatures` list")
    return sigs


def fs_identity(node: str, runner: Runner) -> dict:
    """TYPE, UUID, LABEL as blkid reads them from the device itself (no cache). blkid
    exits 2 for "nothing found" and, silently, for a device it could not open: only a
    quiet exit 2 on a device we can open reads as blank."""
    argv = ["blkid", "--probe", "--output", "export", node]
    res = probe.run(runner, argv, absent_rc=(2,))
    if res is None:
        if probe.readable(node):
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

def loop_for_file(image: str) -> str | None:
    """The /dev/loopN whose backing file is `image`, from sysfs; None if not attached."""
    target = os.path.realpath(image)
    for entry in sorted(SYS_BLOCK.glob("loop*/loop/backing_file")):
        try:
            backing = entry.read_text().strip()
        except FileNotFoundError:      # detached between the listing and the read
            continue
        if backing == target:
            return f"/dev/{entry.parent.parent.name}"
    return None


def loop_backing_file(node: str) -> str | None:
    f = sysfs(node) / "loop" / "backing_file"
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
    signatures: list[dict] = field(default_factory=list)
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

    def to_json(self) -> dict:
        return {**asdict(self), "kind": self.kind, "safe": not self.problems(),
                "problems": self.problems()}


def report(node: str, runner: Runner, *, roots: set[str] | None = None,
           strict: bool = True) -> DeviceReport:
    """The device as it is. A failed signature probe raises (strict: planning) or is
    noted in `unreadable`, which makes the device unsafe (listing devices)."""
    roots = root_devices(runner) if roots is None else roots
    unreadable, in_use = None, []
    try:
        sigs = signatures(node, runner)
        in_use = partitions_in_use(node, runner)
        if kname(node) in active_swaps():
            in_use.append("it is active swap")
    except ProbeFailed as exc:
        if strict:
            raise
        sigs, unreadable = [], exc.message
    name = kname(node)
    base = sysfs(node)

    def attr(*rel: str) -> str | None:
        for r in rel:
            p = base / r
            if p.exists():
                return p.read_text().strip() or None
        return None

    return DeviceReport(
        node=f"/dev/{name}", size=size_bytes(node), rotational=rotational(node),
        model=attr("device/model"), serial=attr("device/serial", "serial"),
        by_id=by_id_links(node), signatures=sigs, unreadable=unreadable,
        mountpoints=mountpoints_of(node), holders=holders(node),
        loop_file=loop_backing_file(node), holds_root=name in roots,
        root_unknown=getattr(roots, "unknown", None), in_use=in_use,
    )

"""What is really on a block device: size, signatures, mounts, holders, loop backing.

sysfs and /proc first (no subprocess for what the kernel already tells), `blkid` and
`wipefs` for on-disk signatures. Every function reads; none changes anything.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hotcache.provision.block import probe
from hotcache.provision.errors import ProbeFailed
from hotcache.provision.system.runner import Runner

SYS_BLOCK = Path("/sys/class/block")


@dataclass(frozen=True)
class Mount:
    source_dev: str      # major:minor
    mountpoint: str
    fstype: str
    options: tuple[str, ...]
    source: str


def mounts() -> list[Mount]:
    """Parse /proc/self/mountinfo: the kernel's own view, with major:minor numbers."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        parts = left.split()
        fstype, source, super_opts = (right.split() + ["", "", ""])[:3]
        options = tuple(dict.fromkeys(parts[5].split(",") + super_opts.split(",")))
        out.append(Mount(parts[2], unescape_mountinfo(parts[4]), fstype, options, source))
    return out


_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_mountinfo(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo octal; everything else
    (UTF-8 names included) is left as it is."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_at(mountpoint: str) -> Mount | None:
    target = os.path.realpath(mountpoint)
    found = [m for m in mounts() if m.mountpoint == target]
    return found[-1] if found else None


def devnum(node: str) -> str:
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


def root_devices() -> set[str]:
    """Kernel names of the device holding / and every device beneath it (slaves)."""
    root = mount_at("/")
    names: set[str] = set()
    if root is None:
        return names
    link = Path(f"/sys/dev/block/{root.source_dev}")
    todo = [link.resolve()] if link.exists() else []
    while todo:
        p = todo.pop()
        names.add(p.name)
        if (p / "partition").exists():
            todo.append(p.parent)
        slaves = p / "slaves"
        if slaves.is_dir():
            todo += [(slaves / s).resolve() for s in os.listdir(slaves)]
    return names


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
        backing = entry.read_text().strip()
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

    @property
    def kind(self) -> str:
        return {True: "HDD", False: "SSD", None: "?"}[self.rotational]

    def problems(self) -> list[str]:
        """Why this device is not safe to use as it is (empty: safe)."""
        out = []
        if self.unreadable:
            out.append(f"its signatures cannot be read ({self.unreadable})")
        if self.holds_root:
            out.append("it holds the root filesystem")
        if self.mountpoints:
            out.append(f"it is mounted at {', '.join(self.mountpoints)}")
        if self.holders:
            out.append(f"it is in use by {', '.join(self.holders)} (holders)")
        if self.signatures:
            kinds = sorted({s.get("type", "?") for s in self.signatures})
            out.append(f"it carries signatures: {', '.join(kinds)}")
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "kind": self.kind, "safe": not self.problems(),
                "problems": self.problems()}


def report(node: str, runner: Runner, *, roots: set[str] | None = None,
           strict: bool = True) -> DeviceReport:
    """The device as it is. A failed signature probe raises (strict: planning) or is
    noted in `unreadable`, which makes the device unsafe (listing devices)."""
    roots = root_devices() if roots is None else roots
    unreadable = None
    try:
        sigs = signatures(node, runner)
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
    )

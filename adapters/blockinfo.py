"""Which filesystem and block device hold a path, and whether a block cache is behind it.

Read from /proc/self/mountinfo and sysfs only, so it works unprivileged inside a training
container: no subprocess, no pyudev. The device-mapper table (which would name the
target type) needs root to read, so dm devices are classified from what sysfs shows to
everyone: `dm/uuid` ("LVM-" prefix for LVM volumes), `dm/name` and `slaves/`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from hotcache.provision.block.blockdev import unescape_mountinfo

SYS_DEV_BLOCK = Path("/sys/dev/block")
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Backing:
    mountpoint: str | None = None
    fstype: str | None = None
    source: str | None = None      # what mountinfo names as the mount source
    devnum: str | None = None      # major:minor
    device: str | None = None      # kernel name: sda1, loop3, dm-2, bcache0
    cache: str = "none"            # bcache | lvmcache | dm-cache | none
    detail: str | None = None      # how the cache was recognised, or the loop's backing file
    rotational: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def mount_of(path: Path) -> tuple[str, str, str, str] | None:
    """(mountpoint, fstype, source, major:minor) of the mount holding `path`."""
    best = None
    target = str(path)
    for line in MOUNTINFO.read_text().splitlines():
        left, _, right = line.partition(" - ")
        parts = left.split()
        mnt = unescape_mountinfo(parts[4])
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) >= len(best[0])):
            fstype, source = (right.split() + ["", ""])[:2]
            best = (mnt, fstype, unescape_mountinfo(source), parts[2])
    return best


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def classify(devnum: str) -> tuple[str | None, str, str | None, bool | None]:
    """(kernel name, cache kind, detail, rotational) for a block device major:minor."""
    sys_dir = SYS_DEV_BLOCK / devnum
    if not sys_dir.exists():
        return None, "none", None, None     # tmpfs, overlay, 9p, btrfs' anonymous devices
    real = sys_dir.resolve()
    name = real.name
    # A partition's queue/ lives on its parent disk.
    disk = real.parent if (real / "partition").exists() else real
    rot = _read(disk / "queue" / "rotational")
    rotational = None if rot is None else rot == "1"
    if name.startswith("bcache") and (real / "bcache").is_dir():
        return name, "bcache", _read(real / "bcache" / "cache_mode"), rotational
    if (real / "dm").is_dir():
        dm_name = _read(real / "dm" / "name") or ""
        uuid = _read(real / "dm" / "uuid") or ""
        slaves = sorted(p.name for p in (real / "slaves").iterdir()) if (real / "slaves").is_dir() else []
        # slaves/<name> links to each underlying device's sysfs folder.
        slave_names = [_read(real / "slaves" / s / "dm" / "name") or s for s in slaves]
        if uuid.startswith("LVM-"):
            # lvconvert --type cache renames the origin to <lv>_corig in both the
            # cache-pool and the cachevol layouts.
            if any(s.endswith("_corig") for s in slave_names):
                return name, "lvmcache", f"LVM {dm_name}: {', '.join(slave_names)}", rotational
            return name, "none", f"LVM {dm_name}", rotational
        if len(slaves) == 3:
            # A dm-cache table always has three devices: metadata, cache, origin.
            return name, "dm-cache", f"dm {dm_name}: {', '.join(slave_names)}", rotational
        return name, "none", f"dm {dm_name}", rotational
    backing = _read(real / "loop" / "backing_file")
    return name, "none", (f"loop on {backing}" if backing else None), rotational


def backing_of(path: Path) -> Backing:
    found = mount_of(path)
    if found is None:
        return Backing()
    mnt, fstype, source, devnum = found
    try:
        st_dev = os.stat(path).st_dev
        # Prefer the file's own device number: it is right even under bind mounts.
        devnum = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    except OSError:
        pass
    device, cache, detail, rotational = classify(devnum)
    return Backing(mnt, fstype, source, devnum, device, cache, detail, rotational)

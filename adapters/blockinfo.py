"""Which filesystem and block device hold a path, and whether a block cache is behind it.

Read from /proc/self/mountinfo, sysfs and two read-only ioctls on the path itself
(FS_IOC_GETFSUUID, FS_IOC_GETFSLABEL: the identity of the filesystem the kernel really
serves there), so it works unprivileged inside a training container, where the data is a
bind mount whose mountinfo `root` is a folder inside the filesystem (`/imagenet`), not
`/`: no subprocess, no pyudev. When /sys is not visible the cache is "unknown", never a
guess. The device-mapper table (which would name the
target type) needs root to read, so dm devices are classified from what sysfs shows to
everyone: `dm/uuid` ("LVM-" prefix for LVM volumes), `dm/name` and `slaves/`.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hotcache.provision.system import mountinfo

SYS_DEV_BLOCK = Path("/sys/dev/block")
MOUNTINFO = Path("/proc/self/mountinfo")
UNKNOWN = "unknown"
# <linux/fs.h>: _IOR(0x15, 0, struct fsuuid2 {u8 len; u8 uuid[16]}), Linux >= 6.5, and
# _IOR(0x94, 49, char[FSLABEL_MAX=256]).
FS_IOC_GETFSUUID = 0x80111500
FS_IOC_GETFSLABEL = 0x81009431


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
    mount_root: str | None = None  # the folder of the filesystem mounted there ("/" unless a bind)
    fs_uuid: str | None = None     # the filesystem's UUID, from the kernel
    fs_label: str | None = None
    # The kernel's verdict that the cache in front of this device failed, where sysfs
    # shows it to everyone (bcache's state). None: nothing wrong reported, or nothing
    # this process can read.
    cache_failed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mount_of(path: Path) -> tuple[str, str, str, str, str] | None:
    """(mountpoint, fstype, source, major:minor, root) of the mount holding `path`; root
    is mountinfo's 4th field, the folder of the filesystem that a bind mount shows."""
    m = mountinfo.holding(mountinfo.read(str(MOUNTINFO)), str(path))
    return None if m is None else (m.mountpoint, m.fstype, m.source, m.source_dev, m.root)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def fs_identity(path: Path) -> tuple[str | None, str | None]:
    """(UUID, label) of the filesystem serving `path`, as the kernel holds them (None
    where the filesystem or kernel does not say)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        uuid = label = None
        buf = bytearray(17)
        try:
            fcntl.ioctl(fd, FS_IOC_GETFSUUID, buf)
            raw = bytes(buf[1:1 + min(buf[0], 16)])
            if raw.strip(b"\0"):
                h = raw.hex()
                uuid = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" if len(raw) == 16 else h
        except OSError:
            pass
        buf = bytearray(256)
        try:
            fcntl.ioctl(fd, FS_IOC_GETFSLABEL, buf)
            label = bytes(buf).split(b"\0", 1)[0].decode(errors="replace") or None
        except OSError:
            pass
        return uuid, label
    finally:
        os.close(fd)


def classify(devnum: str) -> tuple[str | None, str, str | None, bool | None]:
    """(kernel name, cache kind, detail, rotational) for a block device major:minor."""
    if not SYS_DEV_BLOCK.is_dir():
        # /sys is not visible (a container without it): nothing to read, so no verdict.
        return None, UNKNOWN, "/sys/dev/block is not visible here", None
    sys_dir = SYS_DEV_BLOCK / devnum
    if not sys_dir.exists():
        if devnum.split(":")[0] not in ("0", ""):
            # A real block device that sysfs no longer lists: it was removed on the host.
            return None, UNKNOWN, f"block device {devnum} is gone from /sys", None
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
        under = (real / "slaves" / slaves[0]).resolve() if len(slaves) == 1 else None
        if under is not None and (under / "dm").is_dir() and (under / "slaves").is_dir() \
                and len(list((under / "slaves").iterdir())) == 3:
            # hotcache's raw dm-cache: the top device, a linear mapping of the cache
            # device past hotcache's header on the origin
            return name, "dm-cache", f"dm {dm_name} on {slave_names[0]}", rotational
        return name, "none", f"dm {dm_name}", rotational
    backing = _read(real / "loop" / "backing_file")
    return name, "none", (f"loop on {backing}" if backing else None), rotational


def cache_failure(devnum: str, device: str | None, cache: str) -> str | None:
    """What the kernel reports wrong with the cache in front of block device `devnum`:
    "<device>, <what the kernel said>, <dirty data>", as `hotcache status` says it."""
    if cache == "bcache":
        d = SYS_DEV_BLOCK / devnum / "bcache"
        if _read(d / "state") != "no cache" or (d / "cache").exists():
            return None
        dirty = _read(d / "dirty_data") or "unknown"
        return (f"/dev/{device}, bcache runs it without its cache set (state no cache: the "
                "kernel detaches a cache whose SSD fails; reads go to the origin), "
                f"dirty data {dirty}")
    # dm-cache's verdict (`dmsetup status`) needs root and device-mapper's tools, which a
    # training image lacks: for dm-cache and lvmcache the host's `hotcache status`,
    # doctor and metrics report it.
    return None


def backing_of(path: Path) -> Backing:
    found = mount_of(path)
    if found is None:
        return Backing()
    mnt, fstype, source, devnum, root = found
    try:
        st_dev = os.stat(path).st_dev
        # Prefer the file's own device number: it is right even under bind mounts.
        devnum = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    except OSError:
        pass
    device, cache, detail, rotational = classify(devnum)
    uuid, label = fs_identity(path)
    return Backing(mnt, fstype, source, devnum, device, cache, detail, rotational, root,
                   uuid, label, cache_failure(devnum, device, cache))

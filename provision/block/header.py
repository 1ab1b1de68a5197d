"""hotcache's own header: proof of which cache a device belongs to where the kernel's
format carries none.

Raw dm-cache metadata has no UUID that blkid shows, and a serial, WWN or by-id link can
follow the slot rather than the disk (QEMU SATA, libvirt SCSI, cloned disks): two
equal-size SSDs that swap slots would each pass for the other. So hotcache keeps the
first 4 KiB of a raw dm-cache SSD for itself: a magic line and a JSON object naming the
cache and a UUID drawn when it was built. The dm tables map only what follows it.
Found again, the UUID is the signature that proves the device (block/identity.py).

A raw dm-cache origin gets one too, in front of the filesystem, which starts 1 MiB in:
the bare origin then shows hotcache's header, never a mountable filesystem with the
cache's UUID that `mount -a` or a rescue system would mount without the cache.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hotcache.provision.block.host import Host

MAGIC = b"HOTCACHE-HEADER\n"
SIZE = 4096                   # bytes kept at the start of the device
SECTORS = SIZE // 512
TYPE = "hotcache"             # the signature type identity.probe reports for it


def render(cache: str, backend: str, uuid: str, **more: str | int) -> bytes:
    """The header's bytes; `more`: fields besides the cache, backend and UUID (a raw
    dm-cache origin's says where its filesystem starts, for whoever reads it by hand)."""
    body = json.dumps({"format": 1, "cache": cache, "backend": backend, "uuid": uuid,
                       **more}, sort_keys=True).encode() + b"\n"
    return (MAGIC + body).ljust(SIZE, b"\0")


def parse(data: bytes) -> dict[str, Any] | None:
    """The header's fields; None when `data` does not start with one."""
    if not data.startswith(MAGIC):
        return None
    line = data[len(MAGIC):].split(b"\n", 1)[0]
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) and isinstance(fields.get("uuid"), str) else None


def read(host: Host, node: str) -> dict[str, Any] | None:
    """The header at the start of `node`, None when there is none. A device that cannot
    be read raises OSError (never "no header")."""
    with open(host.path(node), "rb") as f:
        return parse(f.read(SIZE))


def write(node: str, data: bytes) -> None:
    """Write a rendered header at the start of block device `node`, synchronously."""
    fd = os.open(node, os.O_WRONLY | os.O_SYNC | os.O_CLOEXEC)
    try:
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def erase(host: Host, node: str, uuid: str, length: int = SIZE) -> bool:
    """Zero the header at the start of `node` (and up to `length` bytes, what follows
    it too) if it is the one with `uuid` (the cache being taken down); any other
    header, or none, is left as it is. True when erased."""
    fd = os.open(host.path(node), os.O_RDWR | os.O_SYNC | os.O_CLOEXEC)
    try:
        found = parse(os.pread(fd, SIZE, 0))
        if not found or found["uuid"] != uuid:
            return False
        os.pwrite(fd, bytes(max(length, SIZE)), 0)
        os.fsync(fd)
        return True
    finally:
        os.close(fd)

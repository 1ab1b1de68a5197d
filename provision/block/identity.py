"""Who a block device is, by what does not move between boots.

Kernel names (/dev/sdb, /dev/vda, /dev/nvme1n1) follow the order in which disks are found
and move when a disk is added or enumerates late; a later command that trusts them writes
to whatever disk now carries the name. So every device hotcache builds on is recorded by
its stable identities (udev's by-id links, WWN, serial, partition UUID, size, a loop
device's backing file) and found again by them; the signature hotcache itself wrote
(bcache superblock UUID, XFS UUID, LVM PV UUID) confirms it.

`probe` reads one device; `compare` tells whether a device is the recorded one (match),
provably another (conflict, with the reasons), or cannot be told (unproven); `find`
looks through every block device of the host for the recorded one. Everything is read
through a Host (block/host.py), so tests point it at a fake sysfs/udev tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotcache.provision.block import header
from hotcache.provision.block.blockdev import fs_identity
from hotcache.provision.block.host import Host

# by-id links that name what a device holds (a PV or md signature, a dm table's name)
# rather than the device itself: they appear and vanish with hotcache's own steps.
NOT_IDENTITY = ("lvm-pv-uuid-", "dm-name-", "md-name-")
# The keys recorded in the mapping, per device, under `identity`.
KEYS = ("wwn", "serial", "partuuid", "partn")


@dataclass
class Seen:
    """A device as it is now."""

    node: str
    size: int
    by_id: list[str] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)   # KEYS that this device has
    loop_file: str | None = None
    sig_type: str | None = None
    sig_uuid: str | None = None

    def describe(self) -> str:
        bits = [f"{self.size / 2**20:.0f} MiB"]
        if self.identity.get("serial"):
            bits.append(f"serial {self.identity['serial']}")
        if self.identity.get("wwn"):
            bits.append(f"WWN {self.identity['wwn']}")
        if self.loop_file:
            bits.append(f"image {self.loop_file}")
        if self.sig_type:
            bits.append(f"{self.sig_type} {self.sig_uuid or ''}".strip())
        else:
            bits.append("no signature")
        return f"{self.node} ({', '.join(bits)})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def kname(path: str, host: Host) -> str | None:
    """The kernel name a /dev path (node, by-id or mapper link) names now, or None when
    no such block device exists. Paths are read beneath the host's /dev."""
    roots = host.roots
    rel = os.path.relpath(os.path.normpath(path), "/dev")
    if rel.startswith(".."):
        return None
    name = os.path.basename(os.path.realpath(roots.dev / rel))
    return name if (roots.sys_block / name).exists() else None


def stable_links(links: list[str]) -> list[str]:
    return sorted(link for link in links
                  if not os.path.basename(link).startswith(NOT_IDENTITY))


def _link_target(link: str) -> str:
    """The kernel name a /dev/disk/by-id link names. udev writes them as ../../NAME, to
    the node itself: one readlink and one lstat answer, where resolving every component
    took most of the time a probe of all the host's devices spent in Python."""
    try:
        target = os.path.join(os.path.dirname(link), os.readlink(link))
    except OSError:
        return os.path.basename(os.path.realpath(link))
    if os.path.islink(target):
        return os.path.basename(os.path.realpath(target))
    return os.path.basename(os.path.normpath(target))


def links_by_name(host: Host) -> dict[str, list[str]]:
    """kernel name -> the /dev/disk/by-id links that name it now, sorted."""
    d = host.roots.by_id
    try:
        entries = sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[str, list[str]] = {}
    for entry in entries:
        out.setdefault(_link_target(os.path.join(d, entry)), []).append(f"/dev/disk/by-id/{entry}")
    return out


def links_to(name: str, host: Host) -> list[str]:
    return links_by_name(host).get(name, [])


def hardware(name: str, host: Host, links: dict[str, list[str]] | None = None
             ) -> tuple[int, dict[str, Any], list[str], str | None]:
    """(size, identity keys, stable by-id links, loop backing file) of kernel device
    `name`, from sysfs and udev's properties (no subprocess). `links`: links_by_name(host),
    read once by a caller that looks at every device."""
    roots = host.roots
    base = roots.sys_block / name
    size = int(_read(base / "size") or 0) * 512
    props = host.udev_properties(name)
    disk = base
    partn = _read(base / "partition")
    if partn:
        disk = base.resolve().parent
    ident = {
        "wwn": props.get("ID_WWN_WITH_EXTENSION") or props.get("ID_WWN")
        or _read(disk / "wwid") or _read(disk / "device" / "wwid"),
        "serial": props.get("ID_SERIAL_SHORT") or props.get("ID_SERIAL")
        or _read(disk / "serial") or _read(disk / "device" / "serial"),
        "partuuid": props.get("ID_PART_ENTRY_UUID"),
        "partn": int(partn) if partn else None,
    }
    loop_file = _read(base / "loop" / "backing_file")
    return size, {k: v for k, v in ident.items() if v is not None}, \
        stable_links(links_to(name, host) if links is None else links.get(name, [])), loop_file


def probe(name: str, host: Host, *, signatures: bool = True) -> Seen:
    """Kernel device `name` (vda, dm-3, loop0) as it is now. Its signature is blkid's
    low-level probe of the device itself; a failing blkid is an error
    (blockdev.fs_identity), never "blank"."""
    size, ident, links, loop_file = hardware(name, host)
    seen = Seen(f"/dev/{name}", size, links, ident, loop_file)
    if signatures:
        sig = fs_identity(host, f"/dev/{name}")
        seen.sig_type, seen.sig_uuid = sig.get("TYPE"), sig.get("UUID")
        if not seen.sig_type:
            # hotcache's own header, where blkid knows no signature (raw dm-cache's SSD).
            # Unreadable reads as no header: where one is expected, that is a conflict.
            try:
                mine = header.read(host, f"/dev/{name}")
            except OSError:
                mine = None
            if mine:
                seen.sig_type, seen.sig_uuid = header.TYPE, mine["uuid"]
        if "partuuid" not in ident and sig.get("PART_ENTRY_UUID"):
            seen.identity["partuuid"] = sig["PART_ENTRY_UUID"]
    return seen


def record(seen: Seen) -> dict[str, Any]:
    """What the mapping keeps about a device so that it can be found again."""
    ident = dict(seen.identity)
    if seen.loop_file:
        ident["backing_file"] = seen.loop_file
    return {"node": seen.node, "size": seen.size, "by_id": seen.by_id, "identity": ident}


@dataclass
class Verdict:
    match: bool = False
    conflicts: list[str] = field(default_factory=list)
    proofs: list[str] = field(default_factory=list)

    @property
    def conflict(self) -> bool:
        return bool(self.conflicts)


def compare(recorded: dict[str, Any], seen: Seen,
            expected_sig: tuple[str | None, ...] | None = None) -> Verdict:
    """Is `seen` the device `recorded` (a mapping `devices.<role>` entry) describes?

    A conflict (size, WWN, serial, partition UUID, by-id links, loop image or the
    signature hotcache wrote differs) proves it is another device. Otherwise one agreeing
    stable identity proves it is the one. A device with neither stays unproven."""
    v = Verdict()
    ident = recorded.get("identity") or {}
    size = recorded.get("size")
    if size and seen.size and int(size) != seen.size:
        v.conflicts.append(f"size {seen.size} bytes, recorded {size}")
    for key in ("wwn", "serial", "partuuid", "partn"):
        want, have = ident.get(key), seen.identity.get(key)
        if want is None or have is None:
            continue
        if str(want) != str(have):
            v.conflicts.append(f"{key} {have}, recorded {want}")
        elif key != "partn":
            v.proofs.append(f"{key} {have}")
    links = set(stable_links(recorded.get("by_id") or []))
    if links and seen.by_id:
        if links & set(seen.by_id):
            v.proofs.append(f"link {sorted(links & set(seen.by_id))[0]}")
        else:
            v.conflicts.append(f"by-id {', '.join(seen.by_id)}, recorded {', '.join(sorted(links))}")
    image = recorded.get("loop_file") or ident.get("backing_file")
    if image:
        if seen.loop_file == image:
            v.proofs.append(f"image {seen.loop_file}")
        else:
            v.conflicts.append(f"image {seen.loop_file or '(not a loop device)'}, "
                               f"recorded {image}")
    if expected_sig == ():
        if seen.sig_type:
            v.conflicts.append(f"{seen.sig_type} {seen.sig_uuid or ''} signature, where "
                               "hotcache left none")
    elif expected_sig is not None:
        want_type, want_uuid, *rest = expected_sig
        may_lack = bool(rest and rest[0])      # its block may live only in the cache
        if seen.sig_type is None and seen.sig_uuid is None and may_lack:
            pass
        elif seen.sig_type is None and seen.sig_uuid is None and (want_type or want_uuid):
            v.conflicts.append(f"no signature, hotcache wrote {want_type} {want_uuid or ''}".strip())
        elif want_type and seen.sig_type != want_type or want_uuid and seen.sig_uuid != want_uuid:
            v.conflicts.append(f"{seen.sig_type} {seen.sig_uuid or ''}, hotcache wrote "
                               f"{want_type} {want_uuid or ''}".strip())
        elif want_uuid:
            v.proofs.append(f"{want_type} UUID {want_uuid}")
    v.match = not v.conflicts and bool(v.proofs)
    return v


def all_devices(host: Host) -> list[str]:
    d = host.roots.sys_block
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def candidates(recorded: dict[str, Any], host: Host) -> list[str]:
    """Kernel names worth probing for the recorded device: those whose size and hardware
    identity do not already rule them out (no subprocess). A device of size 0 (a loop
    device with no image, a drive with no medium) holds nothing to find."""
    out = []
    by_id = links_by_name(host)
    for name in all_devices(host):
        size, ident, links, loop_file = hardware(name, host, by_id)
        if size == 0:
            continue
        seen = Seen(f"/dev/{name}", size, links, ident, loop_file)
        v = compare(recorded, seen)
        if not v.conflict:
            out.append(name)
    return out


def stacked(name: str, host: Host) -> bool:
    """A device built on others (dm, md, bcache): it shows what is on its slaves, so a
    signature seen through it proves nothing about which disk it is."""
    slaves = host.roots.sys_block / name / "slaves"
    return slaves.is_dir() and any(slaves.iterdir())

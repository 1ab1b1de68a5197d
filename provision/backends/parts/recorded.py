"""The devices a mapping entry recorded, found again by identity (never by kernel name).

Every command after the first build (apply of an existing cache, restore, status,
teardown) finds each device here: by its stable by-id links first, then by the names it
was recorded under, then by looking through every block device of the host. A name
that now points at another device (the disks changed order at boot) is never used: if
the recorded device is present under another name, that one is used and both are named;
if not, the command is refused, naming both.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotcache.provision.backends import BACKENDS, get
from hotcache.provision.block import identity
from hotcache.provision.block.host import Host
from hotcache.provision.block.identity import Seen
from hotcache.provision.errors import RefusedError
from hotcache.provision.records import CacheEntry, DeviceRecord, EntryState


@dataclass
class Found:
    role: str
    node: str | None = None      # /dev/NAME of the recorded device now; None: not found
    seen: Seen | None = None
    moved: str | None = None     # the recorded name now names another device (said, not refused)
    problem: str | None = None   # why no device can be used (a refusal)


def expected_signature(entry: CacheEntry, role: str, host: Host) -> tuple[str | None, ...] | None:
    """The signature hotcache wrote on the device, as (TYPE, UUID): () when it wrote none
    that blkid sees, None when it cannot say (an apply that did not finish)."""
    if entry.state != EntryState.READY or entry.backend not in BACKENDS:
        return None
    return get(entry.backend, host).signature(entry, role)


def _image(info: DeviceRecord) -> str | None:
    return info.loop_file or (info.identity.backing_file if info.identity else None)


def describe_recorded(info: DeviceRecord) -> str:
    bits = [f"{info.size / 2**20:.0f} MiB"] if info.size else []
    ident = info.identity
    for key, value in (("serial", ident and ident.serial), ("wwn", ident and ident.wwn),
                       ("partuuid", ident and ident.partuuid)):
        if value:
            bits.append(f"{key} {value}")
    links = identity.stable_links(info.by_id or [])
    if links:
        bits.append(links[0])
    image = _image(info)
    if image:
        bits.append(f"image {image}")
    return f"{info.node or '?'} when recorded ({', '.join(bits) or 'no stable identity recorded'})"


def _loop_name(image: str, host: Host) -> str | None:
    for entry in sorted(host.roots.sys_block.glob("loop*/loop/backing_file")):
        if entry.read_text().strip() == image:
            return entry.parent.parent.name
    return None


def locate(entry: CacheEntry, role: str, host: Host, *, cache: str = "") -> Found:
    info = entry.devices.get(role)
    found = Found(role)
    if info is None:
        return found
    recorded = info.dump()          # what block/identity compares, as the file holds it
    expected = expected_signature(entry, role, host)
    what = f"the {role} device of {cache}" if cache else f"the {role} device"
    tried: dict[str, str] = {}        # kernel name -> the recorded name that led to it
    image = _image(info)
    if image:
        name = _loop_name(image, host)
        if name:
            tried[name] = f"loop image {image}"
    # A loop image hotcache attached itself is found by its file alone: the loop device
    # it had is any other image's once detached.
    names = [] if info.loop_file else [
        *identity.stable_links(info.by_id or []), info.path, info.node]
    for label in names:
        if not label:
            continue
        name = identity.kname(label, host)
        if name and name not in tried:
            tried[name] = label
    wrong: list[tuple[str, Seen, identity.Verdict]] = []
    unproven: list[tuple[str, Seen]] = []
    for name, label in tried.items():
        seen = identity.probe(name, host)
        verdict = identity.compare(recorded, seen, expected)
        if verdict.match:
            found.node, found.seen = seen.node, seen
            break
        if verdict.conflict:
            wrong.append((label, seen, verdict))
        else:
            unproven.append((label, seen))
    if found.node is None and not image:
        matches = []
        for name in identity.candidates(recorded, host):
            if name in tried or identity.stacked(name, host):
                continue
            seen = identity.probe(name, host)
            if identity.compare(recorded, seen, expected).match:
                matches.append(seen)
        if len(matches) == 1:
            found.node, found.seen = matches[0].node, matches[0]
        elif len(matches) > 1:
            found.problem = (f"{what}: {', '.join(m.describe() for m in matches)} all match "
                             f"{describe_recorded(info)}; hotcache cannot tell which it is")
            return found
    if wrong:
        label, seen, verdict = wrong[0]
        said = (f"{what}: {label} now names {seen.describe()}, which is not the device "
                f"recorded ({'; '.join(verdict.conflicts)})")
        if found.seen is not None:       # set with found.node
            found.moved = f"{said}; using {found.seen.describe()}, the recorded device " \
                          "under its new name"
        else:
            found.problem = (f"{said}. The recorded device, {describe_recorded(info)}, is "
                             "not present under any name. hotcache touches neither")
    elif found.node is None and unproven:
        label, seen = unproven[0]
        found.problem = (f"{what}: nothing proves that {label} ({seen.describe()}) is the "
                         f"device recorded, {describe_recorded(info)}: no by-id link, serial, "
                         "WWN, partition UUID or hotcache signature agrees")
    return found


def current_node(entry: CacheEntry, role: str, host: Host) -> str | None:
    """The recorded device's node now, or None when it is not present or not provably
    the recorded one (read-only callers: status, statistics)."""
    try:
        return locate(entry, role, host).node
    except OSError:
        return None


def require(entry: CacheEntry, role: str, host: Host, *, cache: str = "") -> Found:
    """locate(), for callers that write: a device that cannot be proven is an error."""
    found = locate(entry, role, host, cache=cache)
    if found.problem:
        raise RefusedError(found.problem, hint="put the recorded disk back (or let udev "
                           "settle), then run the command again; `hotcache status` names "
                           "each device it finds")
    return found

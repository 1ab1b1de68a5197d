"""One device, one owner.

Two names can mean one device: `a.img` and `x/../a.img`, `/dev/loop3` and the image
attached there, a by-id link and `/dev/sdb`, and a whole disk overlaps its partitions
(`/dev/sdb` and `/dev/sdb1`). Each device the spec names, and each the mapping records
for a cache, becomes a Claim: tokens for what the device is (its device number, the
inode of an image file) and for the disk a partition lies on. Two claims of different
owners that share a device, or a disk and its partition, are refused. A recorded device
also claims every device stacked on it (its holders in sysfs, and theirs: the dm tables,
the bcache device, the LVs, an md array), so another cache's /dev/mapper/hc-X,
/dev/bcacheN or LV is that cache's too.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotcache.provision.backends import BACKENDS
from hotcache.provision.block import blockdev
from hotcache.provision.block.host import Host
from hotcache.provision.engine import reattach

if TYPE_CHECKING:
    from hotcache.provision.engine.spec import HostSpec
    from hotcache.provision.records import CacheEntry, DeviceRecord

SYS_DEV_BLOCK = Path("/sys/dev/block")


@dataclass(frozen=True)
class Claim:
    owner: str                 # the cache name
    what: str                  # how to name it in a message
    own: frozenset[str]        # the device itself, by every identity found
    above: frozenset[str]      # the whole disk, when the device is a partition
    stacked: frozenset[str] = frozenset()   # devices built on it (dm, bcache, md, LV)

    def overlaps(self, other: "Claim") -> bool:
        return bool(self.own & other.own or self.own & other.above
                    or self.above & other.own or self.on(other))

    def on(self, other: "Claim") -> bool:
        """This device is stacked on `other` (or the other way round)."""
        return bool((self.own | self.above) & other.stacked
                    or self.stacked & (other.own | other.above))


def tokens(path: str) -> tuple[set[str], set[str]]:
    """(what `path` is, the disk it is a partition of) as comparable tokens."""
    try:
        st = os.stat(path)
    except OSError:
        return {f"path:{os.path.realpath(path)}"}, set()
    if stat.S_ISREG(st.st_mode):
        own = {f"file:{st.st_dev}:{st.st_ino}"}
        loop = blockdev.loop_for_file(Host(), path)
        if loop:
            own |= tokens(loop)[0]
        return own, set()
    if not stat.S_ISBLK(st.st_mode):
        return {f"path:{os.path.realpath(path)}"}, set()
    return block_tokens(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")


def block_tokens(num: str) -> tuple[set[str], set[str]]:
    """A block device (major:minor) by its number and its loop image; its disk when it
    is a partition (sysfs puts a partition's folder inside its disk's)."""
    own, above = {f"blk:{num}"}, set()
    sys_dir = SYS_DEV_BLOCK / num
    if (sys_dir / "partition").exists():
        disk = (sys_dir.resolve().parent / "dev")
        if disk.exists():
            above.add(f"blk:{disk.read_text().strip()}")
    backing = sys_dir / "loop" / "backing_file"
    if backing.exists():
        image = backing.read_text().strip()
        try:
            ist = os.stat(image)
            own.add(f"file:{ist.st_dev}:{ist.st_ino}")
        except OSError:
            pass
    return own, above


def holders(num: str, seen: set[str] | None = None) -> set[str]:
    """Every device stacked on block device `num`, directly or through others, as
    tokens (sysfs lists a device's holders in its `holders/` folder)."""
    seen = set() if seen is None else seen
    folder = SYS_DEV_BLOCK / num / "holders"
    if not folder.is_dir():
        return set()
    out = set()
    for holder in folder.iterdir():
        try:
            hnum = (holder.resolve() / "dev").read_text().strip()
        except OSError:
            continue        # gone between the listing and the read
        if hnum in seen:
            continue
        seen.add(hnum)
        out |= {f"blk:{hnum}", *holders(hnum, seen)}
    return out


def claim(owner: str, what: str, *paths: str, stacked: bool = False) -> Claim:
    own: set[str] = set()
    above: set[str] = set()
    for path in paths:
        o, a = tokens(path)
        own |= o
        above |= a
    on = set()
    if stacked:
        for token in own:
            if token.startswith("blk:"):
                on |= holders(token.removeprefix("blk:"))
    return Claim(owner, what, frozenset(own), frozenset(above), frozenset(on))


def spec_claims(spec: HostSpec, state: dict[str, Any] | None = None) -> list[Claim]:
    """The devices the spec names. For a cache the mapping already records, a device is
    the one its identity finds (the planner builds on that one, and refuses a name that
    now means another device): the spec's kernel name may since belong to another
    cache's disk (disks enumerated in another order), and must not count as a claim on it."""
    recorded = _recorded(state or {})
    out = []
    for cache in spec.caches:
        entry = recorded.get(cache.name)
        for role, ref in cache.devices().items():
            path = ref.file
            info = entry.devices.get(role) if entry is not None else None
            found = _identity_paths(info) if info is not None else []
            out.append(claim(cache.name, f"{cache.name}.{role} ({ref.label})", *(found or [path])))
    return out


def _identity_paths(info: DeviceRecord) -> list[str]:
    """Where a recorded device is now, by what it is: its loop image, or the by-id links
    that still exist; [] when neither is there (the caller then fails closed on the
    spec's name)."""
    if info.loop_file:
        return [info.loop_file]
    return [p for p in info.by_id or [] if os.path.exists(p)]


def recorded_claims(state: dict[str, Any]) -> list[Claim]:
    """What the mapping records for each cache: the image file of a loop device (its
    /dev/loopN is whichever was free), else by-id links that still exist (a kernel name
    may since belong to another disk), else the recorded node (failing closed)."""
    out = []
    for name, entry in _recorded(state).items():
        for role, info in entry.devices.items():
            paths = _identity_paths(info) or ([info.node] if info.node else [])
            shown = info.path or info.loop_file or info.node
            out.append(claim(name, f"the {role} device {shown} that the mapping records for "
                                   f"cache {name}", *paths, stacked=True))
    return out


def _recorded(state: dict[str, Any]) -> dict[str, CacheEntry]:
    """Every cache the mapping records, and every origin that waits for a new SSD after
    its failed one was taken off (it keeps its filesystem, so it is still that cache's)."""
    return {**reattach.detached(state), **state.get("caches", {})}


def conflicts(spec: HostSpec, state: dict[str, Any]) -> list[str]:
    """Why devices of the spec are refused: named twice, or owned by another cache."""
    mine = spec_claims(spec, state)
    problems = []
    for i, a in enumerate(mine):
        for b in mine[i + 1:]:
            if a.overlaps(b):
                problems.append(f"{a.what} and {b.what} are the same device (or a disk and "
                                "its partition); each device can serve one role of one cache")
    for a in mine:
        for b in recorded_claims(state):
            if a.owner != b.owner and a.on(b):
                problems.append(f"{a.what} is stacked on {b.what} (a device-mapper table, "
                                "bcache device, LV or md array built on it belongs to that "
                                "cache); hotcache will not give it to a second cache, even "
                                f"with wipe: true (`hotcache teardown {b.owner}` frees it)")
            elif a.owner != b.owner and a.overlaps(b):
                problems.append(f"{a.what} is {b.what}; hotcache will not give it to a second "
                                f"cache, even with wipe: true (`hotcache teardown {b.owner}` "
                                "frees it)")
    return problems + dm_name_clashes(spec, state)


def dm_name_clashes(spec: HostSpec, state: dict[str, Any]) -> list[str]:
    """A backend that names its device-mapper devices after the cache (raw dm-cache:
    hc-NAME, hc-NAME-cache, -meta, -data) would give cache `x-cache` the name of cache
    `x`'s cache device. Refused between the spec's caches and those the mapping records
    (one of a backend this hotcache does not know names none it could tell)."""
    recorded = _recorded(state)
    backend_of = {**{n: e.backend for n, e in recorded.items()},
                  **{c.name: c.backend for c in spec.caches}}

    def names(name: str) -> set[str]:
        entry = recorded.get(name)
        kind = BACKENDS.get(backend_of[name])
        if kind is None:
            return set()
        return kind.device_names(name, entry if entry is not None
                                 and entry.backend == kind.name else None)

    mine = [c.name for c in spec.caches]
    theirs = [n for n in recorded if n not in mine]
    problems = []
    for i, a in enumerate(mine):
        for b in mine[i + 1:] + theirs:
            both = sorted(names(a) & names(b))
            if both:
                problems.append(f"caches {a} and {b} would both use the device-mapper name "
                                f"{both[0]} ({backend_of[a]} names its devices after the "
                                "cache); rename one of them")
    return problems

"""What the mapping says, against what is really there."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotcache.provision.system.strenum import StrEnum
from hotcache.provision import mapping
from hotcache.provision.block import blockdev, health
from hotcache.provision.system import fstab
from hotcache.provision.backends import get as get_backend
from hotcache.provision.backends.parts import recorded
from hotcache.provision.backends.parts.stats import CacheStats
from hotcache.provision.block.host import Host
from hotcache.provision.engine import onorigin
from hotcache.provision.engine.workingset import churn, row_advice
from hotcache.provision.engine.statusrow import (CacheFailure, DeviceSeen, FindingDoc,
                                                 MountFacts, RowFacts, StatusRow, WorkingSet)
from hotcache.provision.errors import HotcacheError
from hotcache.provision.records import CacheEntry, EntryState
from hotcache.provision.system.runner import Runner


class Code(StrEnum):
    """What `status` can find wrong with a cache. Doctor keys its advice on these codes
    (observe/doctor.ADVICE), never on the wording of a message."""
    DEVICE_UNREADABLE = "DEVICE_UNREADABLE"   # probing a recorded device failed
    DEVICE_UNPROVEN = "DEVICE_UNPROVEN"       # something is there, but not provably the device
    DEVICE_MISSING = "DEVICE_MISSING"         # the recorded device is nowhere (or its image is detached)
    DEVICE_RENAMED = "DEVICE_RENAMED"         # found under a new name; its old name is another disk's
    APPLY_UNFINISHED = "APPLY_UNFINISHED"     # the mapping's state is not `ready`
    NOT_MOUNTED = "NOT_MOUNTED"
    NO_NOATIME = "NO_NOATIME"
    MOUNT_OPTIONS_MISSING = "MOUNT_OPTIONS_MISSING"
    WRONG_FILESYSTEM = "WRONG_FILESYSTEM"     # the mountpoint holds another filesystem
    NOT_IN_FSTAB = "NOT_IN_FSTAB"             # it will not be mounted at boot
    STATS_UNREADABLE = "STATS_UNREADABLE"     # the backend's statistics could not be read
    CACHE_FAILED = "CACHE_FAILED"             # the kernel reports the cache device failed
    ORIGIN_WITHOUT_CACHE = "ORIGIN_WITHOUT_CACHE"  # the bare origin is mounted, not the cache
    FILESYSTEM_SHUT_DOWN = "FILESYSTEM_SHUT_DOWN"  # mounted, but every access fails (EIO)


@dataclass(frozen=True)
class Problem:
    code: Code
    message: str


def current_node(entry: CacheEntry, role: str = "origin", runner: Runner | None = None) -> str | None:
    """The recorded device's node now, found by identity (kernel names move)."""
    return recorded.current_node(entry, role, Host(runner))


class _Findings:
    """What status found wrong with one cache, in order. When the cache device failed,
    its own findings (unproven, missing, unreadable) give way to the one failure that
    explains them."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self._ssd: list[Problem] = []

    def add(self, code: Code, message: str, role: str | None = None) -> None:
        self.problems.append(Problem(code, message))
        if role == "cache":
            self._ssd.append(self.problems[-1])

    def cache_failed(self, message: str) -> None:
        self.problems[:] = [p for p in self.problems if p not in self._ssd]
        self.add(Code.CACHE_FAILED, message)


def _devices(name: str, entry: CacheEntry, host: Host,
             found: _Findings) -> dict[str, DeviceSeen]:
    """Each recorded device found by its identity: role -> {node, present}."""
    devices: dict[str, DeviceSeen] = {}
    for role in entry.devices:
        try:
            where, why = recorded.locate(entry, role, host, cache=name), Code.DEVICE_UNPROVEN
        except HotcacheError as exc:
            where = recorded.Found(role, problem=f"{role} device: {exc.message}")
            why = Code.DEVICE_UNREADABLE
        devices[role] = {"node": where.node, "present": where.node is not None}
        if where.problem:
            found.add(why, where.problem, role)
        elif where.node is None:
            found.add(Code.DEVICE_MISSING,
                      f"{role} device is missing ({_describe(entry, role)})", role)
        if where.moved:
            found.add(Code.DEVICE_RENAMED, where.moved, role)
    return devices


def _mount(host: Host, entry: CacheEntry, failed: CacheFailure | None,
           found: _Findings) -> MountFacts:
    """The mount at the recorded mountpoint: options, filesystem, space."""
    fs = entry.filesystem
    mp = fs.mountpoint
    facts: MountFacts = {"mounted": False, "noatime": False, "fs_uuid_matches": False,
                             "options": [], "size_bytes": None, "used_bytes": None,
                             "free_bytes": None}
    mount = blockdev.mount_at(host, mp) if mp else None
    if mount is None:
        found.add(Code.NOT_MOUNTED, f"not mounted at {mp}")
        return facts
    facts["mounted"] = True
    facts["options"] = list(mount.options)
    facts["noatime"] = "noatime" in mount.options
    if not facts["noatime"]:
        found.add(Code.NO_NOATIME, f"{mp} is mounted without noatime (every read "
                  "writes); run `hotcache apply` to remount it")
    if _shut_down(mp):
        found.add(Code.FILESYSTEM_SHUT_DOWN,
                  f"the filesystem on {mp} shut down after I/O errors (XFS does so when a "
                  "metadata write fails; `dmesg` says why): every read and write there "
                  "fails until it is mounted again")
    missing = [o for o in fs.options or [] if o not in mount.options and o != "noatime"]
    if missing:
        found.add(Code.MOUNT_OPTIONS_MISSING, f"{mp} is mounted without {','.join(missing)}")
    if os.path.exists(mount.source) and not failed:   # blkid could hang on a failed one
        got = blockdev.fs_identity(host, mount.source).get("UUID")
        facts["fs_uuid_matches"] = got == fs.uuid
        if not facts["fs_uuid_matches"]:
            found.add(Code.WRONG_FILESYSTEM,
                      f"{mp} holds filesystem {got}, not the recorded {fs.uuid}")
    st = os.statvfs(mp)
    facts["size_bytes"] = st.f_blocks * st.f_frsize
    facts["free_bytes"] = st.f_bavail * st.f_frsize
    facts["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
    return facts


def _shut_down(mp: str) -> bool:
    """Whether the filesystem mounted at `mp` answers every access with EIO: a shut-down
    XFS refuses even to open its root, which is always in memory, so this never waits
    on a failed device."""
    try:
        fd = os.open(mp, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        return exc.errno == errno.EIO
    os.close(fd)
    return False


def _bare_origin(host: Host, entry: CacheEntry, origin: DeviceSeen | None,
                 found: _Findings) -> None:
    """A block cache's filesystem mounted from its origin alone (`mount -a` or a rescue
    system ignore the fstab line's x-systemd dependency, and the origin of a raw dm-cache
    built before hotcache's origin header shows the same XFS, UUID and all): reads
    bypass the cache, and what is written now is
    missing from it, which would serve stale blocks once loaded again. The UUID matches,
    so only the device number tells. Nothing is published for it then."""
    mp = entry.filesystem.mountpoint
    if entry.on_origin is not None:
        return          # switched to its origin after its SSD failed: meant to be so
    mount = blockdev.mount_at(host, mp) if mp else None
    if mount is None or origin is None or not origin["node"]:
        return
    try:
        if entry.cached_device and host.devnum(entry.cached_device) == mount.source_dev:
            return      # the cache device (an adopted LV is both origin and cached LV)
    except OSError:
        pass            # not there (a raw dm-cache whose tables are not loaded)
    try:
        bare = host.devnum(origin["node"]) == mount.source_dev
    except OSError:
        return
    if bare:
        found.add(Code.ORIGIN_WITHOUT_CACHE,
                  f"{mp} is mounted from the origin {origin['node']} without its cache: "
                  "reads bypass the cache, and writes made now are missing from it")


def _persistent(name: str, entry: CacheEntry, fstab_file: str | os.PathLike[str] | None,
                found: _Findings) -> bool | None:
    """Whether the fstab the cache was recorded in still mounts it at boot (None: the
    cache was not made persistent)."""
    recorded_in = entry.persist and entry.persist.fstab
    if not recorded_in:
        return None
    fs = entry.filesystem
    line = fstab.read_entry(fstab.fstab_path(str(fstab_file or recorded_in)), name,
                            fs.uuid, [fs.mountpoint])
    if line is None:
        found.add(Code.NOT_IN_FSTAB, f"no fstab entry for it in {fstab_file or recorded_in}; "
                  "it will not be mounted at boot")
    return line is not None


def cache_status(name: str, entry: CacheEntry, runner: Runner,
                 fstab_file: str | os.PathLike[str] | None,
                 host: Host | None = None) -> StatusRow:
    host = host or Host(runner)
    backend = get_backend(entry.backend, host)
    found = _Findings()
    devices = _devices(name, entry, host, found)
    # A cache the fail-over watcher switched to its origin: its record, not a read of
    # the failed SSD, says what happened.
    failed = onorigin.failure(entry) or \
        cache_failure(entry, host, {r: d["node"] for r, d in devices.items()})
    if failed:
        found.cache_failed(failed["message"])
    if entry.state != EntryState.READY:
        found.add(Code.APPLY_UNFINISHED, f"state is {entry.state.value!r}: an apply did "
                  "not finish; run `hotcache apply` again")
    cached = entry.cached_device
    if not backend.block_cache:       # the filesystem is on the origin itself
        origin = devices.get("origin")
        cached = origin["node"] if origin else None
    # The mount's facts, key by key in MountFacts' order: spread (**) into the row, an
    # open TypedDict could bring keys mypy cannot see (its extra_checks refuse that).
    mount = _mount(host, entry, failed, found)
    seen: RowFacts = {
        "name": name, "backend": entry.backend, "mode": entry.mode,
        "state": entry.state, "devices": devices, "cached_device": cached,
        "mountpoint": entry.filesystem.mountpoint,
        "mounted": mount["mounted"], "noatime": mount["noatime"],
        "fs_uuid_matches": mount["fs_uuid_matches"], "options": mount["options"],
        "size_bytes": mount["size_bytes"], "used_bytes": mount["used_bytes"],
        "free_bytes": mount["free_bytes"],
        "persistent": _persistent(name, entry, fstab_file, found), "cache_failed": failed,
    }
    if backend.block_cache:
        _bare_origin(host, entry, devices.get("origin"), found)
    if backend.block_cache and not found.problems:
        try:
            nodes = {role: d["node"] for role, d in devices.items()}
            seen["cache"] = backend.stats(entry, nodes)
        except (HotcacheError, OSError, ValueError, KeyError) as exc:
            found.add(Code.STATS_UNREADABLE, f"cannot read cache statistics: {exc}")
    # `problems` (the messages) is what status has always printed; `findings` adds the
    # code of each, for doctor and for scripts reading --json.
    findings: list[FindingDoc] = [{"code": p.code.value, "message": p.message}
                                  for p in found.problems]
    return {**seen, "working_set": working_set(seen, entry),
            "problems": [p.message for p in found.problems], "findings": findings,
            "ok": not found.problems}


def cache_failure(entry: CacheEntry, host: Host,
                  nodes: dict[str, str | None]) -> CacheFailure | None:
    """The cache device's failure, as the kernel reports it and as a bounded read of the
    SSD finds it; None when neither finds anything wrong."""
    info = entry.devices.get("cache")
    backend = get_backend(entry.backend, host)
    if not backend.block_cache or info is None:
        return None
    unanswered: str | None
    try:
        verdict = backend.failure(entry, nodes)
    except (HotcacheError, OSError) as exc:
        verdict = None
        unanswered = f"its state could not be read ({exc})"
    else:
        unanswered = None
    path = next(iter(info.by_id or []), None) or info.path or info.node
    unreadable = health.read_error(host, path) if path and host.exists(path) else None
    if verdict is None and unreadable is None:
        return None
    said = [x for x in (verdict and verdict.said, unreadable, unanswered) if x]
    dirty = verdict.dirty_bytes if verdict else None
    if dirty is None and verdict is not None and entry.writeback_ever is False \
            and verdict.live_mode in ("writethrough", "passthrough"):
        dirty = 0               # every write reached the origin before it completed
    if dirty == 0:
        risk = "no dirty data at risk: every write reached the origin"
    elif dirty is None:
        risk = "dirty data at risk: unknown (the kernel no longer reports it)"
    else:
        risk = f"{dirty / 2**20:.1f} MiB of dirty data at risk (written to the cache only)"
    return {"device": path, "kernel": "; ".join(said), "dirty_bytes": dirty,
            "message": f"cache failed: {path}: {'; '.join(said)}; {risk}",
            "on_origin_since": None}


def working_set(row: RowFacts, entry: CacheEntry, before: CacheStats | None = None,
                seconds: float | None = None) -> WorkingSet:
    """The cache against what it is to hold: sizing advice and (block caches) churn."""
    copies = [copy.dump() for copy in (entry.hot_copies or {}).values()]
    stats: CacheStats | None = row.get("cache") or None
    return {"sizing": row_advice(row, copies),
            "activity": churn(before, stats, seconds) if stats else None}


def _describe(entry: CacheEntry, role: str) -> str:
    info = entry.devices[role]
    if info.loop_file:
        return f"loop image {info.loop_file} is not attached"
    return info.path or info.node or "?"


def host_status(state_path: Path, fstab_file: str | os.PathLike[str] | None, runner: Runner,
                name: str | None = None,
                data: dict[str, Any] | None = None) -> list[StatusRow]:
    """Status rows of every cache (or `name`); `data`: the mapping, when the caller has
    loaded it already (a command parses it once)."""
    data = data if data is not None else mapping.load(state_path)
    names = [name] if name else list(data["caches"])
    return [cache_status(n, data["caches"][n], runner, fstab_file) for n in names]

"""What the mapping says, against what is really there."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hotcache.provision.system.strenum import StrEnum
from hotcache.provision import mapping
from hotcache.provision.block import blockdev, health
from hotcache.provision.system import fstab
from hotcache.provision.backends import get as get_backend
from hotcache.provision.backends import recorded
from hotcache.provision.block.host import Host
from hotcache.provision.errors import HotcacheError
from hotcache.provision.records import CacheEntry
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


@dataclass(frozen=True)
class Problem:
    code: Code
    message: str


def current_node(entry: CacheEntry, role: str = "origin", runner: Runner | None = None) -> str | None:
    """The recorded device's node now, found by identity (kernel names move)."""
    return recorded.current_node(entry, role, Host(runner))


def cache_status(name: str, entry: CacheEntry, runner: Runner, fstab_file,
                 host: Host | None = None) -> dict:
    host = host or Host(runner)
    fs = entry.filesystem
    mp = fs.mountpoint
    problems: list[Problem] = []
    ssd_problems: list[Problem] = []       # the cache device's: superseded by a failure

    def found_problem(code: Code, message: str, role: str | None = None) -> None:
        problems.append(Problem(code, message))
        if role == "cache":
            ssd_problems.append(problems[-1])

    devices: dict[str, dict[str, Any]] = {}
    for role in entry.devices:
        try:
            found, why = recorded.locate(entry, role, host, cache=name), Code.DEVICE_UNPROVEN
        except HotcacheError as exc:
            found = recorded.Found(role, problem=f"{role} device: {exc.message}")
            why = Code.DEVICE_UNREADABLE
        devices[role] = {"node": found.node, "present": found.node is not None}
        if found.problem:
            found_problem(why, found.problem, role)
        elif found.node is None:
            found_problem(Code.DEVICE_MISSING,
                          f"{role} device is missing ({_describe(entry, role)})", role)
        if found.moved:
            found_problem(Code.DEVICE_RENAMED, found.moved, role)
    failed = cache_failure(entry, host, {r: d["node"] for r, d in devices.items()})
    if failed:
        problems[:] = [p for p in problems if p not in ssd_problems]
        found_problem(Code.CACHE_FAILED, failed["message"])
    if entry.state != "ready":
        found_problem(Code.APPLY_UNFINISHED, f"state is {entry.state!r}: an apply did "
                      "not finish; run `hotcache apply` again")
    cached = entry.cached_device
    if entry.backend == "none":
        cached = devices.get("origin", {}).get("node")
    mount = blockdev.mount_at(host, mp) if mp else None
    result: dict[str, Any] = {
        "name": name, "backend": entry.backend, "mode": entry.mode,
        "state": entry.state, "devices": devices, "cached_device": cached,
        "mountpoint": mp, "mounted": False, "noatime": False, "fs_uuid_matches": False,
        "options": [], "size_bytes": None, "used_bytes": None, "free_bytes": None,
        "persistent": None, "cache_failed": failed,
    }
    if mount is None:
        found_problem(Code.NOT_MOUNTED, f"not mounted at {mp}")
    else:
        result["mounted"] = True
        result["options"] = list(mount.options)
        result["noatime"] = "noatime" in mount.options
        if not result["noatime"]:
            found_problem(Code.NO_NOATIME, f"{mp} is mounted without noatime (every read "
                          "writes); run `hotcache apply` to remount it")
        missing = [o for o in fs.options or [] if o not in mount.options and o != "noatime"]
        if missing:
            found_problem(Code.MOUNT_OPTIONS_MISSING,
                          f"{mp} is mounted without {','.join(missing)}")
        if os.path.exists(mount.source) and not failed:   # blkid could hang on it
            got = blockdev.fs_identity(host, mount.source).get("UUID")
            result["fs_uuid_matches"] = got == fs.uuid
            if not result["fs_uuid_matches"]:
                found_problem(Code.WRONG_FILESYSTEM,
                              f"{mp} holds filesystem {got}, not the recorded {fs.uuid}")
        st = os.statvfs(mp)
        result["size_bytes"] = st.f_blocks * st.f_frsize
        result["free_bytes"] = st.f_bavail * st.f_frsize
        result["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
    fstab_file_recorded = entry.persist and entry.persist.fstab
    if fstab_file_recorded:
        line = fstab.read_entry(fstab.fstab_path(str(fstab_file or fstab_file_recorded)), name,
                                fs.uuid, [fs.mountpoint])
        result["persistent"] = line is not None
        if not result["persistent"]:
            found_problem(Code.NOT_IN_FSTAB, f"no fstab entry for it in "
                          f"{fstab_file or fstab_file_recorded}; it will not be mounted at boot")
    if entry.backend != "none" and not problems:
        try:
            nodes = {role: d["node"] for role, d in devices.items()}
            result["cache"] = get_backend(entry.backend, host).stats(entry, nodes)
        except (HotcacheError, OSError, ValueError, KeyError) as exc:
            found_problem(Code.STATS_UNREADABLE, f"cannot read cache statistics: {exc}")
    result["working_set"] = working_set(result, entry)
    # `problems` (the messages) is what status has always printed; `findings` adds the
    # code of each, for doctor and for scripts reading --json.
    result["problems"] = [p.message for p in problems]
    result["findings"] = [{"code": p.code.value, "message": p.message} for p in problems]
    result["ok"] = not problems
    return result


def cache_failure(entry: CacheEntry, host: Host, nodes: dict) -> dict | None:
    """The cache device's failure, as the kernel reports it and as a bounded read of the
    SSD finds it; None when neither finds anything wrong."""
    info = entry.devices.get("cache")
    if entry.backend == "none" or info is None:
        return None
    unanswered: str | None
    try:
        verdict = get_backend(entry.backend, host).failure(entry, nodes)
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
    if dirty is None and entry.mode in ("writethrough", "passthrough"):
        dirty = 0
    if dirty == 0:
        risk = "no dirty data at risk: every write reached the origin"
    elif dirty is None:
        risk = "dirty data at risk: unknown (the kernel no longer reports it)"
    else:
        risk = f"{dirty / 2**20:.1f} MiB of dirty data at risk (written to the cache only)"
    return {"device": path, "kernel": "; ".join(said), "dirty_bytes": dirty,
            "message": f"cache failed: {path}: {'; '.join(said)}; {risk}"}


def working_set(row: dict, entry: CacheEntry, before: dict | None = None,
                seconds: float | None = None) -> dict:
    """The cache against what it is to hold: sizing advice and (block caches) churn."""
    from hotcache.provision.observe.workingset import churn, row_advice

    copies = [copy.dump() for copy in (entry.hot_copies or {}).values()]
    stats = row.get("cache") or {}
    return {"sizing": row_advice(row, copies),
            "activity": churn(before, stats, seconds) if stats else None}


def _describe(entry: CacheEntry, role: str) -> str:
    info = entry.devices[role]
    if info.loop_file:
        return f"loop image {info.loop_file} is not attached"
    return info.path or info.node or "?"


def host_status(state_path, fstab_file, runner: Runner, name: str | None = None) -> list[dict]:
    data = mapping.load(state_path)
    names = [name] if name else list(data["caches"])
    return [cache_status(n, data["caches"][n], runner, fstab_file) for n in names]

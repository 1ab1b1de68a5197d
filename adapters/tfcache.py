"""Where a tf.data `cache(filename)` lives, and what to do with a lock left by a crash.

The cache folder's name carries the dataset's version and a fingerprint of the pipeline
settings, so a new hot copy or a changed pipeline gets a new folder and never reads a
stale cache (tf.data itself would reuse any cache whose shapes match).

While a cache is being written, TensorFlow keeps `<prefix>_<n>.lockfile` next to it
(content "Created at: <seconds>", no owner) and deletes it when the pass completes. A
run that crashes leaves it, and the next run fails with "There appears to be a
concurrent caching iterator running" (tensorflow#28798). So each run records itself in
`owner.json` beside the cache; a later run removes the lock and the partial files when
that owner is gone, and otherwise refuses with the owner's pid and host.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from pathlib import Path

from hotcache.provision.errors import CacheLockedError

log = logging.getLogger("hotcache.adapters")

PREFIX = "cache"
OWNER = "owner.json"


def fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def function_identity(fn) -> str | None:
    """Name and bytecode (and constants, and closed-over values) of a user function,
    so editing the function's body changes the cache key."""
    if fn is None:
        return None
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    closure = [repr(c.cell_contents) for c in (fn.__closure__ or ())]
    return f"{fn.__module__}.{fn.__qualname__}:" + hashlib.sha256(
        code.co_code + repr((code.co_consts, code.co_names, closure)).encode()).hexdigest()


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _me() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "start": _proc_start(pid)}


def owner_alive(owner: dict) -> bool | None:
    """True/False for an owner on this host and boot; None when it cannot be told here."""
    if owner.get("host") != socket.gethostname():
        return None
    if owner.get("boot_id") != _boot_id():
        return False                                   # rebooted since: surely gone
    return _proc_start(int(owner.get("pid", -1))) == owner.get("start")


def prepare(cache_root: str | os.PathLike, key_name: str) -> Path:
    """Make (or reuse) the keyed cache folder, clear a dead run's lock, record this run
    as its owner; returns the filename prefix to pass to `Dataset.cache()`."""
    folder = Path(cache_root) / key_name
    folder.mkdir(parents=True, exist_ok=True)
    locks = sorted(folder.glob(f"{PREFIX}_*.lockfile"))
    if locks:
        try:
            owner = json.loads((folder / OWNER).read_text())
        except (OSError, ValueError):
            owner = {}
        alive = owner_alive(owner) if owner else None
        if alive is False:
            for leftover in folder.iterdir():
                if leftover.name != OWNER:
                    leftover.unlink()
            log.warning("tf.data cache %s: removed the lock and partial files left by pid %s "
                        "on %s, which is gone", folder, owner.get("pid"), owner.get("host"))
        else:
            who = (f"pid {owner.get('pid')} on {owner.get('host')}" if owner
                   else "a run hotcache did not start (no owner.json)")
            state = "is still running" if alive else "cannot be checked from here"
            raise CacheLockedError(
                f"tf.data cache {folder} is locked ({locks[0].name}) by {who}, which {state}",
                hint=f"wait for that run, or if it is surely gone delete {locks[0]}")
    complete = any(folder.glob(f"{PREFIX}*.index"))
    if not complete:
        # Partial files from a run that stopped without a lock (e.g. an unfinished pass).
        for leftover in folder.glob(f"{PREFIX}_*"):
            leftover.unlink()
    tmp = folder / f".{OWNER}.{os.getpid()}"
    tmp.write_text(json.dumps(_me()))
    os.replace(tmp, folder / OWNER)
    log.info("tf.data cache %s: %s", folder, "reusing the complete cache" if complete
             else "will be written during the first full pass")
    return folder / PREFIX

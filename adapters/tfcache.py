"""Where a tf.data `cache(filename)` lives, and one real lock for the run that writes it.

The cache folder's name carries the dataset's version and a fingerprint of the pipeline
settings, so a new hot copy or a changed pipeline gets a new folder and never reads a
stale cache (tf.data itself would reuse any cache whose shapes match). The name is one
path component and the version label in it is checked like a name (`label_ok`): a label
such as `x/../..` never moves the folder, or the clean-up below, elsewhere.

While a cache is being written, TensorFlow keeps `<prefix>_<n>.lockfile` next to it
(content "Created at: <seconds>", no owner) and deletes it when the pass completes. A
run that crashes leaves it, and the next run fails with "There appears to be a
concurrent caching iterator running" (tensorflow#28798). So a run that will write the
cache takes an flock on `writer.lock` in the folder and holds it for the rest of its
life (the kernel drops it when the process dies, in whatever PID namespace or container
it ran). Holding that lock is the only proof that no other writer is alive, so only
then are a dead run's lockfile and partial files removed; a run that cannot take it is
refused, naming the holder from `owner.json` (host, boot id, PID namespace, pid). A
complete cache is only read: no lock, nothing removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import CacheLockedError, DataRootError
from .logs import say
from hotcache.provision.hotcopy.format import label_ok as label_ok  # re-exported: tfdata's check

PREFIX = "cache"
OWNER = "owner.json"
LOCK = "writer.lock"
_HELD: dict[str, int] = {}    # folder -> fd of its writer.lock, held until the process ends


def fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def function_identity(fn: Callable[..., object] | None) -> str | None:
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


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _me() -> dict[str, str | int]:
    """Who holds the lock, for messages: a pid means nothing without its host, boot and
    PID namespace (containers sharing a hostname each number their own processes)."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = "unknown"
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid_namespace": pidns,
            "pid": os.getpid()}


def _holder(folder: Path) -> str:
    try:
        o = json.loads((folder / OWNER).read_text())
        return (f"pid {o.get('pid')} on {o.get('host')} (PID namespace {o.get('pid_namespace')}, "
                f"boot {str(o.get('boot_id'))[:8]})")
    except (OSError, ValueError, AttributeError):
        return "a run hotcache did not start (no owner.json)"


def _take(folder: Path) -> bool:
    """Take the folder's writer lock for the rest of this process's life; False when
    another open of it (another process, or another writer in this one) holds it."""
    if str(folder) in _HELD:
        return not list(folder.glob(f"{PREFIX}_*.lockfile"))   # ours, unless writing now
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _HELD[str(folder)] = fd
    return True


def prepare(cache_root: str | os.PathLike[str], key_name: str) -> Path:
    """Make (or reuse) the keyed cache folder; a run that will write the cache takes its
    writer lock for life and clears what a dead writer left; returns the filename prefix
    to pass to `Dataset.cache()`."""
    if "/" in key_name or key_name in ("", ".", "..") or "\0" in key_name:
        raise DataRootError(f"tf.data cache name {key_name!r} is not one folder name",
                            hint="use a name without '/', like the ones hotcache makes")
    folder = Path(cache_root) / key_name
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.glob(f"{PREFIX}*.index")):
        say(logging.INFO, "tf.data cache %s: reusing the complete cache", folder)
        return folder / PREFIX
    if not _take(folder):
        raise CacheLockedError(
            f"tf.data cache {folder} is being written by {_holder(folder)}, which holds its "
            f"lock ({LOCK})", hint="wait for that run to finish, or give this run another "
                                   "cache_dir; the lock goes away by itself when it ends")
    locks = sorted(folder.glob(f"{PREFIX}_*.lockfile"))
    if locks and not (folder / OWNER).exists():
        raise CacheLockedError(
            f"tf.data cache {folder} is locked ({locks[0].name}) by a run hotcache did not "
            "start (no owner.json)", hint=f"if it is surely gone, delete {locks[0]}")
    # We hold the writer lock, so whoever left a lockfile or partial files is gone.
    for leftover in folder.glob(f"{PREFIX}_*"):
        leftover.unlink()
    if locks:
        say(logging.WARNING, "tf.data cache %s: removed the lock and partial files left by "
            "%s, which is gone", folder, _holder(folder))
    tmp = folder / f".{OWNER}.{os.getpid()}"
    tmp.write_text(json.dumps(_me()))
    os.replace(tmp, folder / OWNER)
    say(logging.INFO, "tf.data cache %s: will be written during the first full pass", folder)
    return folder / PREFIX

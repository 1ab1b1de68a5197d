"""Atomic file replacement and an exclusive lock: the only way hotcache writes state."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hotcache.provision.errors import LockTimeout


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """Write to a temp file in the same folder, fsync it, rename over `path`, fsync the
    folder: a reader (or a crash) sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp creates the temp file with O_EXCL (never a name someone planted) and its
    # mode is set on the open file: the folder may be one others can write to (a
    # node_exporter textfile folder), where a path can be swapped for a symlink.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# Locks held here ((path, thread) -> depth): an apply holds the mapping's lock from plan
# to the last step, and its own mapping writes take the same lock again without waiting
# on themselves (flock locks belong to the open file, so a second open would deadlock).
# Other threads open the file again and wait, as another process would.
_HELD: dict[tuple[str, int], int] = {}


@contextlib.contextmanager
def locked(path: str | os.PathLike[str], *, holder: str | None = None,
           timeout: float | None = None,
           waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path`.lock for the duration (blocks other hotcache runs).

    `holder` (e.g. "hotcache apply spec.yaml") is written into the lock file so a second
    run can say who it waits for; `waiting(who)` is called once when it has to wait;
    after `timeout` seconds it raises LockTimeout naming the holder (None: wait forever).
    """
    lock = os.path.abspath(f"{path}.lock")
    key = (lock, threading.get_ident())
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    Path(lock).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        _acquire(fd, lock, timeout, waiting)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({holder or 'hotcache'})\n".encode(), 0)
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def lock_holder(fd: int) -> str:
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    return text or "another hotcache run (it has not said which yet)"


def _acquire(fd: int, lock: str, timeout: float | None,
             waiting: Callable[[str], None] | None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        who = lock_holder(fd)
        if waiting is not None and not told:
            waiting(who)
            told = True
        if deadline is not None and time.monotonic() >= deadline:
            raise LockTimeout(f"{lock} is held by {who}; gave up after {timeout:.0f} s",
                              hint="let that run finish (or stop it) and retry; "
                                   "HOTCACHE_LOCK_TIMEOUT sets how long to wait")
        time.sleep(0.2)

"""Reads that ride out a cache's fail-over.

When a dm-cache's SSD dies, reads of blocks it held fail with EIO until hotcache's
watcher switches the cache to its origin (a few seconds; docs/safety.md, "When the SSD
dies"). A loader that gives up on the first EIO kills a training run that a few seconds
of patience would have kept: so the loaders read each file through `read_bytes`, which
retries a read that fails with EIO for a bounded time, logs each retry (the file and the
errno), and when the time is up raises the last error, an OSError naming the file.

The bound: HOTCACHE_EIO_RETRY_S seconds (default 30; 0 turns the retries off). Any other
error (a missing file, a permission) is raised at once, as before.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import TypeVar

from .logs import log

ENV = "HOTCACHE_EIO_RETRY_S"
DEFAULT_SECONDS = 30.0
FIRST_WAIT, LONGEST_WAIT = 0.05, 1.0      # seconds between tries: doubling up to 1 s

T = TypeVar("T")
_warned: set[str] = set()


def retry_seconds() -> float:
    """HOTCACHE_EIO_RETRY_S, or the default (a value that is not a number of seconds is
    warned about once)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_SECONDS
    try:
        value = float(raw)
        if value >= 0:
            return value
    except ValueError:
        pass
    if raw not in _warned:
        _warned.add(raw)
        log.warning("%s=%r is not a number of seconds; using %g", ENV, raw, DEFAULT_SECONDS)
    return DEFAULT_SECONDS


def retrying(read: Callable[[], T], path: str | os.PathLike[str], seconds: float | None = None, *,
             sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> T:
    """read(), again while it fails with EIO, for at most `seconds` (default
    retry_seconds()); then its last error, naming `path`."""
    limit = retry_seconds() if seconds is None else seconds
    start = clock()
    wait, tries = FIRST_WAIT, 0
    while True:
        try:
            return read()
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            spent = clock() - start
            name = os.fsdecode(path)
            if spent >= limit:
                if tries:
                    raise OSError(errno.EIO, f"{os.strerror(errno.EIO)}: still failing after "
                                  f"{tries} retries in {spent:.1f} s ({ENV}={limit:g})",
                                  name) from exc
                if exc.filename is None:
                    exc.filename = name
                raise
            tries += 1
            log.warning("read of %s failed with EIO (errno %d); retry %d in %.2f s "
                        "(gives up after %g s: %s)", name, exc.errno, tries, wait, limit, ENV)
            sleep(min(wait, max(limit - spent, 0.0)))
            wait = min(wait * 2, LONGEST_WAIT)


def read_bytes(path: str | os.PathLike[str], seconds: float | None = None) -> bytes:
    """The whole file, each EIO retried (see `retrying`)."""
    def read() -> bytes:
        with open(path, "rb") as f:
            return f.read()
    return retrying(read, path, seconds)

"""Bounded waits with progress: the kernel finishes some work (writeback flushes, device
registration) in its own time, and hotcache must neither hang nor give up silently."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

from hotcache.provision.errors import WaitTimeout


def wait_until(what: str, done: Callable[[], "tuple[bool, str]"], *, timeout: float,
               interval: float = 0.5, hint: str | None = None, every: float = 5.0) -> None:
    """Poll `done()` -> (finished, progress text) until finished; print the progress text
    every `every` seconds; raise WaitTimeout naming `what` after `timeout` seconds."""
    start = last = time.monotonic()
    while True:
        finished, progress = done()
        if finished:
            return
        now = time.monotonic()
        if now - start >= timeout:
            raise WaitTimeout(f"gave up waiting after {timeout:.0f}s for {what} ({progress})",
                              hint=hint or "run the same command again to keep waiting")
        if now - last >= every:
            sys.stderr.write(f"  waiting for {what}: {progress} ({now - start:.0f}s)\n")
            last = now
        time.sleep(interval)


STALL = 60.0    # seconds without progress before a flush says what holds it


def wait_drained(what: str, remaining: Callable[[], "tuple[int, str]"], *, timeout: float,
                 diagnose: Callable[[], str], hint: str, interval: float = 1.0,
                 every: float = 5.0, stall: float = STALL,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 say: Callable[[str], object] | None = None) -> None:
    """Poll `remaining()` -> (count left, progress text) until the count is 0.

    Progress is printed every `every` seconds. When the count has not fallen for `stall`
    seconds the wait says, once per stall period, what holds it and what to do
    (`diagnose()`), instead of repeating the same count until the timeout. Errors raised
    by `remaining` (the device went away) end the wait at once."""
    say = say or sys.stderr.write
    start = last_said = last_fall = clock()
    lowest, stalled_at = None, None
    while True:
        count, progress = remaining()
        if count == 0:
            return
        now = clock()
        if lowest is None or count < lowest:
            lowest, last_fall, stalled_at = count, now, None
        if now - start >= timeout:
            raise WaitTimeout(f"gave up waiting after {timeout:.0f}s for {what} ({progress}); "
                              f"{diagnose()}", hint=hint)
        if now - last_fall >= stall and (stalled_at is None or now - stalled_at >= stall):
            stalled_at = now
            say(f"  {what}: no progress for {now - last_fall:.0f}s ({progress}). "
                f"{diagnose()}\n")
        elif stalled_at is None and now - last_said >= every:   # no repeats of a stuck count
            say(f"  waiting for {what}: {progress} ({now - start:.0f}s)\n")
            last_said = now
        sleep(interval)


def flush_timeout() -> float:
    """How long a teardown waits for a cache's dirty data to reach the origin
    (HOTCACHE_FLUSH_TIMEOUT seconds, default an hour) before it stops, keeping the cache."""
    return float(os.environ.get("HOTCACHE_FLUSH_TIMEOUT", "3600"))

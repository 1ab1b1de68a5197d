"""Bounded waits with progress: the kernel finishes some work (writeback flushes, device
registration) in its own time, and hotcache must neither hang nor give up silently."""

from __future__ import annotations

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

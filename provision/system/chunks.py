"""Reading a file to its end in 1 MiB chunks through one reused buffer (copy, verify,
warm). os.readv into a preallocated buffer allocates nothing per chunk and releases the
GIL, so reader threads really overlap."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator

CHUNK = 1 << 20


def thread_buffer(local: threading.local) -> memoryview:
    """This thread's CHUNK-sized buffer (one per thread, made on first use)."""
    buf = getattr(local, "buf", None)
    if buf is None:
        buf = local.buf = memoryview(bytearray(CHUNK))
    return buf


def chunks(fd: int, buf: memoryview) -> Iterator[memoryview]:
    """The bytes of `fd` from its offset to EOF, each chunk a view of `buf` that the next
    chunk overwrites."""
    while n := os.readv(fd, [buf]):
        yield buf[:n]


def sha256_of(fd: int, buf: memoryview, advance: Callable[[int], None] | None = None) -> str:
    """The sha256 hex digest of `fd` from its offset to EOF; `advance(n)` after each chunk."""
    h = hashlib.sha256()
    for chunk in chunks(fd, buf):
        h.update(chunk)
        if advance is not None:
            advance(len(chunk))
    return h.hexdigest()

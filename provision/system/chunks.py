"""Reading a file to its end in 1 MiB chunks through one reused buffer (copy, verify,
warm). os.readv into a preallocated buffer allocates nothing per chunk and releases the
GIL, so reader threads really overlap. And hashing a range of a file straight from the
page cache, through a read-only mapping (the large-file copy)."""

from __future__ import annotations

import errno
import hashlib
import mmap
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


def hash_range(h: hashlib._Hash, fd: int, offset: int, nbytes: int) -> None:
    """Feed bytes [offset, offset+nbytes) of `fd` to `h` from the page cache, without
    copying them: a read-only shared mapping of just that range (mmap offsets must be
    page-aligned, so the mapping starts at the page that holds `offset`). A file system
    that cannot map files is read with pread instead. The caller makes sure nobody
    truncates the file meanwhile: touching a mapped page past EOF is a SIGBUS."""
    start = offset - offset % mmap.PAGESIZE
    try:
        mapped = mmap.mmap(fd, nbytes + offset - start, prot=mmap.PROT_READ, offset=start)
    except OSError as exc:
        if exc.errno not in (errno.ENODEV, errno.EACCES, errno.EINVAL):
            raise
        _hash_pread(h, fd, offset, nbytes)
        return
    try:
        with memoryview(mapped) as view, view[offset - start:] as wanted:
            h.update(wanted)
    finally:
        mapped.close()


def _hash_pread(h: hashlib._Hash, fd: int, offset: int, nbytes: int) -> None:
    buf = memoryview(bytearray(min(CHUNK, nbytes)))
    end = offset + nbytes
    while offset < end:
        n = os.preadv(fd, [buf[:min(len(buf), end - offset)]], offset)
        if not n:
            raise OSError(errno.EIO, "file shorter than the bytes just written to it")
        h.update(buf[:n])
        offset += n

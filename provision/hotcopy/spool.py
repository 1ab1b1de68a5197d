"""A growable byte string kept in an unnamed temporary file instead of in memory.

A hot copy keeps a few fixed-size records per selected file (the numbers of the
selection, the sha256 of each file). In bytearrays these cost about 150 bytes a file,
some 300 MiB of resident memory at two million files. Kept in a file, the same bytes
live in the page cache, which the kernel writes out and drops when memory is short,
and they never count in the process's resident memory.

The file has no name (O_TMPFILE, mode 0600): nothing can open it, and it disappears
when it is closed or the process dies. It is made beneath a directory descriptor when
one is given (the folder that holds the staging folder, so the spool sits on the copy's
own disk), never by a path root would resolve through a user's symlink.
"""

from __future__ import annotations

import errno
import os
import secrets
import tempfile
import threading

_FLUSH = 1 << 20   # appends are gathered up to this many bytes, then written at once
# Reads come in small spans, mostly in order (a record, then a path): one pread fills a
# window of this many bytes, and the following spans are sliced from it. Without it a
# copy makes about a dozen preads a file, which at small files costs more than the copy.
_WINDOW = 1 << 16


def _unnamed(dir_fd: int | None) -> int:
    if dir_fd is None:
        # The system's temporary folder: Python opens it O_TMPFILE (or O_EXCL, unlinked
        # at once), mode 0600.
        with tempfile.TemporaryFile(buffering=0) as f:
            return os.dup(f.fileno())
    try:
        return os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    # A filesystem without O_TMPFILE: a fresh name, created exclusively (never a file
    # or symlink already there), removed at once so only the descriptor holds it.
    name = f".hotcache-spool-{secrets.token_hex(8)}"
    fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    os.unlink(name, dir_fd=dir_fd)
    return fd


class Spool:
    """Reads and writes like a bytearray for what a copy needs: `len`, `s[a:b]`,
    `s[a:b] = data` (same length), and `s += data` (appends). Only the pending appends
    (at most about 1 MiB) and one read window (64 KiB) are held in memory. Copy threads
    may read and write one spool at once: the window is read and replaced under a lock,
    and a write drops it, so a read never returns bytes older than the last write."""

    __slots__ = ("_fd", "_size", "_tail", "_window", "_lock")

    def __init__(self, size: int = 0, dir_fd: int | None = None):
        self._fd = _unnamed(dir_fd)
        self._size = 0          # bytes written to the file
        self._tail = bytearray()   # appends not yet written
        self._window: tuple[int, bytes] = (0, b"")   # (offset, bytes read from there)
        self._lock = threading.Lock()
        if size:
            os.ftruncate(self._fd, size)   # zero-filled, and sparse until written
            self._size = size

    def __del__(self) -> None:
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            os.close(fd)
            self._fd = -1

    def __len__(self) -> int:
        return self._size + len(self._tail)

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._tail:
            _pwrite_all(self._fd, self._tail, self._size)
            self._size += len(self._tail)
            self._tail.clear()

    def __iadd__(self, data: bytes) -> Spool:
        with self._lock:
            self._tail += data
            if len(self._tail) >= _FLUSH:
                self._flush()
        return self

    def _span(self, key: slice) -> tuple[int, int]:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("a spool is read in contiguous spans")
        return start, max(start, stop)

    def __getitem__(self, key: slice) -> bytes:
        start, stop = self._span(key)
        with self._lock:
            if stop > self._size:
                self._flush()
            at, held = self._window
            if at <= start and stop <= at + len(held):
                return held[start - at:stop - at]
            if stop - start >= _WINDOW:
                return self._pread(start, stop)
            held = self._pread(start, min(self._size, start + _WINDOW))
            self._window = (start, held)
            return held[:stop - start]

    def _pread(self, start: int, stop: int) -> bytes:
        out = os.pread(self._fd, stop - start, start)
        if len(out) != stop - start:
            raise OSError(errno.EIO, "the spool file came back short")
        return out

    def __setitem__(self, key: slice, data: bytes | bytearray) -> None:
        start, stop = self._span(key)
        if stop - start != len(data):
            raise ValueError("a spool span is overwritten with as many bytes")
        with self._lock:
            if stop > self._size:
                self._flush()
            _pwrite_all(self._fd, data, start)
            self._window = (0, b"")


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n

"""Copying one file the way a hot copy needs it: read once, hash while reading, write,
keep mtime and permissions, and start writeback early. Used from many threads at once
(hashlib and os.readv/os.write release the GIL, so threads really overlap)."""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hotcache.provision.system import fsops
from hotcache.provision.errors import HotcacheError
from hotcache.provision.system.meter import NullMeter
from hotcache.provision.hotcopy.selection import Entry

CHUNK = 1 << 20
LARGE = 64 << 20          # files this size and up are copied at most LARGE_STREAMS at a time
WRITE_BEHIND = 8 << 20    # within a large file, start writeback every 8 MiB: the disk
                          # writes while we read and hash, instead of all at the final sync
PIPELINE = 16 << 20       # files this size and up are hashed in a second thread
PIPE_CHUNK = 4 << 20      # the pipelined copy's buffers: fewer syscalls per byte
RING = 4                  # buffers in flight per pipelined file (read, hash, write overlap)

Done = tuple[str, int, int, str]   # rel, size, mtime_ns, sha256 hex: one journal line


def default_jobs() -> int:
    """Enough threads to keep a disk array and the hashing busy, not so many that an HDD
    seeks itself to death."""
    return min(16, 4 * (os.cpu_count() or 1))


def large_streams() -> int:
    """Many sequential streams at once interleave on the disks (seeks, fragmented extents):
    measured here, 2 streams of large files beat 8."""
    return max(2, (os.cpu_count() or 1) // 2)


class Limiter:
    """One byte-rate limit shared by all threads (like rsync's --bwlimit)."""

    def __init__(self, rate: int):
        self.rate = rate
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def take(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            start = max(self.next, now)
            self.next = start + n / self.rate
        if start > now:
            time.sleep(start - now)


class _Changed(Exception):
    """The source file changed while it was read."""


def buffer(local: threading.local) -> memoryview:
    buf = getattr(local, "buf", None)
    if buf is None:
        buf = local.buf = memoryview(bytearray(CHUNK))
    return buf


@dataclass
class FileCopier:
    src: Path
    staging: Path
    dest: Path                          # the published copy, for refresh hard links
    mode: int | None = None             # file permission bits, None: as in the source
    owner: tuple[int, int] | None = None
    limiter: Limiter | None = None
    meter: NullMeter = field(default_factory=NullMeter)
    stop: threading.Event = field(default_factory=threading.Event)
    recopied: int = 0                   # --checksum found these changed
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _large: threading.Semaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(large_streams()))

    def open_source(self, e: Entry) -> int:
        path = os.path.join(self.src, e.rel)
        if e.via_symlink:
            real = Path(path).resolve()
            if not real.is_relative_to(self.src):
                raise HotcacheError(f"{path} now points out of the source; run again")
            return os.open(real, os.O_RDONLY | os.O_CLOEXEC)
        # O_NOFOLLOW: a file swapped for a symlink since the walk fails instead of leaking
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def hash_source(self, e: Entry) -> str:
        h = hashlib.sha256()
        fd = self.open_source(e)
        try:
            buf = buffer(self._local)
            while n := os.readv(fd, [buf]):
                h.update(buf[:n])
        finally:
            os.close(fd)
        return h.hexdigest()

    def copy(self, e: Entry) -> Done:
        if e.size >= LARGE:
            with self._large:
                return self._copy_retrying(e)
        return self._copy_retrying(e)

    def _copy_retrying(self, e: Entry) -> Done:
        for _ in range(3):
            try:
                return self._copy_once(e)
            except _Changed:
                continue
        raise HotcacheError(f"{self.src / e.rel} kept changing while it was copied",
                            hint="copy when nothing writes to the source, or exclude that file")

    def _copy_once(self, e: Entry) -> Done:
        sfd = self.open_source(e)
        try:
            st = os.fstat(sfd)
            if not stat.S_ISREG(st.st_mode):
                raise HotcacheError(f"{self.src / e.rel} is no longer a regular file")
            if st.st_size > CHUNK:   # more readahead; a small file is one read anyway
                os.posix_fadvise(sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            dfd = os.open(os.path.join(self.staging, e.rel), os.O_WRONLY | os.O_CREAT
                          | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                digest, total = self._pump(sfd, dfd, st.st_size)
                after = os.fstat(sfd)
                if total != after.st_size or after.st_mtime_ns != st.st_mtime_ns:
                    self.meter.advance(-total)
                    raise _Changed()
                os.fchmod(dfd, self.mode if self.mode is not None else stat.S_IMODE(st.st_mode))
                if self.owner:
                    os.fchown(dfd, *self.owner)
                os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        return e.rel, st.st_size, st.st_mtime_ns, digest

    def _pump(self, sfd: int, dfd: int, size: int) -> tuple[str, int]:
        """Read, hash and write until `size` bytes or EOF (a file that grows meanwhile is
        caught by the caller's second fstat, so the EOF read can be skipped). A large
        file is hashed by a second thread while this one reads and writes."""
        if size >= PIPELINE:
            return self._pump_pipelined(sfd, dfd, size)
        h = hashlib.sha256()
        buf = buffer(self._local)
        total = flushed = 0
        while total < size and (n := os.readv(sfd, [buf])):
            view = self._moved(buf[:n])
            h.update(view)
            self._write(dfd, view)
            total += n
            if total - flushed >= WRITE_BEHIND:
                fsops.start_writeback(dfd, flushed, total - flushed)
                flushed = total
        return h.hexdigest(), total

    def _moved(self, view: memoryview) -> memoryview:
        """Per chunk read: stop, rate limit, progress."""
        if self.stop.is_set():
            raise InterruptedError("stopped")
        if self.limiter:
            self.limiter.take(len(view))
        self.meter.advance(len(view))
        return view

    @staticmethod
    def _write(dfd: int, view: memoryview) -> None:
        while view:
            view = view[os.write(dfd, view):]

    def _pump_pipelined(self, sfd: int, dfd: int, size: int) -> tuple[str, int]:
        """The same bytes, hash and writeback as `_pump`, with reading+writing and hashing
        overlapped: this thread reads a chunk, hands it to a hasher thread, writes it, and
        reads the next into another buffer; a buffer is reused only once both the write
        (here) and the hash (there) are done with it. sha256 and the syscalls release
        the GIL, so the two threads run on two cores: a stream costs max(hash, I/O)
        instead of their sum (measured: bench/bench_copy.py, large set)."""
        h = hashlib.sha256()
        free: queue.SimpleQueue = queue.SimpleQueue()
        full: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(RING):
            free.put(memoryview(bytearray(PIPE_CHUNK)))
        failed: list[BaseException] = []

        def hasher() -> None:
            while (item := full.get()) is not None:
                buf, n = item
                try:
                    h.update(buf[:n])
                except Exception as exc:              # handed to the copying thread below
                    failed.append(exc)
                free.put(buf)

        worker = threading.Thread(target=hasher, name="hash", daemon=True)
        worker.start()
        total = flushed = 0
        try:
            while total < size:
                buf = free.get()
                n = os.readv(sfd, [buf])
                if not n:
                    free.put(buf)
                    break
                self._moved(buf[:n])
                full.put((buf, n))
                self._write(dfd, buf[:n])
                total += n
                if total - flushed >= WRITE_BEHIND:
                    fsops.start_writeback(dfd, flushed, total - flushed)
                    flushed = total
        finally:
            full.put(None)
            worker.join()
        if failed:
            raise failed[0]
        return h.hexdigest(), total

    def link(self, e: Entry, digest: str) -> Done:
        """Take an unchanged file from the published copy: a hard link, no data moved."""
        target = os.path.join(self.staging, e.rel)
        if os.path.lexists(target):
            os.unlink(target)
        try:
            os.link(os.path.join(self.dest, e.rel), target, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOENT):
                raise
            return self.copy(e)
        if self.mode is not None:
            os.chmod(target, self.mode)
        if self.owner:
            os.chown(target, *self.owner)
        self.meter.advance(e.size)
        return e.rel, e.size, e.mtime_ns, digest

    def check(self, e: Entry, digest: str) -> Done:
        """--checksum: hash the source; link when it matches the published copy."""
        if self.hash_source(e) == digest:
            return self.link(e, digest)
        with self._lock:
            self.recopied += 1
        return self.copy(e)

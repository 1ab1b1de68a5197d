"""Copying one file the way a hot copy needs it: read once into a reused 1 MiB buffer,
hash the buffer, write it; keep mtime and permissions, and start writeback early. Used
from many threads at once (hashlib and os.readv/os.write release the GIL, so threads
really overlap).

One path for every size. A kernel copy (sendfile, hashed from the staging file's pages
by a second thread) is not faster for large files: it took more time and more CPU than
this path on XFS and on ext4 (bench/bench_copy.py measures the copy; BENCHMARKS.md)."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import multiprocessing
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hotcache.provision.system import beneath, fsops
from hotcache.provision.errors import HotcacheError
from hotcache.provision.system.chunks import CHUNK, sha256_of, thread_buffer
from hotcache.provision.system.meter import NullMeter
from hotcache.provision.hotcopy.selection import Entry

LARGE = 64 << 20          # files this size and up are copied at most large_streams() at a time
WRITE_BEHIND = 8 << 20    # within a large file, start writeback every 8 MiB: the disk
                          # writes while we read and hash, instead of all at the final sync

Done = tuple[str, int, int, str]   # rel, size, mtime_ns, sha256 hex: one journal line


def default_jobs() -> int:
    """Enough threads to keep a disk array and the hashing busy, not so many that an HDD
    seeks itself to death."""
    return min(16, 4 * (os.cpu_count() or 1))


def large_streams() -> int:
    """Many sequential streams at once interleave on the disks (seeks, fragmented extents):
    2 streams of large files copy faster than 8 (bench/bench_copy.py)."""
    return max(2, (os.cpu_count() or 1) // 2)


class Limiter:
    """One byte-rate limit shared by all threads and worker processes (like rsync's
    --bwlimit). Its clock lives in shared memory, forked along with the copy; a thread
    lock orders the threads of one process and a POSIX record lock (lockf) the
    processes, which the kernel releases when a process dies holding it (a worker
    killed mid-take must not stall the others)."""

    def __init__(self, rate: int):
        self.rate = rate
        self.lock = threading.Lock()
        # CLOCK_MONOTONIC is one clock for every process
        self.next = multiprocessing.get_context("fork").RawValue("d", time.monotonic())
        self._file = tempfile.TemporaryFile()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self.lock:
            fcntl.lockf(self._file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(self._file, fcntl.LOCK_UN)

    def take(self, n: int) -> None:
        with self._locked():
            now = time.monotonic()
            start = max(self.next.value, now)
            self.next.value = start + n / self.rate
        if start > now:
            time.sleep(start - now)


class Flag:
    """A stop flag every worker process sees: one shared byte, set once, read without a
    lock (threading.Event would stay unset in the processes forked before it was set)."""

    def __init__(self) -> None:
        self._value = multiprocessing.get_context("fork").RawValue("B", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)


class _Changed(Exception):
    """The source file changed while it was read."""


@dataclass
class FileCopier:
    """Copies files from the folder `src_fd` (SRC) into the folder `staging_fd`; every
    open is beneath its folder (system/beneath.py) and checked against the walk."""
    src: Path                           # for messages only: all I/O goes through the fds
    src_fd: int
    staging_fd: int
    dest_fd: int | None = None          # the published copy, for refresh hard links
    mode: int | None = None             # file permission bits, None: as in the source
    owner: tuple[int, int] | None = None
    limiter: Limiter | None = None
    meter: NullMeter = field(default_factory=NullMeter)
    stop: Flag = field(default_factory=Flag)
    recopied: int = 0                   # --checksum found these changed
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _large: threading.Semaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(large_streams()))

    def open_source(self, e: Entry) -> int:
        """The source file the walk saw, or an error: a symlink anywhere on the way (a
        folder swapped since the walk) or another file at that name is refused."""
        return self._open_source(e)[0]

    def _open_source(self, e: Entry) -> tuple[int, os.stat_result]:
        """open_source, with the fstat that checked it. Opened non-blocking (a FIFO
        swapped in for a file would block the open for ever, a device could too), checked
        to be a regular file, and only then made blocking for the reads."""
        try:
            fd = beneath.open_at(self.src_fd, e.source, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                raise
            raise HotcacheError(f"{self.src / e.rel} now leads through a symlink; it was "
                                "not copied", hint="make sure nobody changes the source "
                                "during the copy, then run again") from None
        try:
            st = beneath.expect(fd, (e.dev, e.ino), e.rel) if e.ino else os.fstat(fd)
        except beneath.Swapped:
            os.close(fd)
            raise HotcacheError(f"{self.src / e.rel} was replaced by another file since "
                                "the source was listed; it was not copied",
                                hint="make sure nobody changes the source during the "
                                     "copy, then run again") from None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise HotcacheError(f"{self.src / e.rel} is no longer a regular file (a "
                                f"{stat.filemode(st.st_mode)[0]!r} entry); it was not copied",
                                hint="make sure nobody changes the source during the copy, "
                                     "then run again")
        os.set_blocking(fd, True)
        return fd, st

    def file_mode(self, source_mode: int) -> int:
        return beneath.strip_privilege(self.mode if self.mode is not None else source_mode)

    def hash_source(self, e: Entry) -> str:
        fd = self.open_source(e)
        try:
            return sha256_of(fd, thread_buffer(self._local))
        finally:
            os.close(fd)

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
        sfd, st = self._open_source(e)
        try:
            if not stat.S_ISREG(st.st_mode):
                raise HotcacheError(f"{self.src / e.rel} is no longer a regular file")
            if st.st_size > CHUNK:   # more readahead; a small file is one read anyway
                os.posix_fadvise(sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            dfd = beneath.open_at(self.staging_fd, e.rel,
                                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                try:
                    digest, total = self._pump(sfd, dfd, st.st_size)
                except OSError as exc:
                    if exc.filename is not None or exc.errno is None:
                        raise
                    # read/write errors name no file: say which file's copy it
                    # was (the path in the copy: the error may be the source's or the
                    # staging file's)
                    raise OSError(exc.errno, exc.strerror, e.rel) from exc
                after = os.fstat(sfd)
                if total != after.st_size or after.st_mtime_ns != st.st_mtime_ns:
                    self.meter.advance(-total)
                    raise _Changed()
                if self.owner:
                    os.fchown(dfd, *self.owner)
                os.fchmod(dfd, self.file_mode(st.st_mode))
                os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        return e.rel, st.st_size, st.st_mtime_ns, digest

    def _pump(self, sfd: int, dfd: int, size: int) -> tuple[str, int]:
        """Copy and hash until `size` bytes or EOF (a file that grows meanwhile is caught by
        the caller's second fstat, so the EOF read can be skipped); returns the sha256 of
        the bytes written and their count. Each chunk is hashed from the buffer it is
        written from, while it is still in this core's cache."""
        h = hashlib.sha256()
        buf = thread_buffer(self._local)
        total = flushed = 0
        while total < size and (n := os.readv(sfd, [buf])):
            self._moved(n)
            view = buf[:n]
            h.update(view)
            self._write(dfd, view)
            total += n
            if total - flushed >= WRITE_BEHIND:
                fsops.start_writeback(dfd, flushed, total - flushed)
                flushed = total
        return h.hexdigest(), total

    def _moved(self, n: int) -> None:
        """Per chunk copied: stop, rate limit, progress."""
        if self.stop.is_set():
            raise InterruptedError("stopped")
        if self.limiter:
            self.limiter.take(n)
        self.meter.advance(n)

    @staticmethod
    def _write(dfd: int, view: memoryview) -> None:
        while view:
            view = view[os.write(dfd, view):]

    def link(self, e: Entry, digest: str) -> Done:
        """Take an unchanged file from the published copy: a hard link, no data moved.
        The published file is opened beneath DEST (no symlink) and checked (a regular
        file of the recorded size and mtime, owned by root or by the copy's owner); the
        link is made to that open file, whose mode and owner are then set on the same
        descriptor. Anything else is copied afresh."""
        pfd = self._published(e)
        if pfd is None:
            return self.copy(e)
        try:
            folder, _, name = e.rel.rpartition("/")
            dirfd = beneath.open_at(self.staging_fd, folder or ".", beneath.DIR)
            try:
                try:
                    os.unlink(name, dir_fd=dirfd)
                except FileNotFoundError:
                    pass
                try:   # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd: exactly this inode
                    os.link(f"/proc/self/fd/{pfd}", name, dst_dir_fd=dirfd,
                            follow_symlinks=True)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK,
                                         errno.ENOENT):
                        raise
                    return self.copy(e)
            finally:
                os.close(dirfd)
            if self.owner:
                os.fchown(pfd, *self.owner)
            os.fchmod(pfd, self.file_mode(os.fstat(pfd).st_mode))
        finally:
            os.close(pfd)
        self.meter.advance(e.size)
        return e.rel, e.size, e.mtime_ns, digest

    def _published(self, e: Entry) -> int | None:
        """An open descriptor of DEST's file for `e` when it can be linked, else None."""
        if self.dest_fd is None:
            return None
        try:
            fd = beneath.open_at(self.dest_fd, e.rel, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None   # gone, or a symlink planted there: copy afresh
        st = os.fstat(fd)
        owners = {os.geteuid(), *((self.owner[0],) if self.owner else ())}
        if (stat.S_ISREG(st.st_mode) and st.st_size == e.size
                and st.st_mtime_ns == e.mtime_ns and st.st_uid in owners):
            return fd
        os.close(fd)
        return None

    def check(self, e: Entry, digest: str) -> Done:
        """--checksum: hash the source; link when it matches the published copy."""
        if self.hash_source(e) == digest:
            return self.link(e, digest)
        with self._lock:
            self.recopied += 1
        return self.copy(e)

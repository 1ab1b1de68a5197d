"""Linux filesystem calls the standard library lacks: syncfs(2), and renameat2(2) with
RENAME_EXCHANGE (swap two directories in one step; XFS, ext4 and btrfs support it)."""

from __future__ import annotations

import ctypes
import errno
import os

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def syncfs(path: str | os.PathLike[str] | int) -> None:
    """Flush the whole filesystem holding `path` (or the open descriptor) to stable
    storage, like `sync` but for one filesystem; since Linux 5.8 it reports write-back
    errors (ENOSPC, EIO)."""
    fd = os.dup(path) if isinstance(path, int) else os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
    """Atomically swap the names `a` and `b` (both must exist, same filesystem). Raises
    OSError(EINVAL/ENOSYS) where the filesystem or kernel cannot."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                       _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a), None, str(b))


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing this range of the file to disk now, without waiting for it
    (sync_file_range SYNC_FILE_RANGE_WRITE). Only a hint for speed: errors surface at
    the syncfs that follows, so the return value is not checked."""
    _libc.sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(nbytes),
                          _SYNC_FILE_RANGE_WRITE)

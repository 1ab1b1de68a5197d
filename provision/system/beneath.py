"""File work beneath a root folder that no symlink, rename race or odd file name can lead
out of. hotcache copies, verifies and warms as root in folders that other users can
write to; every path it touches there is opened relative to a directory descriptor.

- `open_at(dirfd, rel, flags)`: openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
  (Linux 5.6+): the kernel refuses ELOOP for a symlink anywhere on the way, EXDEV for a
  path that would climb out. Where openat2 is missing (ENOSYS), each component is opened
  with O_NOFOLLOW from the one before, and '..' is refused.
- `expect(fd, st, name)`: the opened file is the one the walk recorded (st_dev, st_ino);
  a file swapped since then raises `Swapped`.
- `held(value, missing)`: a descriptor (or its stat) that is open only part of the time,
  read as itself, or a RuntimeError that names the state it needs, never as None.
- `makedirs`, `walk`, `write_file` (`write_stream`), `empty`, `rmdir_if`, `rename_at`:
  the rest of what a copy does, all on descriptors. Ownership and modes are set with
  fchown/fchmod on open descriptors, never by path.

Names are str with surrogateescape (as os.fsdecode gives them), so any byte string Linux
allows as a name works, including non-UTF-8 bytes, newlines and leading dashes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterable, Iterator, Set as AbstractSet
from typing import TypeVar

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPENAT2 = 437                      # x86_64, aarch64 and every arch since 5.6
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

DIR = os.O_RDONLY | os.O_DIRECTORY
USE_OPENAT2 = True                      # tests turn this off to exercise the fallback
T = TypeVar("T")


class Untrusted(OSError):
    """A path leads through a symlink that someone other than root could have made."""


class Swapped(OSError):
    """A file or folder is not the one the walk saw: replaced since, by someone else."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_HOW: dict[tuple[int, int], ctypes._CArgObject] = {}   # (flags, mode) -> open_how, made once each


def _how(flags: int, mode: int) -> ctypes._CArgObject:
    """The open_how for these flags and mode (a copy opens hundreds of thousands of files
    with the same two or three)."""
    how = _HOW.get((flags, mode))
    if how is None:
        creates = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
        how = _HOW[(flags, mode)] = ctypes.byref(_OpenHow(
            flags, mode if creates else 0,   # openat2: a mode without O_CREAT is EINVAL
            RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS))
    return how


def _openat2(dirfd: int, rel: str, flags: int, mode: int) -> int:
    fd: int = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(rel), _how(flags, mode),
                            ctypes.sizeof(_OpenHow))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    return fd


def _by_component(dirfd: int, rel: str, flags: int, mode: int) -> int:
    """The fallback: one O_NOFOLLOW open per component, '..' and absolute paths refused."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or ".." in parts:
        raise OSError(errno.EXDEV, "path leads out of its root", rel)
    if not parts:
        return os.open(".", flags, mode, dir_fd=dirfd)
    fd = dirfd
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, DIR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except NotADirectoryError:   # O_DIRECTORY|O_NOFOLLOW on a link: as openat2 says
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel) from None
                raise
            if fd != dirfd:
                os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW, mode, dir_fd=fd)
    finally:
        if fd != dirfd:
            os.close(fd)


def open_at(dirfd: int, rel: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """Open `rel` beneath the folder `dirfd`, following no symlink at all (ELOOP) and never
    climbing out (EXDEV). O_CLOEXEC is always added."""
    global USE_OPENAT2
    flags |= os.O_CLOEXEC
    if USE_OPENAT2:
        try:
            return _openat2(dirfd, rel, flags, mode)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            USE_OPENAT2 = False
    return _by_component(dirfd, rel, flags, mode)


class _Descent:
    """One folder descriptor at a time on the way down a path: `down(nxt)` moves to the
    next folder and closes the one before; an error on the way closes the current one,
    and a walk that ends well hands `fd` to its caller."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> _Descent:
        return self

    def down(self, nxt: int) -> None:
        os.close(self.fd)
        self.fd = nxt

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            os.close(self.fd)


def open_root(path: str | os.PathLike[str]) -> int:
    """A descriptor of the folder the administrator named: the root everything else is
    opened beneath. The path is walked from / one folder descriptor at a time, so a
    folder renamed or swapped while hotcache runs cannot lead it elsewhere. A symlink on
    the way is followed only when root (or the caller) owns it, read from the link
    itself: a link another user made, in a folder they can write, could point anywhere
    (`Untrusted`). The last component must be a folder, not a symlink."""
    parts = [p for p in os.fspath(os.path.abspath(path)).split("/") if p not in ("", ".")]
    trusted = {0, os.geteuid()}
    links = 0
    with _Descent(os.open("/", DIR | os.O_CLOEXEC)) as at:
        while parts:
            name = parts.pop(0)
            try:
                nxt = os.open(name, DIR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at.fd)
            except (NotADirectoryError, OSError) as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                link = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at.fd)
                try:
                    st = os.fstat(link)
                    if not stat.S_ISLNK(st.st_mode):
                        raise
                    if st.st_uid not in trusted:
                        raise Untrusted(errno.ELOOP, f"{name!r} on the way is a symlink "
                                        f"owned by uid {st.st_uid}, which hotcache does not "
                                        "follow as root: name the real folder",
                                        os.fspath(path)) from None
                    if not parts:
                        raise OSError(errno.ELOOP, "is a symlink: name the folder it "
                                      "points to", os.fspath(path)) from None
                    target = os.readlink("", dir_fd=link)
                finally:
                    os.close(link)
                links += 1
                if links > 40:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(path)) \
                        from None
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                if target.startswith("/"):
                    nxt = os.open("/", DIR | os.O_CLOEXEC)
                else:
                    continue
            at.down(nxt)
        return at.fd


def same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def expect(fd: int, want: os.stat_result | tuple[int, int], name: str) -> os.stat_result:
    """fstat(fd), raising Swapped unless it is the file (st_dev, st_ino) recorded earlier."""
    st = os.fstat(fd)
    dev_ino = (want.st_dev, want.st_ino) if isinstance(want, os.stat_result) else want
    if (st.st_dev, st.st_ino) != tuple(dev_ino):
        raise Swapped(errno.ESTALE, "replaced since it was first looked at", name)
    return st


def held(value: T | None, missing: str) -> T:
    """`value`, a descriptor or stat that is held only part of the time; RuntimeError
    with `missing` (the state it needs) when it is not held now."""
    if value is None:
        raise RuntimeError(missing)
    return value


def makedirs(dirfd: int, rel: str, mode: int = 0o700) -> int:
    """Create the folders of `rel` beneath `dirfd` as needed (a symlink on the way is
    ELOOP, never followed); returns a descriptor of the last one."""
    with _Descent(os.dup(dirfd)) as at:
        for part in [p for p in rel.split("/") if p]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, mode, dir_fd=at.fd)
            at.down(open_at(at.fd, part, DIR))
        return at.fd


def walk(dirfd: int, topdown: bool = True) -> Iterator[tuple[str, list[str], list[str], int]]:
    """os.fwalk beneath `dirfd`: (relative folder, subfolders, files, folder fd), top
    first unless `topdown` is False; each fd is valid only until the next item. fwalk
    checks each subfolder it opens is the one it listed (lstat vs fstat), so a folder
    swapped for a symlink is skipped, not followed; a symlink to a folder is listed among
    the subfolders but never entered. The relative folder is ''
    for the top."""
    for top, dirs, files, fd in os.fwalk(".", topdown=topdown, onerror=_raise, dir_fd=dirfd):
        yield top[2:] if top.startswith("./") else "", dirs, files, fd


def _raise(err: OSError) -> None:
    raise err


def write_file(dirfd: int, name: str, data: bytes, mode: int = 0o644,
               owner: tuple[int, int] | None = None) -> None:
    """Replace `name` in the folder `dirfd` atomically with `data` (`write_stream`)."""
    write_stream(dirfd, name, (data,), mode, owner)


def write_stream(dirfd: int, name: str, chunks: Iterable[bytes], mode: int = 0o644,
                 owner: tuple[int, int] | None = None) -> None:
    """Replace `name` in the folder `dirfd` atomically, written as `chunks` come: a new
    temp file (O_EXCL, no symlink followed), written, fchown'd, fchmod'd, fsync'd,
    renamed over, folder fsync'd."""
    tmp = f".{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dirfd)
    fd = open_at(dirfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.writelines(chunks)
        if owner:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dirfd)
        raise
    finally:
        os.close(fd)
    os.fsync(dirfd)


class NotRegular(OSError):
    """A name that was to hold a regular file holds something else (a FIFO, a device,
    a folder), or a file larger than its reader takes."""


def _read_open(fd: int, name: str, limit: int | None) -> bytes:
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file (hotcache reads only regular "
                             "files here)", name)
        if limit is not None and st.st_size > limit:
            raise NotRegular(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} this "
                             "file may hold", name)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


# O_NONBLOCK: opening a FIFO planted at the name returns at once (a blocking open would
# wait forever for a writer) and the fstat above refuses it.
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK


def read_file(dirfd: int, name: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file `name` beneath `dirfd`; NotRegular (an OSError) for
    anything else, or for more than `limit` bytes. Never blocks on a FIFO or device."""
    return _read_open(open_at(dirfd, name, READ_FLAGS), name, limit)


def read_regular(path: str | os.PathLike[str], *, dir_fd: int | None = None,
                 limit: int | None = None) -> bytes:
    """`read_file` for a path whose last component only must not be a symlink
    (O_NOFOLLOW): the same refusal of FIFOs, devices and oversized files."""
    fd = os.open(path, READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    return _read_open(fd, os.fspath(path), limit)


def empty(dirfd: int, keep: AbstractSet[str] = frozenset()) -> None:
    """Remove everything inside the folder `dirfd` except the top-level names in `keep`;
    symlinks are removed as links, never followed."""
    for rel, dirs, files, fd in walk(dirfd, topdown=False):
        for name in files:
            if not rel and name in keep:
                continue
            os.unlink(name, dir_fd=fd)
        for name in dirs:   # fwalk lists a symlink to a folder here too: unlink it
            try:
                os.rmdir(name, dir_fd=fd)
            except NotADirectoryError:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass


def rmdir_if(parent_fd: int, name: str, st: os.stat_result) -> bool:
    """Remove the (empty) folder `name` only while it is still the folder `st`."""
    try:
        now = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not same(now, st):
        raise Swapped(errno.ESTALE, "replaced since it was first looked at", name)
    os.rmdir(name, dir_fd=parent_fd)
    return True


def rename_at(old_fd: int, old: str, new_fd: int, new: str, flags: int = 0) -> None:
    """renameat2(2) between two folder descriptors (RENAME_NOREPLACE, RENAME_EXCHANGE);
    neither name is followed if it is a symlink."""
    if _libc.renameat2(old_fd, os.fsencode(old), new_fd, os.fsencode(new), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), old, None, new)


def lstat_at(dirfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def strip_privilege(mode: int) -> int:
    """Permission bits without setuid, setgid and sticky: no privilege crosses a copy."""
    return stat.S_IMODE(mode) & 0o777

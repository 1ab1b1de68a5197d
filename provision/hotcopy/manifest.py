"""Read and write SHA256SUMS exactly as coreutils `sha256sum` does, so that
`cd DEST && sha256sum -c SHA256SUMS` checks a hot copy.

A line is `<hex>  <path>`. A path holding a backslash, newline or carriage return is
escaped (`\\\\`, `\\n`, `\\r`) and its line starts with a backslash: coreutils' rule
(checked against GNU coreutils 9.1). Every other byte is written as it is, so a name that
is not UTF-8 (`caf\\xe9.jpg`) appears in its raw bytes, as sha256sum writes it. Names
are str with surrogateescape, as the os module gives them. (Reading is format.py's
`read_manifest`, standard library only, so the adapters read manifests too.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

from hotcache.provision.hotcopy.format import MANIFEST
from hotcache.provision.hotcopy.format import iter_manifest as iter_lines
from hotcache.provision.hotcopy.format import read_manifest as read
from hotcache.provision.system import beneath

__all__ = ["iter_lines", "line", "lines", "read", "text", "write"]

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}


def line(digest: str, rel: str) -> str:
    if "\\" in rel or "\n" in rel or "\r" in rel:   # the keys of _ESCAPES
        return "\\" + digest + "  " + "".join(_ESCAPES.get(c, c) for c in rel) + "\n"
    return f"{digest}  {rel}\n"


def text(digests: dict[str, str]) -> bytes:
    """The manifest for {relative path: sha256 hex}, sorted by path, as bytes."""
    return b"".join(os.fsencode(line(digests[rel], rel)) for rel in sorted(digests))


def lines(pairs: Iterable[tuple[str, str]]) -> Iterator[bytes]:
    """The manifest's lines, one at a time, for (relative path, sha256 hex) pairs given
    in path order: a copy of millions of files writes its manifest without holding it."""
    for rel, digest in pairs:
        yield os.fsencode(line(digest, rel))


def write(dirfd: int, pairs: Iterable[tuple[str, str]],
          owner: tuple[int, int] | None = None) -> None:
    """SHA256SUMS in the folder `dirfd`, written line by line as `pairs` come (a copy of
    millions of files never holds its manifest whole), the way beneath.write_file
    writes a file: a new temp file (O_EXCL, no symlink followed), owner and mode on its
    descriptor, fsync'd, renamed over, folder fsync'd."""
    tmp = f".{MANIFEST}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dirfd)
    fd = beneath.open_at(dirfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.writelines(lines(pairs))
        if owner:
            os.fchown(fd, *owner)
        os.fchmod(fd, 0o644)
        os.fsync(fd)
        os.rename(tmp, MANIFEST, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dirfd)
        raise
    finally:
        os.close(fd)
    os.fsync(dirfd)

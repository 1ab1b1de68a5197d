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

import os
import stat
from array import array
from collections.abc import Iterable, Iterator

from hotcache.provision.hotcopy.format import MANIFEST, MTIMES
from hotcache.provision.hotcopy.format import iter_manifest as iter_lines
from hotcache.provision.hotcopy.format import read_manifest as read
from hotcache.provision.system import beneath

__all__ = ["iter_lines", "line", "lines", "read", "read_mtimes", "text", "write",
           "write_mtimes"]

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
    millions of files never holds its manifest whole)."""
    beneath.write_stream(dirfd, MANIFEST, lines(pairs), owner=owner)


def write_mtimes(dirfd: int, mtimes: Iterable[int],
                 owner: tuple[int, int] | None = None) -> None:
    """The copy's file mtimes (ns), one a line, in the manifest's order."""
    beneath.write_stream(dirfd, MTIMES, (b"%d\n" % m for m in mtimes), owner=owner)


def read_mtimes(dirfd: int) -> array[int] | None:
    """The mtimes the copy recorded, or None for a copy made before they were kept (or
    whose list cannot be read as one)."""
    try:
        fd = os.open(MTIMES, beneath.READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return None
    out = array("q")
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        os.set_blocking(fd, True)
        try:
            for raw in f:
                out.append(int(raw))
        except (ValueError, OverflowError):
            return None
    return out

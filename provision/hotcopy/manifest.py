"""Read and write SHA256SUMS exactly as coreutils `sha256sum` does, so that
`cd DEST && sha256sum -c SHA256SUMS` checks a hot copy.

A line is `<hex>  <path>`. A path holding a backslash, newline or carriage return is
escaped (`\\\\`, `\\n`, `\\r`) and its line starts with a backslash: coreutils' rule
(checked against GNU coreutils 9.1). Every other byte is written as it is, so a name that
is not UTF-8 (`caf\\xe9.jpg`) appears in its raw bytes, as sha256sum writes it. Names
are str with surrogateescape, as the os module gives them.
"""

from __future__ import annotations

import os
from pathlib import Path

from hotcache.provision.errors import UsageError

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}


def line(digest: str, rel: str) -> str:
    if any(c in rel for c in _ESCAPES):
        return "\\" + digest + "  " + "".join(_ESCAPES.get(c, c) for c in rel) + "\n"
    return f"{digest}  {rel}\n"


def text(digests: dict[str, str]) -> bytes:
    """The manifest for {relative path: sha256 hex}, sorted by path, as bytes."""
    return b"".join(os.fsencode(line(digests[rel], rel)) for rel in sorted(digests))


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append({"\\": "\\", "n": "\n", "r": "\r"}.get(text[i + 1], text[i + 1]))
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read(path: Path, dir_fd: int | None = None) -> dict[str, str]:
    """{relative path: sha256 hex} from a manifest written from `text` or by sha256sum.
    The manifest itself is never a symlink (O_NOFOLLOW); with `dir_fd`, `path` is a name
    in that folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        with open(fd, "rb") as f:
            text = os.fsdecode(f.read())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the manifest ({exc.strerror})") from None
    digests: dict[str, str] = {}
    for n, raw in enumerate(text.split("\n"), 1):
        if not raw:
            continue
        escaped = raw.startswith("\\")
        body = raw[1:] if escaped else raw
        digest, sep, name = body.partition(" ")
        if not sep or len(digest) != 64 or not name or name[0] not in " *":
            raise UsageError(f"{path}: line {n} is not a sha256sum line: {raw[:80]!r}",
                             hint="the copy's manifest was edited; copy it again")
        name = name[1:]
        digests[_unescape(name) if escaped else name] = digest.lower()
    return digests

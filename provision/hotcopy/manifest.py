"""Read and write SHA256SUMS exactly as coreutils `sha256sum` does, so that
`cd DEST && sha256sum -c SHA256SUMS` checks a hot copy.

A line is `<hex>  <path>`. A path holding a backslash, newline or carriage return is
escaped (`\\\\`, `\\n`, `\\r`) and its line starts with a backslash: coreutils' rule.
"""

from __future__ import annotations

from pathlib import Path

from hotcache.provision.system.atomic import write_atomic
from hotcache.provision.errors import UsageError

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}


def line(digest: str, rel: str) -> str:
    if any(c in rel for c in _ESCAPES):
        return "\\" + digest + "  " + "".join(_ESCAPES.get(c, c) for c in rel) + "\n"
    return f"{digest}  {rel}\n"


def write(path: Path, digests: dict[str, str]) -> None:
    """Write the manifest for {relative path: sha256 hex}, sorted by path, atomically."""
    write_atomic(path, "".join(line(digests[rel], rel) for rel in sorted(digests)))


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


def read(path: Path) -> dict[str, str]:
    """{relative path: sha256 hex} from a manifest written by `write` or by sha256sum."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
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

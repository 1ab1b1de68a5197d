"""The on-disk format of a hot copy, shared by the copier (provision) and the training
adapters (which may read it, never write it). Standard library only.

A published hot copy is a directory DEST holding the copied files plus:
  SHA256SUMS           `sha256sum -c SHA256SUMS` (run inside DEST) checks every file
  .hotcache-mtimes     each file's mtime in nanoseconds, in the manifest's order
  .hotcache-copy.json  metadata: {"format": 1, "complete": true, "name", "version",
                       "source", "files", "bytes", "hash": "sha256", "copied_at",
                       "verified_at", "verify_ok", "tool_version"}
While a copy is being made it lives in a staging directory next to DEST (same
filesystem) named `.{DEST.name}.hotcache-staging`; a directory without a complete
metadata file (or a staging directory) is never a hot copy.

What is at a DEST is one `CopyState`, computed by `copy_state` alone: `hotcache copies`,
the metrics, doctor, the node labels and the adapters all read it from there.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hotcache.provision.system import beneath
from hotcache.provision.system.strenum import StrEnum
from hotcache.provision.errors import UsageError

FORMAT = 1
MANIFEST = "SHA256SUMS"
METADATA = ".hotcache-copy.json"
# Each file's modification time (ns) as copied, one a line in the manifest's order: the
# default verify compares them, so a file rewritten in place at the same size is caught
# without hashing (rsync's quick check, size and mtime).
MTIMES = ".hotcache-mtimes"
METADATA_LIMIT = 2**20     # a copy's metadata is a few KiB; a bigger file is not one
STAGING_SUFFIX = ".hotcache-staging"
RESERVED = {MANIFEST, METADATA, MTIMES}


def home(dest: Path) -> Path:
    """The folder on DEST's own filesystem where its staging folder goes: DEST's parent,
    or DEST itself when DEST is a mountpoint (space is counted there too)."""
    return dest if os.path.ismount(dest) else dest.parent


LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def label_ok(label: str) -> bool:
    """A version label that can go into a folder name (the tf.data cache's): letters,
    digits and . _ + -, no '/' and no leading dot (so never '..')."""
    return bool(LABEL.fullmatch(label))


def staging_dir(dest: Path) -> Path:
    return dest.parent / f".{dest.name}{STAGING_SUFFIX}"


class CopyState(StrEnum):
    """What is at a hot copy's DEST. The values are what `hotcache copies` prints."""
    VERIFIED = "verified"                      # published; its last verification passed
    NOT_VERIFIED = "not verified"              # published; never verified since
    FAILED_VERIFICATION = "failed verification"
    # published, with a staging folder beside it: a refresh running or killed half-way
    # (the published copy is still whole: a refresh replaces it in one rename)
    VERIFIED_REFRESH_INTERRUPTED = "verified, refresh interrupted"
    REFRESH_INTERRUPTED = "refresh interrupted"
    INTERRUPTED = "interrupted"                # nothing published; a copy is being staged
                                               # (or was killed while staging)
    MISSING = "missing"                        # nothing at all

    @property
    def published(self) -> bool:
        """A complete copy is there to read."""
        return self not in (CopyState.INTERRUPTED, CopyState.MISSING)

    @property
    def verified(self) -> bool | None:
        """True: its last verification passed; False: it failed (or nothing is published);
        None: a published copy never verified."""
        if self in (CopyState.VERIFIED, CopyState.VERIFIED_REFRESH_INTERRUPTED):
            return True
        if self in (CopyState.NOT_VERIFIED, CopyState.REFRESH_INTERRUPTED):
            return None
        return False


def copy_state(dest: Path) -> tuple[CopyState, dict[str, Any] | None]:
    """The state of what is at `dest` (a DEST, or a staging folder itself), with the
    published copy's metadata (None when nothing is published)."""
    if dest.name.endswith(STAGING_SUFFIX):
        return (CopyState.INTERRUPTED if dest.is_dir() else CopyState.MISSING), None
    meta = read_metadata(dest)
    staging = staging_dir(dest).is_dir()
    if meta is None:
        return (CopyState.INTERRUPTED if staging else CopyState.MISSING), None
    if meta.get("verify_ok") is False:
        return CopyState.FAILED_VERIFICATION, meta
    verified = meta.get("verify_ok") is True and bool(meta.get("verified_at"))
    if staging:
        return (CopyState.VERIFIED_REFRESH_INTERRUPTED if verified
                else CopyState.REFRESH_INTERRUPTED), meta
    return (CopyState.VERIFIED if verified else CopyState.NOT_VERIFIED), meta


def read_metadata(dest: Path) -> dict[str, Any] | None:
    """The metadata of a complete, published hot copy at `dest`, or None."""
    if dest.name.endswith(STAGING_SUFFIX):
        return None
    try:   # never through a symlink, a FIFO or a huge file planted at the metadata's name
        meta = json.loads(beneath.read_regular(dest / METADATA, limit=METADATA_LIMIT))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not meta.get("complete"):
        return None
    if not (dest / MANIFEST).is_file():
        return None
    return meta


def metadata_at(dirfd: int) -> dict[str, Any] | None:
    """read_metadata for the folder held open as `dirfd`: read through the descriptor, so
    that what is judged is that folder, whatever its path leads to meanwhile."""
    try:
        meta = json.loads(beneath.read_file(dirfd, METADATA, limit=METADATA_LIMIT))
        manifest = os.stat(MANIFEST, dir_fd=dirfd, follow_symlinks=False)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not meta.get("complete"):
        return None
    return meta if stat.S_ISREG(manifest.st_mode) else None


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


def read_manifest(path: str | Path, dir_fd: int | None = None) -> dict[str, str]:
    """{relative path: sha256 hex} from a manifest written from `text` or by sha256sum.
    The manifest itself is never a symlink (O_NOFOLLOW); with `dir_fd`, `path` is a name
    in that folder."""
    return dict(iter_manifest(path, dir_fd))


def iter_manifest(path: str | Path, dir_fd: int | None = None) -> Iterator[tuple[str, str]]:
    """(relative path, sha256 hex) of each line of the manifest, read a line at a time
    (a manifest of millions of files is never held whole), in the file's order. Opened
    as read_manifest opens it: never through a symlink, a FIFO or a device."""
    try:
        fd = os.open(path, beneath.READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the manifest ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{path}: cannot read the manifest (not a regular file)")
        os.set_blocking(fd, True)
        for n, line in enumerate(f, 1):
            raw = os.fsdecode(line[:-1] if line.endswith(b"\n") else line)
            if not raw:
                continue
            escaped = raw.startswith("\\")
            body = raw[1:] if escaped else raw
            digest, sep, name = body.partition(" ")
            if not sep or len(digest) != 64 or not name or name[0] not in " *":
                raise UsageError(f"{path}: line {n} is not a sha256sum line: {raw[:80]!r}",
                                 hint="the copy's manifest was edited; copy it again")
            name = name[1:]
            yield (_unescape(name) if escaped else name), digest.lower()

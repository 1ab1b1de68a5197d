"""The on-disk format of a hot copy, shared by the copier (provision) and the training
adapters (which may read it, never write it). Standard library only.

A published hot copy is a directory DEST holding the copied files plus:
  SHA256SUMS           `sha256sum -c SHA256SUMS` (run inside DEST) checks every file
  .hotcache-copy.json  metadata: {"format": 1, "complete": true, "name", "version",
                       "source", "files", "bytes", "hash": "sha256", "copied_at",
                       "verified_at", "verify_ok", "tool_version"}
While a copy is being made it lives in a staging directory next to DEST (same
filesystem) named `.{DEST.name}.hotcache-staging`; a directory without a complete
metadata file (or a staging directory) is never a hot copy.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

FORMAT = 1
MANIFEST = "SHA256SUMS"
METADATA = ".hotcache-copy.json"
STAGING_SUFFIX = ".hotcache-staging"
RESERVED = {MANIFEST, METADATA}


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


def read_metadata(dest: Path) -> dict | None:
    """The metadata of a complete, published hot copy at `dest`, or None."""
    if dest.name.endswith(STAGING_SUFFIX):
        return None
    try:   # never through a symlink planted at the metadata's name
        fd = os.open(dest / METADATA, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not meta.get("complete"):
        return None
    if not (dest / MANIFEST).is_file():
        return None
    return meta

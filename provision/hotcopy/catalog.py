"""Where hot copies are known: the mapping (copies on mounts hotcache manages) and any
folder the user points at. `hotcache copies` lists both."""

from __future__ import annotations

import os
from pathlib import Path

from hotcache.provision import mapping
from hotcache.provision.hotcopy.format import METADATA, STAGING_SUFFIX, copy_state
from hotcache.provision.records import CacheEntry, HotCopy

RECORDED = ("name", "version", "files", "bytes", "copied_at", "verified_at", "verify_ok")


def backing_cache(path: Path, data: dict) -> tuple[str, CacheEntry] | None:
    """The mapping entry whose mountpoint holds `path` (the deepest one), or None."""
    real = os.path.realpath(path)
    best = None
    for name, entry in data.get("caches", {}).items():
        mp = entry.filesystem.mountpoint
        if mp and (real == mp or real.startswith(mp.rstrip("/") + "/")):
            if best is None or len(mp) > len(best[1].filesystem.mountpoint):
                best = (name, entry)
    return best


def record(dest: Path, meta: dict, state: Path | None) -> str | None:
    """Record (or update) the copy at `dest` in the mapping when DEST lies on a managed
    mount; returns the cache's name, or None when no mount of the mapping holds it."""
    path = mapping.state_path(state and str(state))
    if not path.exists() or backing_cache(dest, mapping.load(path)) is None:
        return None
    with mapping.editing(path) as data:
        found = backing_cache(dest, data)
        if found is None:
            return None
        name, entry = found
        copies = dict(entry.hot_copies or {})
        st = os.lstat(dest)
        copies[str(dest)] = HotCopy.model_validate({**{k: meta.get(k) for k in RECORDED},
                                                    "dev": st.st_dev, "inode": st.st_ino,
                                                    "uid": st.st_uid})
        entry.hot_copies = copies
        return name


def describe(dest: Path, cache: str | None = None) -> dict:
    state, meta = copy_state(dest)
    row = {"path": str(dest), "cache": cache, "state": state.value}
    row.update({k: (meta or {}).get(k) for k in RECORDED})
    return row


def find(roots: list[Path], state: Path | None) -> list[dict]:
    """Every hot copy recorded in the mapping, plus those found at or one level under
    each root (a root is usually the SSD mount)."""
    rows: dict[str, dict] = {}
    path = mapping.state_path(state and str(state))
    if path.exists():
        for cache, entry in mapping.load(path).get("caches", {}).items():
            for dest in (entry.hot_copies or {}):
                rows[dest] = describe(Path(dest), cache)
    data = mapping.load(path) if path.exists() else mapping.empty()
    for root in roots:
        candidates = [root] + sorted(p for p in root.iterdir() if p.is_dir()) \
            if root.is_dir() else []
        for c in candidates:
            if c.name.endswith(STAGING_SUFFIX):
                dest = c.parent / c.name[1:-len(STAGING_SUFFIX)]
                if not dest.exists() and str(dest) not in rows:
                    rows[str(dest)] = describe(dest)
            elif (c / METADATA).exists() and str(c) not in rows:
                found = backing_cache(c, data)
                rows[str(c)] = describe(c, found[0] if found else None)
    return sorted(rows.values(), key=lambda r: r["path"])


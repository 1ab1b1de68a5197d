"""Where hot copies are known: the mapping (copies on mounts hotcache manages) and any
folder the user points at. `hotcache copies` lists both."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hotcache.provision import mapping
from hotcache.provision.errors import HotcacheError
from hotcache.provision.hotcopy.format import METADATA, STAGING_SUFFIX, copy_state
from hotcache.provision.records import CacheEntry, HotCopy
from hotcache.provision.system.clock import now

ASIDES = "asides"      # the mapping's key: folders hotcache renamed aside, by identity
RECORDED = ("name", "version", "files", "bytes", "copied_at", "verified_at", "verify_ok")


def backing_cache(path: Path, data: dict[str, Any]) -> tuple[str, CacheEntry] | None:
    """The mapping entry whose mountpoint holds `path` (the deepest one), or None."""
    real = os.path.realpath(path)
    best = None
    for name, entry in data.get("caches", {}).items():
        mp = entry.filesystem.mountpoint
        if mp and (real == mp or real.startswith(mp.rstrip("/") + "/")):
            if best is None or len(mp) > len(best[1].filesystem.mountpoint):
                best = (name, entry)
    return best


def record(dest: Path, meta: dict[str, Any], state: Path | None, st: os.stat_result) -> str | None:
    """Record (or re-record) the copy hotcache just published at `dest`, identified by
    `st`, the fstat of the folder it holds open (never what the path leads to now: a
    member may have swapped another folder in since), when DEST lies on a managed mount;
    returns the cache's name, or None when no mount of the mapping holds it."""
    path = mapping.state_path(state and str(state))
    if not path.exists() or backing_cache(dest, mapping.load(path)) is None:
        return None
    with mapping.editing(path) as data:
        found = backing_cache(dest, data)
        if found is None:
            return None
        name, entry = found
        copies = dict(entry.hot_copies or {})
        copies[str(dest)] = HotCopy.model_validate({**{k: meta.get(k) for k in RECORDED},
                                                    "dev": st.st_dev, "inode": st.st_ino,
                                                    "uid": st.st_uid})
        entry.hot_copies = copies
        return name


def update(dest: Path, meta: dict[str, Any], state: Path | None, st: os.stat_result) -> bool:
    """A verification's outcome into the record of the copy at `dest`, only when one
    exists and is this very folder (`st`: the fstat of the folder verified, same device,
    inode and owner). Verifying never creates a record nor points one at another folder:
    a folder hotcache did not make stays unrecorded, whatever its metadata says."""
    path = mapping.state_path(state and str(state))
    if not path.exists():
        return False
    with mapping.editing(path) as data:
        found = backing_cache(dest, data)
        old = (found[1].hot_copies or {}).get(str(dest)) if found else None
        if found is None or old is None or \
                (old.dev, old.inode, old.uid) != (st.st_dev, st.st_ino, st.st_uid):
            return False
        entry = found[1]
        copies = dict(entry.hot_copies or {})
        kept = {k: getattr(old, k) for k in ("name", "version", "files", "bytes", "copied_at")}
        copies[str(dest)] = HotCopy.model_validate({
            **kept, "verified_at": meta.get("verified_at"), "verify_ok": meta.get("verify_ok"),
            "dev": st.st_dev, "inode": st.st_ino, "uid": st.st_uid})
        entry.hot_copies = copies
        return True


def describe(dest: Path, cache: str | None = None) -> dict[str, Any]:
    state, meta = copy_state(dest)
    row: dict[str, Any] = {"path": str(dest), "cache": cache, "state": state.value}
    row.update({k: (meta or {}).get(k) for k in RECORDED})
    return row


def find(roots: list[Path], state: Path | None) -> list[dict[str, Any]]:
    """Every hot copy recorded in the mapping, plus those found at or one level under
    each root (a root is usually the SSD mount)."""
    rows: dict[str, dict[str, Any]] = {}
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


def record_aside(aside: Path, st: os.stat_result, state: Path | None) -> bool:
    """Note, before hotcache renames a folder to `aside`, that the folder with this
    device, inode and owner at `aside` is hotcache's: prune deletes a `.hotcache-old` or
    `.hotcache-pruning` folder only when it is recorded here. Without a mapping file
    nothing is recorded (False), and neither when the mapping cannot be written (an
    account other than its owner): such a leftover is then only reported, never deleted."""
    path = mapping.state_path(state and str(state))
    if not path.exists():
        return False
    try:
        with mapping.editing(path) as data:
            asides = dict(data.get(ASIDES) or {})
            asides[str(aside)] = {"dev": st.st_dev, "inode": st.st_ino, "uid": st.st_uid,
                                  "at": now()}
            data[ASIDES] = asides
    except (HotcacheError, OSError):
        return False
    return True


def drop_aside(aside: Path, state: Path | None) -> None:
    """Forget an aside folder once it is gone."""
    path = mapping.state_path(state and str(state))
    if not path.exists() or str(aside) not in recorded_asides(state):
        return
    with mapping.editing(path) as data:
        asides = dict(data.get(ASIDES) or {})
        asides.pop(str(aside), None)
        if asides:
            data[ASIDES] = asides
        else:
            data.pop(ASIDES, None)


def drop_stale_asides(state: Path | None) -> None:
    """Forget each recorded aside folder that is no longer at its path (removed by hand,
    say), so that a later folder reusing its inode number is never taken for it."""
    for where, ident in recorded_asides(state).items():
        try:
            st = os.lstat(where)
        except FileNotFoundError:
            st = None
        except OSError:
            continue
        if st is None or (st.st_dev, st.st_ino, st.st_uid) != ident:
            drop_aside(Path(where), state)


def recorded_asides(state: Path | None) -> dict[str, tuple[int, int, int]]:
    """path -> (dev, inode, uid) of each folder hotcache recorded before renaming it
    aside; a malformed record is left out (that folder is then only reported)."""
    path = mapping.state_path(state and str(state))
    if not path.exists():
        return {}
    out = {}
    raw = mapping.load(path).get(ASIDES) or {}
    for where, rec in (raw.items() if isinstance(raw, dict) else []):
        if isinstance(rec, dict) and all(isinstance(rec.get(k), int)
                                         for k in ("dev", "inode", "uid")):
            out[str(where)] = (rec["dev"], rec["inode"], rec["uid"])
    return out

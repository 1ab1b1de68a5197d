"""`hotcache status` for an account that is not root: what the records say.

Device probes (blkid, the cache's statistics) need root, and a training account asking
"is the cache up, which copies can I use?" should get an answer, not a probe error. This
view reads only what any account may read: the mapping (world-readable), the mount
table, `statvfs` of each mountpoint, and the verified-copies index root wrote, each
entry checked against the live folder (verified_index.offered). It says plainly that it
is the records' view, and when root last wrote the index.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from hotcache.provision import mapping
from hotcache.provision.observe import verified_index
from hotcache.provision.system import mountinfo

NOTE = ("not root: device probes need root, so this is what the records say (the "
        "mapping, the mount table and the verified-copies index root wrote); "
        "`sudo hotcache status` checks the devices")


class CacheView(TypedDict):
    """One cache as the records say, with its filesystem's mount and sizes now."""
    name: str
    backend: str
    mode: str | None
    recorded_state: str
    mountpoint: str
    mounted: bool
    noatime: bool
    size_bytes: int | None          # None: not mounted, or statvfs failed
    free_bytes: int | None
    verified_copies: list[dict[str, Any]]   # the index's entries, as root wrote them


class RecordsView(TypedDict):
    """`hotcache status` for an account that is not root."""
    state: str
    privileged: bool
    note: str
    caches: list[CacheView]
    index: str
    index_notes: list[str]


def view(state: Path, name: str | None = None) -> RecordsView:
    """The records' view of every cache (or `name`), with its verified hot copies."""
    data = mapping.load(state)
    mounts = mountinfo.read()
    copies, notes = verified_index.offered(state)
    rows: list[CacheView] = []
    for cache, entry in data["caches"].items():
        if name is not None and cache != name:
            continue
        mp = entry.filesystem.mountpoint
        mount = next((m for m in reversed(mounts) if m.mountpoint == mp), None)
        row: CacheView = {
            "name": cache, "backend": entry.backend, "mode": entry.mode,
            "recorded_state": str(entry.state), "mountpoint": mp,
            "mounted": mount is not None,
            "noatime": bool(mount and "noatime" in mount.options),
            "size_bytes": None, "free_bytes": None,
            "verified_copies": [{k: c.get(k) for k in ("name", "version", "path",
                                                       "verified_at", "partial")}
                                for c in copies if c.get("cache") == cache]}
        if mount is not None:
            try:
                st = os.statvfs(mp)
                row["size_bytes"] = st.f_blocks * st.f_frsize
                row["free_bytes"] = st.f_bavail * st.f_frsize
            except OSError:
                pass
        rows.append(row)
    return {"state": str(state), "privileged": False, "note": NOTE, "caches": rows,
            "index": str(verified_index.path_for(state)),
            "index_notes": [text if who is None else f"{who}: {text}" for who, text in notes]}

"""The verified-copies index: what root has proven, for the accounts that cannot probe.

Slurm runs a TaskProlog as the job's user, and a training account cannot open the block
devices, so neither can ask them whether a cache is up. Root can: whenever a root run
learns what is true (`status` and the metrics timer, `copy`, `verify`, `prune`, `apply`,
`restore`, `teardown`), it writes what it found to one world-readable file beside the
mapping, `verified-copies.json`: each hot copy on a cache that is up, complete and whose
last verification passed, with the folder's device, inode and owner, its mountpoint and
the device mounted there, and the copy's verified_at.

A reader (any account) checks each entry against the live folder with a few `stat`
calls, one read of /proc/self/mountinfo and one read of the copy's metadata, never a
device probe: the same folder (device, inode, owner), its mountpoint mounted from the
same device, and the copy's metadata still saying that same verification passed. An
entry that fails any of these is stale and is not offered; a missing or unreadable index
offers nothing. The checks run in a thread with a time limit, so a dead device that makes
`stat` hang costs the caller that limit, never the job.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from hotcache.provision.errors import HotcacheError
from hotcache.provision.hotcopy.format import read_metadata
from hotcache.provision.system import beneath, mountinfo
from hotcache.provision.system.clock import now

if TYPE_CHECKING:
    from hotcache.provision.engine.statusrow import StatusRow
    from hotcache.provision.observe.metrics import Version
    from hotcache.provision.observe.nodelabels import UpCopy
    from hotcache.provision.records import CacheEntry
    from hotcache.provision.system.runner import Runner

NAME = "verified-copies.json"
KIND = "hotcache-verified-copies"
FORMAT = 1
LIMIT = 4 * 2**20          # a few hundred bytes a copy; a bigger file is not ours
CHECK_SECONDS = 2.0        # the most a reader waits for the live checks (a dead device)


class Entry(TypedDict):
    name: str
    version: Version
    path: str
    cache: str
    backend: str | None
    mountpoint: str
    mount_dev: str          # major:minor of the filesystem holding the copy
    dev: int
    inode: int
    uid: int
    verified_at: str
    verify_mode: str | None
    partial: bool
    source: str | None


def path_for(state: Path) -> Path:
    """The index beside the mapping (/etc/hotcache/verified-copies.json by default)."""
    return Path(state).with_name(NAME)


def entries(rows: list[StatusRow], caches: dict[str, CacheEntry],
            listed: list[UpCopy] | None = None) -> list[Entry]:
    """An entry for each copy `nodelabels.verified_copies` counts (on a cache that is up,
    recorded by hotcache and still that folder, last verification passed), described as
    the folder is now. `listed`: `nodelabels.up_copies`, when the caller has it."""
    # root's side, kept out of the TaskProlog's start-up (it imports this module to read)
    from hotcache.provision.observe.nodelabels import verified_copies

    out: list[Entry] = []
    for copy in verified_copies(rows, caches, listed):
        where = Path(copy["path"])
        meta = read_metadata(where)
        try:
            st = os.lstat(where)
        except OSError:
            continue
        record = (caches[copy["cache"]].hot_copies or {}).get(copy["path"])
        if record is not None and record.inode is not None and \
                (st.st_dev, st.st_ino, st.st_uid) != (record.dev, record.inode, record.uid):
            continue    # swapped since verified_copies looked: never index what is there now
        if meta is None or meta.get("verify_ok") is not True or not stat.S_ISDIR(st.st_mode):
            continue
        mountpoint = caches[copy["cache"]].filesystem.mountpoint
        out.append(Entry(name=str(copy["name"]), version=copy["version"], path=str(where),
                         cache=copy["cache"], backend=copy.get("backend"),
                         mountpoint=mountpoint,
                         mount_dev=f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}",
                         dev=st.st_dev, inode=st.st_ino, uid=st.st_uid,
                         verified_at=str(meta.get("verified_at")),
                         verify_mode=meta.get("verify_mode"),
                         partial=bool(meta.get("partial")), source=meta.get("source")))
    return sorted(out, key=lambda e: e["path"])


class Unverified(TypedDict):
    """A hot copy on a cache that is up which jobs are not offered, and why."""
    name: str
    version: Version
    path: str
    state: str


def unverified(rows: list[StatusRow], caches: dict[str, CacheEntry],
               listed: list[UpCopy] | None = None) -> list[Unverified]:
    """The other hot copies on caches that are up, with what they lack (failed
    verification, never verified, not recorded by hotcache): a job that asks for one
    is told why it gets no DATA_ROOT. `listed`: `nodelabels.up_copies`, when the caller
    has it."""
    # root's side, kept out of the TaskProlog's start-up (it imports this module to read)
    from hotcache.provision.observe.nodelabels import up_copies

    out: list[Unverified] = []
    for copy in up_copies(rows, caches) if listed is None else listed:
        if not copy["verified"]:
            state = str(copy["state"]) if copy["recorded"] or not copy["present"] \
                else "not recorded by hotcache"
            out.append({"name": str(copy["name"]), "version": copy["version"],
                        "path": copy["path"], "state": state})
    return sorted(out, key=lambda c: c["path"])


def write(state: Path, rows: list[StatusRow], caches: dict[str, CacheEntry]) -> Path | None:
    """Write the index (root only: nobody else's findings count); returns its path, or
    None when this account is not root."""
    if os.geteuid() != 0:
        return None
    # root's side, kept out of the TaskProlog's start-up (it imports this module to read)
    from hotcache.provision.observe.nodelabels import up_copies
    from hotcache.provision.system.atomic import write_atomic

    listed = up_copies(rows, caches)        # each copy's metadata read once for both lists
    doc = {"kind": KIND, "format": FORMAT, "written_at": now(),
           "copies": entries(rows, caches, listed), "unverified": unverified(rows, caches, listed)}
    target = path_for(state)
    write_atomic(target, json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o644)
    return target


def clear(state: Path) -> None:
    """An index that offers nothing (root could not find out what is true: a failed
    probe). A job then gets no DATA_ROOT rather than one nobody proved."""
    if os.geteuid() != 0:
        return
    # root's side, kept out of the TaskProlog's start-up (it imports this module to read)
    from hotcache.provision.system.atomic import write_atomic

    doc = {"kind": KIND, "format": FORMAT, "written_at": now(), "copies": []}
    write_atomic(path_for(state), json.dumps(doc, indent=1) + "\n", mode=0o644)


def read(state: Path) -> tuple[list[dict[str, Any]] | None, str]:
    """The index's entries, or None and why there are none to read."""
    where = path_for(state)
    try:
        doc = json.loads(beneath.read_regular(where, limit=LIMIT))
    except FileNotFoundError:
        return None, (f"no index of verified copies at {where} (root writes it: "
                      "`hotcache status`, the metrics timer, `copy`, `verify`)")
    except (OSError, ValueError) as exc:
        return None, f"the index {where} cannot be read ({exc})"
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("format") != FORMAT \
            or not isinstance(doc.get("copies"), list):
        return None, f"{where} is not an index hotcache writes"
    found: list[dict[str, Any]] = [e for e in doc["copies"] if isinstance(e, dict)]
    others = doc.get("unverified")
    for o in others if isinstance(others, list) else []:   # what root found wrong with the others, as notes on them
        if isinstance(o, dict):
            found.append({"name": o.get("name"), "path": o.get("path"),
                          "unverified": str(o.get("state"))})
    return found, ""


def stale(entry: dict[str, Any], mounts: list[mountinfo.Mount]) -> str | None:
    """Why `entry` no longer holds (None: it does), from stat, mountinfo and metadata."""
    path = entry.get("path")
    if not isinstance(path, str) or not os.path.isabs(path):
        return "the index entry names no folder"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be looked at ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode) or \
            (st.st_dev, st.st_ino, st.st_uid) != (entry.get("dev"), entry.get("inode"),
                                                  entry.get("uid")):
        return f"{path} is not the folder root verified (replaced since)"
    mp = entry.get("mountpoint")
    mount = next((m for m in reversed(mounts) if m.mountpoint == mp), None)
    if mount is None:
        return f"{mp} is not mounted"
    if mount.source_dev != entry.get("mount_dev") or \
            f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}" != mount.source_dev:
        return f"{mp} is not mounted from the device root recorded"
    meta = read_metadata(Path(path))
    if meta is None:
        return f"{path} holds no complete hot copy now"
    if meta.get("verify_ok") is not True:
        return f"the last verification of {path} did not pass"
    if str(meta.get("verified_at")) != entry.get("verified_at"):
        return f"{path} was verified again since the index was written"
    return None


Note = tuple[str | None, str]


def offered(state: Path, limit: float = CHECK_SECONDS) -> tuple[list[dict[str, Any]], list[Note]]:
    """The index's entries that still hold, and a note (dataset name, why) for each one
    that does not, or (None, why) for an index that cannot be read or did not answer.
    Never longer than about `limit` seconds."""
    result: dict[str, tuple[list[dict[str, Any]], list[Note]]] = {}

    def check() -> None:
        found, why = read(state)
        if found is None:
            result["out"] = ([], [(None, why)])
            return
        try:
            mounts = mountinfo.read()
        except OSError as exc:
            result["out"] = ([], [(None, f"the mount table cannot be read ({exc.strerror})")])
            return
        good: list[dict[str, Any]] = []
        notes: list[Note] = []
        for entry in found:
            if "unverified" in entry:
                notes.append((str(entry.get("name")), f"its copy at {entry.get('path')}: "
                              f"{entry['unverified']} (when root last looked)"))
                continue
            reason = stale(entry, mounts)
            if reason is None:
                good.append(entry)
            else:
                notes.append((str(entry.get("name")), reason))
        result["out"] = (good, notes)

    worker = threading.Thread(target=check, name="hotcache-index", daemon=True)
    worker.start()
    worker.join(limit)
    if "out" not in result:
        return [], [(None, f"the hot copies did not answer within {limit:g} s (a failed "
                           "device?)")]
    return result["out"]


def refresh(state: Path, fstab: Path | None = None, runner: Runner | None = None) -> str | None:
    """Root, after a command changed what is true: probe the host and rewrite the index.
    Returns a warning when it could not (the index is then emptied: a job gets no
    DATA_ROOT rather than one nobody proved); None otherwise, and for other accounts."""
    if os.geteuid() != 0 or not Path(state).exists():
        return None
    # root's side, kept out of the TaskProlog's start-up (it imports this module to read):
    # the mapping's pydantic models, the host probe
    from hotcache.provision import mapping
    from hotcache.provision.engine.status import host_status
    from hotcache.provision.system.runner import Runner

    try:
        caches = mapping.load(state)["caches"]
        write(state, host_status(state, fstab, runner or Runner(), None), caches)
        return None
    except (HotcacheError, OSError) as exc:
        try:
            clear(state)
        except OSError:
            pass
        first = str(exc).splitlines()[0]
        return (f"the verified-copies index was emptied: the host could not be checked "
                f"({first}); jobs get no DATA_ROOT until `hotcache status` runs as root")

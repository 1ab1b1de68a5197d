"""`hotcache prune`: remove what the fast tier no longer needs.

What it finds, under the mapping's mountpoints and the folders given:
- old versions of a hot copy (copies with the same name) beyond the newest `keep`;
- leftovers of a refresh (`.X.hotcache-old`) and abandoned staging folders (no copy holds
  their lock, untouched for `staging_hours`): an interrupted copy resumes from its
  staging folder, so a recent one is kept;
- hot copies whose source is gone (its folder exists, the dataset in it does not: an
  unmounted array is not "gone");
- tf.data cache folders (`--tf-cache DIR`) whose key is not in a list of current keys, or
  that no pipeline used for `older_than_days`.

Only folders owned by the account running prune are candidates: on a shared,
group-writable tier anyone can name a folder `.x.hotcache-old` or plant a copy with a
later `copied_at`, and neither may make root delete something that is not its own.
Nor can a member rename root's own copy to such a name: a folder whose inode the
mapping records as a hot copy is a candidate only at the path recorded for it.
Root's own folders carry hotcache's names only where hotcache put them: a refresh or
prune records a folder's device, inode and owner at its aside name in the mapping
before the rename, and a `.X.hotcache-old` or `.X.hotcache-pruning` folder is deleted
only when it is that recorded folder; a staging folder only when it holds the header
hotcache wrote naming the DEST whose staging folder sits at this path. Anything else
with such a name is reported as "not hotcache's" and kept. The header is read from
the folder's descriptor, checked to be the inode prune looked at; a record whose folder
is gone from its path is forgotten at the next `prune --yes`, so that a later folder
given the same inode number is never taken for it.

A dry run by default. Nothing a process holds open (cwd, open file, mapping: the check
`teardown` uses) is touched. Deletion never follows a symlink: each candidate is reached
from `/` one component at a time with O_NOFOLLOW, checked to be the very folder that
was listed (device and inode), renamed aside in one step (readers never see half a
copy) and removed through directory descriptors (beneath.empty), which follow no links.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from dataclasses import asdict, dataclass
from functools import partial
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hotcache.provision import mapping
from hotcache.provision.block.busy import users_of
from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy.catalog import drop_aside, record_aside
from hotcache.provision.hotcopy.format import METADATA, STAGING_SUFFIX, metadata_at
from hotcache.provision.hotcopy.staging import made_here
from hotcache.provision.system import beneath

OLD_SUFFIX = ".hotcache-old"
PRUNING_SUFFIX = ".hotcache-pruning"


@dataclass
class Candidate:
    kind: str          # old-version | refresh-leftover | staging | source-gone | tf-cache
    path: str
    bytes: int
    why: str
    dev: int = 0
    ino: int = 0
    busy: str | None = None   # who holds it open: then it is kept
    kept: str | None = None   # why it is only reported, never deleted

    def to_dict(self) -> dict[str, str | int | None]:
        d = asdict(self)
        d.pop("dev"), d.pop("ino")
        return d


def tree_bytes(path: Path, seen: set[tuple[int, int]]) -> int:
    """Bytes on disk of the files under `path` (each inode once, links not followed).
    Only an inode with more than one name can be met twice, so only those go into
    `seen`: a copy of millions of files keeps no entry per file."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames + dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if st.st_nlink == 1 and not stat.S_ISDIR(st.st_mode):
                total += st.st_blocks * 512
            elif (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _children(root: Path, depth: int = 2) -> Iterator[Path]:
    """Folders at most `depth` levels below root, not descending into hot copies."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if not e.is_dir(follow_symlinks=False):
            continue
        path = Path(e.path)
        yield path
        if depth > 1 and not (path / METADATA).exists() and not e.name.endswith(
                (STAGING_SUFFIX, OLD_SUFFIX, PRUNING_SUFFIX)):
            yield from _children(path, depth - 1)


def _unlocked(folder: Path) -> bool:
    """True when no copy holds the staging folder's lock (staging.py flocks it)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _newest_mtime(folder: Path) -> float:
    newest = os.lstat(folder).st_mtime
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                pass
    return newest


def _source_gone(source: str | None) -> bool:
    """The dataset folder is gone from a folder that is there and holds other things
    (an array that is not mounted leaves an empty mountpoint: that is not 'gone')."""
    if not source or os.path.lexists(source):
        return False
    parent = Path(source).parent
    try:
        return parent.is_dir() and any(parent.iterdir())
    except OSError:
        return False


def _version_key(meta: dict[str, Any]) -> tuple[str, int, str]:
    v = str(meta.get("version", ""))
    return (str(meta.get("copied_at") or ""), int(v) if v.isdigit() else -1, v)


_Version = tuple[dict[str, Any], Path, os.stat_result]   # a copy's metadata, its folder, its lstat
_Versions = dict[str, list[_Version]]


def find(roots: list[Path], *, keep: int, staging_hours: float, tf_caches: list[Path],
         keep_keys: set[str] | None, older_than_days: float | None,
         now: float | None = None,
         recorded: dict[tuple[int, int], str] | None = None,
         asides: dict[str, tuple[int, int, int]] | None = None) -> list[Candidate]:
    """`recorded`: (st_dev, st_ino) -> path of every hot copy the mapping records
    (recorded_copies); `asides`: path -> (st_dev, st_ino, st_uid) of every folder
    hotcache recorded before renaming it aside (catalog.recorded_asides)."""
    if keep < 1:
        raise UsageError(f"--keep {keep}: keep at least 1 version of each copy")
    now = time.time() if now is None else now
    found = _Found()
    copies: _Versions = {}
    me = os.geteuid()
    for root in roots:
        for folder in _children(root):
            try:
                st = os.lstat(folder)
            except OSError:
                continue
            if _considered(folder, st, me, recorded or {}):
                _judge_folder(found, copies, folder, st, now=now, staging_hours=staging_hours,
                              asides=asides or {})
    _judge_copies(found, copies, keep)
    for cache_dir in tf_caches:
        _judge_tf_caches(found, cache_dir, keep_keys, older_than_days, now)
    _mark_busy(found.candidates)
    return found.candidates


class _Found:
    """The candidates found so far, each with its size (an inode met twice counted once)."""

    def __init__(self) -> None:
        self.candidates: list[Candidate] = []
        self._seen: set[tuple[int, int]] = set()

    def add(self, kind: str, path: Path, why: str, kept: str | None = None,
            st: os.stat_result | None = None) -> None:
        # `st`: the inode the decision was made about, so that the candidate is that one
        st = st or os.lstat(path)
        self.candidates.append(Candidate(kind, str(path), tree_bytes(path, self._seen), why,
                                         st.st_dev, st.st_ino, kept=kept))


def _considered(folder: Path, st: os.stat_result, me: int,
                recorded: dict[tuple[int, int], str]) -> bool:
    """Whether a listed folder may be a candidate at all: never a recorded copy someone
    renamed (it is not a leftover), and only what this account owns. In a group-writable
    folder anyone can give their own (or another member's) folder a hotcache name, or
    plant a "newer version"."""
    moved = recorded.get((st.st_dev, st.st_ino), str(folder)) != str(folder)
    return not moved and st.st_uid == me


def _judge_folder(found: _Found, copies: _Versions, folder: Path, st: os.stat_result, *,
                  now: float, staging_hours: float,
                  asides: dict[str, tuple[int, int, int]]) -> None:
    """One folder by its name: an abandoned staging folder or a refresh leftover goes
    into `found`; a hot copy into `copies`, to be judged among its versions."""
    name = folder.name
    if name.endswith(STAGING_SUFFIX):
        idle = (now - _newest_mtime(folder)) / 3600
        if idle < staging_hours or not _unlocked(folder):
            return
        if made_here(folder, st):
            found.add("staging", folder, f"an interrupted copy, untouched for {idle:.0f} h "
                                         "and not locked by a running copy", st=st)
        else:
            found.add("staging", folder, "named like an interrupted copy",
                      kept="not hotcache's (no header naming this place as its DEST)")
    elif name.endswith((OLD_SUFFIX, PRUNING_SUFFIX)):
        if _recorded_aside(folder, st, asides):
            found.add("refresh-leftover", folder,
                      "the old tree a refresh or prune left behind", st=st)
        else:
            found.add("refresh-leftover", folder, "named like a refresh leftover",
                      kept="not hotcache's (not recorded)")
    elif (meta := _metadata_of(folder, st)) is not None:
        copies.setdefault(str(meta.get("name")), []).append((meta, folder, st))


def _recorded_aside(folder: Path, st: os.stat_result,
                    asides: dict[str, tuple[int, int, int]]) -> bool:
    """Whether a folder with a refresh or prune leftover's name is the one hotcache
    recorded at this path before renaming it aside. The name proves nothing: anyone who
    can write here can give a folder it, and root's own folders can be renamed to it."""
    return asides.get(str(folder)) == (st.st_dev, st.st_ino, st.st_uid)


def _judge_copies(found: _Found, copies: _Versions, keep: int) -> None:
    """Each hot copy's versions, newest first, by _copy_verdict (copies in name order)."""
    for name, versions in sorted(copies.items()):
        for rank, (meta, folder, st) in enumerate(_newest_first(versions)):
            verdict = _copy_verdict(name, rank, meta, keep)
            if verdict:
                kind, why = verdict
                found.add(kind, folder, why, st=st)


def _newest_first(versions: list[_Version]) -> list[_Version]:
    """The versions of one copy, newest first (as _version_key orders them)."""
    return sorted(versions, key=lambda mv: _version_key(mv[0]), reverse=True)


def _copy_verdict(name: str, rank: int, meta: dict[str, Any], keep: int,
                  source_gone: Callable[[str | None], bool] | None = None
                  ) -> tuple[str, str] | None:
    """(kind, why) when the version at `rank` (0: the newest) of copy `name` goes: beyond
    the newest `keep`, or its source is gone; None when it stays."""
    if rank >= keep:
        return "old-version", (f"{name} version {meta.get('version')}: "
                               f"{rank} newer version(s) kept (--keep {keep})")
    if (source_gone or _source_gone)(meta.get("source")):
        return "source-gone", f"its source {meta.get('source')} is gone"
    return None


def _judge_tf_caches(found: _Found, cache_dir: Path, keep_keys: set[str] | None,
                     older_than_days: float | None, now: float) -> None:
    """The key folders of one tf.data cache folder, by _tf_cache_why; a folder a pipeline
    is writing is never a candidate."""
    for folder in _tf_cache_folders(cache_dir):
        if any(folder.glob("cache_*.lockfile")):
            continue                      # a pipeline is writing it (tfcache.py)
        stale = _tf_cache_why(folder.name, keep_keys, older_than_days,
                              partial(_idle_days, folder, now))
        if stale:
            found.add("tf-cache", folder, stale)


def _tf_cache_folders(cache_dir: Path) -> list[Path]:
    """The key folders of a tf.data cache folder, in name order (links not followed)."""
    if not cache_dir.is_dir():
        return []
    return sorted(p for p in cache_dir.iterdir() if p.is_dir() and not p.is_symlink())


def _tf_cache_why(key: str, keep_keys: set[str] | None, older_than_days: float | None,
                  idle_days: Callable[[], float]) -> str | None:
    """Why a tf.data cache folder goes, or None: its key is not one to keep, or no
    pipeline used it for `older_than_days` (`idle_days` reads that only when asked)."""
    if keep_keys is not None and key not in keep_keys:
        return "its key is not in the --keep-keys list"
    if older_than_days is not None and (idle := idle_days()) >= older_than_days:
        return f"no pipeline used it for {idle:.0f} days"
    return None


def _idle_days(folder: Path, now: float) -> float:
    return (now - _newest_mtime(folder)) / 86400


def _mark_busy(found: list[Candidate]) -> None:
    """Name who holds each candidate open (then it is kept); a candidate only reported
    is never checked."""
    for c in found:
        if c.kept:
            continue
        users = users_of(c.path)
        c.busy = "; ".join(users) if users else None


def _metadata_of(folder: Path, st: os.stat_result) -> dict[str, Any] | None:
    """The hot-copy metadata of the folder listed as `st`, read through a descriptor of
    that very folder: anyone who can write to its parent can point the path at another
    folder (with a forged `source`) between the listing and the read."""
    try:
        fd = _open_dir_nofollow(folder)
    except OSError:
        return None
    try:
        return metadata_at(fd) if beneath.same(os.fstat(fd), st) else None
    finally:
        os.close(fd)


def _open_dir_nofollow(path: Path) -> int:
    """A directory fd for `path`, reached from / with O_NOFOLLOW at every component."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in path.parts[1:]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove(c: Candidate, state: Path | None = None) -> None:
    """Delete one listed folder: the same inode that was listed, recorded in the mapping
    at its aside name, renamed aside, removed through directory fds (symlinks inside are
    removed, never followed), and its records dropped."""
    if c.kept:
        raise UsageError(f"{c.path} is {c.kept}; it is never deleted")
    path = Path(c.path)
    parent = _open_dir_nofollow(path.parent)
    try:
        st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != (c.dev, c.ino):
            raise UsageError(f"{path} changed since it was listed; nothing removed there",
                             hint="run `hotcache prune` again to list what is there now")
        aside = path.name if path.name.endswith(PRUNING_SUFFIX) else \
            f".{path.name.lstrip('.')}{PRUNING_SUFFIX}"
        if aside != path.name:
            # recorded first: if the removal stops half way, the next prune knows the
            # folder at the aside name as its own (without a mapping it only reports it)
            record_aside(path.parent / aside, st, state)
            os.rename(path.name, aside, src_dir_fd=parent, dst_dir_fd=parent)
        # through descriptors (shutil.rmtree takes dir_fd only from Python 3.11)
        folder = beneath.open_at(parent, aside, os.O_RDONLY | os.O_DIRECTORY)
        try:
            now_st = os.fstat(folder)
            if (now_st.st_dev, now_st.st_ino) != (c.dev, c.ino):
                # something else was put at the aside name after the rename
                raise UsageError(f"{path.parent / aside} is not the folder that was listed; "
                                 "nothing removed there",
                                 hint="make sure nobody else writes there; run again")
            beneath.empty(folder)
        finally:
            os.close(folder)
        os.rmdir(aside, dir_fd=parent)
        os.fsync(parent)
    finally:
        os.close(parent)
    drop_aside(path.parent / aside, state)
    if aside != path.name:
        drop_aside(path, state)


def recorded_copies(state: Path | None) -> dict[tuple[int, int], str]:
    """(st_dev, st_ino) -> path of each hot copy the mapping records with its inode."""
    path = mapping.state_path(state and str(state))
    if not path.exists():
        return {}
    out = {}
    for entry in mapping.load(path).get("caches", {}).values():
        for where, copy in (entry.hot_copies or {}).items():
            if copy.inode is not None and copy.dev is not None:
                out[(copy.dev, copy.inode)] = where
    return out


def roots_from_mapping(state: Path | None) -> list[Path]:
    path = mapping.state_path(state and str(state))
    if not path.exists():
        return []
    out = []
    for entry in mapping.load(path).get("caches", {}).values():
        mp = entry.filesystem.mountpoint
        if mp and os.path.ismount(mp):
            out.append(Path(mp))
    return out

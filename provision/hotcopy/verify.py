"""`hotcache verify`: is the hot copy still exactly what was copied?

fast    every manifest file is there, is a regular file, nothing extra, total bytes
        match, and each file's mtime is the one the copy recorded (.hotcache-mtimes): a
        file rewritten in place at the same size is caught without hashing
sample  fast, plus the sha256 of N files picked at random
full    fast, plus the sha256 of every file (in parallel threads)

The result (verified_at, verify_ok) goes into the copy's metadata and the mapping. A
weaker check never clears what a stronger one found: after a failed `full` (or
`sample`), a passing `fast` leaves the copy failed, until a `full` pass or a refresh
(`hotcache copy`). Any passing check of a copy not failed by a stronger one gives
"verified" (node labels, Slurm features, the TaskProlog's DATA_ROOT).

The inode change time is not compared: a refresh links unchanged files into the new
version and later removes the old one, and both change the shared files' ctime.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import stat
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any, TypedDict

from hotcache.provision.hotcopy import manifest
from hotcache.provision.system import beneath
from hotcache.provision.errors import HotcacheError, UsageError
from hotcache.provision.hotcopy.filecopy import default_jobs
from hotcache.provision.hotcopy.format import (MANIFEST, METADATA, MTIMES, RESERVED,
                                               STAGING_SUFFIX, read_metadata)
from hotcache.provision.system.clock import now
from hotcache.provision.system.chunks import CHUNK, sha256_of
from hotcache.provision.system.meter import NullMeter

WINDOW = 64    # files in flight per thread


class Problem(TypedDict):
    """A file (or "." for the whole copy) that is not as it was copied, and how."""
    path: str
    problem: str


class Report(TypedDict):
    """What `verify` found, as `hotcache verify --json` prints it."""
    path: str
    name: Any                   # name and version as the copy's metadata holds them
    version: Any
    mode: str
    files: int                  # in the manifest
    bytes: int                  # found in DEST
    hashed_files: int
    ok: bool
    problems: list[Problem]
    verified_at: str
    mtimes_checked: bool
    recorded: bool              # stored in the copy's metadata


def sha256_file(root_fd: int, rel: str, meter: NullMeter, evict: bool = False) -> str:
    """The sha256 of `rel` beneath the folder `root_fd` (no symlink followed anywhere on
    the way). With `evict`, its cached pages are dropped first so the bytes come from the
    device, not from what the page cache remembers of the write."""
    fd = beneath.open_at(root_fd, rel, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        if evict:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return sha256_of(fd, memoryview(bytearray(CHUNK)), meter.advance)
    finally:
        os.close(fd)


def hash_files(root_fd: int, pairs: Iterable[tuple[str, str]], jobs: int,
               meter: NullMeter, evict: bool = False) -> list[Problem]:
    """Hash each (path, expected sha256) beneath the folder `root_fd` in parallel threads;
    a problem for each that differs. The pairs are taken a window at a time as the
    threads need them, so a caller may stream millions of them."""
    def check(pair: tuple[str, str]) -> Problem | None:
        rel, want = pair
        try:
            got = sha256_file(root_fd, rel, meter, evict)
        except OSError as exc:
            return {"path": rel, "problem": f"cannot be read ({exc.strerror}; a symlink "
                                            "on the way is never followed)"}
        finally:
            meter.file_done()
        if got != want:
            return {"path": rel, "problem": f"sha256 {got} differs from the manifest's "
                                            f"{want}"}
        return None

    jobs = jobs or default_jobs()
    problems: list[Problem] = []
    pairs = iter(pairs)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="hotcache-verify") as pool:
        window: deque[Future[Problem | None]] = deque(pool.submit(check, p) for p in islice(pairs, WINDOW * jobs))
        while window:   # in order, refilled one for one: at most WINDOW x jobs in flight
            found = window.popleft().result()
            if found:
                problems.append(found)
            for p in islice(pairs, 1):
                window.append(pool.submit(check, p))
    return problems


def _present(root_fd: int, top: str = "") -> Iterator[tuple[str, int, int]]:
    """(rel, size, mtime_ns) of every file in DEST in path order (the manifest's), one at a time,
    except hotcache's own (and, on a mountpoint, lost+found and an unfinished refresh's
    staging folder); other kinds (symlinks, FIFOs) get size -1 so that they count as
    wrong. Folders are opened beneath their parent with no symlink followed; one that is
    not the folder listed (swapped meanwhile) counts as wrong too, never entered."""
    listed = []
    for name in os.listdir(root_fd):
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        folder = stat.S_ISDIR(st.st_mode)
        if not top and folder and (name == "lost+found" or name.endswith(STAGING_SUFFIX)):
            continue
        if not top and name in RESERVED:
            continue
        listed.append((name + "/" if folder else name, name, st))
    listed.sort()
    for key, name, st in listed:
        rel = f"{top}/{name}" if top else name
        if not key.endswith("/"):
            yield rel, st.st_size if stat.S_ISREG(st.st_mode) else -1, st.st_mtime_ns
            continue
        try:
            sub = beneath.open_at(root_fd, name, beneath.DIR)
        except OSError:
            yield rel, -1, 0
            continue
        try:
            if beneath.same(os.fstat(sub), st):
                yield from _present(sub, rel)
            else:
                yield rel, -1, 0
        finally:
            os.close(sub)


def _manifest(root: int) -> Callable[[], Iterator[tuple[str, str]]]:
    """A way to read the manifest's (path, sha256) pairs in path order, as often as
    needed. hotcache writes its manifests in path order: they are streamed from the file.
    One written some other way (sha256sum by hand) is read whole and sorted."""
    last = None
    for rel, _digest in manifest.iter_lines(MANIFEST, dir_fd=root):
        if last is not None and rel <= last:
            digests = manifest.read(MANIFEST, dir_fd=root)
            return lambda: ((r, digests[r]) for r in sorted(digests))
        last = rel
    return lambda: manifest.iter_lines(MANIFEST, dir_fd=root)


def verify(dest: Path, mode: str = "fast", sample: int = 0, jobs: int = 0,
           meter: NullMeter | None = None, state: Path | None = None,
           record: bool = True) -> Report:
    """Check the copy at `dest`; returns a report with `ok` and `problems` (by path)."""
    meter = meter or NullMeter()
    dest = Path(os.path.abspath(dest))
    meta = read_metadata(dest)
    if meta is None:
        raise UsageError(f"{dest} is not a complete hot copy (no valid {METADATA} and "
                         f"{MANIFEST})", hint="make one with `hotcache copy SRC DEST`")
    if mode == "sample" and sample < 1:
        raise UsageError(f"--sample {sample}: give how many files to hash (1 or more)")
    root = beneath.open_root(dest)
    try:
        return _verify(dest, root, meta, mode, sample, jobs, meter, state, record)
    finally:
        os.close(root)


def _verify(dest: Path, root: int, meta: dict[str, Any], mode: str, sample: int, jobs: int,
            meter: NullMeter, state: Path | None, record: bool) -> Report:
    """The manifest and DEST's files are both read in path order and compared as they
    come (a merge): what is kept per file is its size (8 bytes), not a Python object."""
    pairs = _manifest(root)
    missing: list[str] = []
    extra: list[str] = []
    odd: list[str] = []
    touched: list[Problem] = []
    sizes = array("q")        # per manifest line: the file's size here, -1 if unusable
    seen = array("q")         # and its mtime here (0 if missing)
    mtimes = manifest.read_mtimes(root)
    total = 0
    have = _present(root)
    cur = next(have, None)
    for rel, _digest in pairs():
        while cur is not None and cur[0] < rel:
            extra.append(cur[0])
            total += max(cur[1], 0)
            cur = next(have, None)
        if cur is not None and cur[0] == rel:
            size = cur[1]
            total += max(size, 0)
            if size < 0:
                odd.append(rel)
            elif mtimes is not None and len(sizes) < len(mtimes) \
                    and cur[2] != mtimes[len(sizes)]:
                touched.append({"path": rel, "problem": (
                    f"modified since it was copied (mtime {_when(cur[2])}, the copy "
                    f"recorded {_when(mtimes[len(sizes)])}): rewritten in place?")})
            seen.append(cur[2])
            cur = next(have, None)
        else:
            missing.append(rel)
            size = -1
            seen.append(0)
        sizes.append(size)
    while cur is not None:
        extra.append(cur[0])
        total += max(cur[1], 0)
        cur = next(have, None)
    problems: list[Problem] = [{"path": r, "problem": "missing"} for r in missing]
    problems += [{"path": r, "problem": "not in the manifest"} for r in extra]
    problems += [{"path": r, "problem": "not a regular file"} for r in odd]
    problems += touched
    files = len(sizes)
    if mtimes is not None and len(mtimes) != files:
        problems.append({"path": MTIMES, "problem": f"lists {len(mtimes)} mtimes for "
                         f"{files} files"})
    if files != meta.get("files"):
        problems.append({"path": MANIFEST, "problem": f"lists {files} files, the "
                         f"metadata says {meta.get('files')}"})
    if total != meta.get("bytes") and not problems:
        problems.append({"path": ".", "problem": f"holds {total} bytes, the metadata says "
                         f"{meta.get('bytes')} (a file changed size)"})
    checkable_count = sum(1 for s in sizes if s >= 0)
    if mode == "full":
        picked = None                 # every checkable file
        count = checkable_count
    elif mode == "sample":
        count = min(sample, checkable_count)
        picked = set(random.SystemRandom().sample(range(checkable_count), count))
    else:
        picked, count = set(), 0

    def chosen() -> Iterator[tuple[int, str, str]]:
        k = 0
        for i, (rel, digest) in enumerate(pairs()):
            if i < files and sizes[i] >= 0:
                if picked is None or k in picked:
                    yield i, rel, digest
                k += 1

    meter.start(f"verify {dest.name} ({mode})", sum(sizes[i] for i, _r, _d in chosen()),
                count)
    hashed = hash_files(root, ((r, d) for _i, r, d in chosen()), jobs, meter)
    # A full check hashes every file: its hashes, not mtimes, say which changed. Else a
    # file whose bytes differ is named once, by its hash.
    wrong = {p["path"] for p in hashed}
    problems = [p for p in problems
                if p not in touched or (mode != "full" and p["path"] not in wrong)]
    problems.extend(hashed)
    held = _held_failure(meta, mode) if not problems else None
    if held:
        problems.append({"path": ".", "problem": held})
    report: Report = {
        "path": str(dest), "name": meta.get("name"), "version": meta.get("version"),
        "mode": mode, "files": files, "bytes": total, "hashed_files": count,
        "ok": not problems, "problems": problems, "verified_at": now(),
        "mtimes_checked": mtimes is not None, "recorded": False}
    if record:
        report["recorded"] = _store_outcome(dest, root, meta, report, state, bool(held))
        if report["recorded"] and mode == "full" and report["ok"]:
            # Every byte proven: the mtimes as they are now become the record (a file
            # touched but unchanged, or a copy made before mtimes were kept). One
            # changed after it was hashed has a newer mtime, which the next check sees.
            st = os.stat(METADATA, dir_fd=root, follow_symlinks=False)
            manifest.write_mtimes(root, seen, (st.st_uid, st.st_gid)
                                  if os.geteuid() == 0 else None)
    return report


STRENGTH = {"fast": 0, "sample": 1, "full": 2}


def strength(mode: str | None) -> int:
    """How much a check proves: fast < sample < full (the copy's own read-back is full)."""
    return STRENGTH.get((mode or "fast").split()[0], 0)


def _held_failure(meta: dict[str, Any], mode: str) -> str | None:
    """Why a passing `mode` check cannot clear the copy: an earlier, stronger check
    failed it (None when nothing stronger stands against it)."""
    if meta.get("verify_ok") is not False or strength(meta.get("verify_mode")) <= strength(mode):
        return None
    failed = meta.get("verify_failed") or []
    shown = ", ".join(map(str, failed[:3])) + (", ..." if len(failed) > 3 else "")
    return (f"the last {meta.get('verify_mode')} check failed ({shown or 'see its report'}); "
            f"a {mode} check cannot clear that: run `hotcache verify --full`, or "
            "`hotcache copy` to replace the damaged files")


def _when(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _store_outcome(dest: Path, root: int, meta: dict[str, Any], report: Report,
                   state: Path | None, held: bool = False) -> bool:
    """Store the outcome in the metadata (and the mapping); a read-only copy is fine.
    When `held`, a stronger check's failure stands: its mode and failed paths are
    kept, only verified_at moves."""
    # start-up: the mapping's pydantic models, loaded only once there is an outcome to
    # store (copier.py imports this module and keeps them out of a copy's start)
    from hotcache.provision.hotcopy.catalog import update

    # The failed paths let the next `hotcache copy` replace those files even when their
    # size and mtime still look right (bit rot, a write that kept the mtime).
    if held:
        meta = {**meta, "verified_at": report["verified_at"], "verify_ok": False}
    else:
        meta = {**meta, "verified_at": report["verified_at"], "verify_ok": report["ok"],
                "verify_mode": report["mode"],
                "verify_failed": [p["path"] for p in report["problems"]]}
    try:   # replaced beneath DEST's descriptor, owner and mode set on the new file's fd
        st = os.stat(METADATA, dir_fd=root, follow_symlinks=False)
        beneath.write_file(root, METADATA, (json.dumps(meta, indent=2) + "\n").encode(),
                           beneath.strip_privilege(st.st_mode),
                           (st.st_uid, st.st_gid) if os.geteuid() == 0 else None)
    except PermissionError:
        return False
    try:
        update(dest, meta, state, os.fstat(root))
    except (HotcacheError, OSError):
        pass  # the copy's own metadata holds the result; the mapping is a convenience
    return True

"""`hotcache copy`: a verified hot copy of (part of) a dataset, published in one step.

How a copy runs:
1. choose the files (selection.py) and sort each into: reuse (a refresh finds it
   unchanged in the published copy: hard-linked, no data moved), resume (an interrupted
   run already copied and journaled it), or copy;
2. refuse up front when DEST's filesystem lacks the bytes to copy plus a margin;
3. copy in parallel threads into the staging folder next to DEST, hashing each chunk as
   it is read (each source byte is read once; hashlib and os.read release the GIL);
4. every few seconds (or 256 MiB), syncfs(2) the staging filesystem and only then append
   the finished files to the staging journal: a journaled file is on stable storage, so a
   run killed at any point resumes from the journal without copying those files again;
5. write SHA256SUMS and the metadata, syncfs, and publish: rename onto DEST, or for a
   refresh swap the new tree with the old one in one renameat2(RENAME_EXCHANGE) and then
   remove the old tree. A reader sees the old version or the new one, never a mixture.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import pwd
import stat
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypedDict

from hotcache.provision import __version__
from hotcache.provision.system import beneath, fsops, sizes, users
from hotcache.provision.hotcopy import lanes, manifest
from hotcache.provision.errors import DriftError, HotcacheError, RefusedError, UsageError
from hotcache.provision.hotcopy.filecopy import Done, FileCopier, Limiter, default_jobs
from hotcache.provision.hotcopy.lanes import SMALL, Finished, Item
from hotcache.provision.hotcopy.format import (FORMAT, MANIFEST, METADATA, STAGING_SUFFIX,
                                               label_ok, metadata_at, staging_dir)
from hotcache.provision.system.chunks import CHUNK
from hotcache.provision.system.clock import now
from hotcache.provision.system.meter import NullMeter
from hotcache.provision.hotcopy.selection import Coverage, Entries, Entry, Selection, select
from hotcache.provision.hotcopy.spool import Spool
from hotcache.provision.hotcopy.staging import Staging
from hotcache.provision.hotcopy.sizing import FITS, Advice, AdviceDoc
from hotcache.provision.hotcopy.subset import advice_for, sized
from hotcache.provision.hotcopy.verify import hash_files

__all__ = ["CHUNK", "CopyOptions", "CopySummary", "copy", "default_jobs"]

CHECKPOINT_BYTES = 256 << 20
CHECKPOINT_SECONDS = 2.0
CHECKPOINT_FILES = 16384   # and at most this many files: the journal's pending lines
                           # stay few however fast small files go
BATCH_BYTES = 8 << 20      # small files go to the threads in batches, to keep the
BATCH_FILES = 64           # per-file overhead (futures, wakeups) out of the way
WINDOW = 4                 # batches in flight per thread: enough to keep them busy


# The summary `copy` returns and `hotcache copy --json` prints, as TypedDicts: at run time
# the plain dict the JSON is made of, while mypy checks every key a reader names. The
# order of the keys in the JSON is the order `_copy` builds them in.

class _Counts(TypedDict):
    source: str
    dest: str
    name: str
    files: int                  # in the selection
    bytes: int
    copied_files: int           # copied this run (with those --checksum found changed)
    copied_bytes: int
    reused_files: int           # unchanged since the published version: linked
    resumed_files: int          # synced by an interrupted run
    checked_files: int          # hashed again (--checksum)
    skipped: list[str]          # what the walk left out, and why
    sizing: AdviceDoc           # the selection against the free space at DEST


class _Fit(TypedDict, total=False):
    fit: dict[str, Any]         # how a sized subset was drawn (--fit, --budget)


class CopyPlanned(_Counts, Coverage, _Fit):
    """What a copy is to do, before it is done."""


class _Versioned(CopyPlanned):
    version: str
    changed: bool               # a new version was published


class _Outcome(TypedDict, total=False):
    """How a run ended, after the version: nothing (DEST already held it), a dry run, or
    a published copy."""
    dry_run: Literal[True]      # only in a dry run
    copied_at: str              # a published copy: when
    cache: str | None           # a published copy: the mapping's cache that holds it


class CopySummary(_Versioned, _Outcome):
    """What `copy` did (or, with dry_run, would do)."""


@dataclass
class CopyOptions:
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    list_file: Path | None = None
    fraction: float | None = None
    seed: int = 0
    name: str | None = None
    version: str | None = None
    jobs: int = 0
    owner: str | None = None
    mode: str | None = None
    checksum: bool = False
    margin: float = 0.2
    space_check: bool = True
    bwlimit: int | None = None      # bytes/s read from the source, None: unlimited
    state: Path | None = None       # the mapping, to record copies on managed mounts
    verify: bool = False            # read the copy back from disk before publishing
    fit: bool = False               # the largest stratified subset that fits (subset.py)
    budget: str | None = None       # --budget 80% | 200G: implies fit
    redraw: bool = False            # a refresh of a --fit copy draws its members again
    dry_run: bool = False           # say what would be copied (and whether it fits), no more


# ---------------------------------------------------------------- checking the inputs

def check_paths(src: Path, dest: Path) -> tuple[Path, Path]:
    src = Path(src)
    if not src.exists():
        raise UsageError(f"source {src} does not exist", hint="check the path and retry")
    if not src.is_dir():
        raise UsageError(f"source {src} is not a folder", hint="SRC is a dataset folder")
    src = src.resolve()
    dest = Path(os.path.abspath(dest))
    if dest.is_symlink():
        raise UsageError(f"destination {dest} is a symlink; give the real folder",
                         hint=f"use {dest.resolve()}")
    real_dest = dest.parent.resolve() / dest.name if dest.parent.exists() else dest
    if real_dest == src or real_dest.is_relative_to(src):
        raise UsageError(f"destination {dest} is inside the source {src}",
                         hint="choose a DEST outside SRC, e.g. on the SSD mount")
    if src.is_relative_to(real_dest):
        raise UsageError(f"source {src} is inside the destination {dest}")
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"destination {dest} exists and is not a folder")
    # Whether a DEST that is there may be replaced (a hot copy, or empty) is judged when
    # it is held open (Place.open), from the one read of its metadata the copy makes.
    return src, dest


def parse_owner(owner: str | None) -> tuple[int, int] | None:
    if owner is None:
        return None
    found = users.parse_owner(owner)
    uid, gid = found.uid, found.gid
    try:
        if uid is not None and not found.group_given:
            gid = pwd.getpwuid(uid).pw_gid          # the user's own group
    except KeyError:
        uid = None
    if found.missing or uid is None or gid is None:
        raise UsageError(f"--owner {owner}: no such user or group on this host",
                         hint="give user:group as names or numbers, e.g. --owner train:train")
    if os.geteuid() != 0 and uid != os.geteuid():
        raise UsageError(f"--owner {owner}: only root can give files to another user",
                         hint="run as root, or leave --owner out")
    return uid, gid


def parse_mode(mode: str | None) -> int | None:
    if mode is None:
        return None
    try:
        value = int(mode, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o7777:
        raise UsageError(f"--mode {mode}: give octal permission bits for the files, e.g. 0644",
                         hint="folders get the same bits plus x wherever r is set")
    if value & 0o7000:
        raise UsageError(f"--mode {mode}: setuid, setgid and sticky bits never cross a hot "
                         "copy", hint=f"give the permission bits only, e.g. {value & 0o777:04o}")
    return value


def dir_mode(file_mode: int) -> int:
    return file_mode | ((file_mode & 0o444) >> 2)


def parse_rate(text: str | None) -> int | None:
    """'50M' -> 52428800 bytes/s (system/sizes.py's grammar)."""
    if text is None:
        return None
    try:
        return sizes.parse_size(text)
    except ValueError:
        raise UsageError(f"--bwlimit {text}: give bytes per second, e.g. 200M") from None


# ---------------------------------------------------------------- the whole copy

COPY, LINK, CHECK, RESUMED = range(4)   # what a run does with each selected file
DIGEST = 32                              # bytes of a sha256 in the compact arrays
_DIGESTS_READ = 2048                     # digests read at once by a pass over all (64 KiB)


@dataclass
class CopyPlan:
    """What a run does with each file of the selection, by its index there: one byte of
    `kinds` and, for a file whose sha256 is already known (linked, checked or resumed),
    32 bytes of `known`. No Python object per file; the digests (like the selection) are
    spooled to an unnamed file, so at millions of files only `kinds` (a byte a file)
    stays in memory."""
    entries: Entries
    kinds: bytearray
    known: Spool
    old: dict[str, Any] | None
    same_names: bool            # the published manifest lists exactly these paths
    counts: list[int] = field(default_factory=lambda: [0] * 4)
    sizes: list[int] = field(default_factory=lambda: [0] * 4)
    small: int = 0              # files to copy, link or check that are under lanes.SMALL

    @property
    def copy_bytes(self) -> int:
        return self.sizes[COPY] + self.sizes[CHECK]


def make_plan(entries: Entries, dest: Path, old: dict[str, Any] | None,
              journal: dict[str, tuple[int, int, str]], checksum: bool,
              spool_dir: int | None = None) -> CopyPlan:
    """The selection (in path order) merged with the published copy's manifest (read in
    path order, a line at a time): nothing is held per file of the old copy. `old`: the
    published copy's metadata (None: nothing published). The digests are spooled beneath
    `spool_dir` (the folder holding the staging folder: the copy's own disk) when given."""
    n = len(entries)
    plan = CopyPlan(entries, bytearray(n), Spool(DIGEST * n, spool_dir), old, old is not None)
    failed = set((old or {}).get("verify_failed") or ())
    published = _in_path_order(dest / MANIFEST) if old else iter(())
    cur = next(published, None)
    old_files = 0
    for i, e in enumerate(entries):
        while cur is not None and cur[0] < e.rel:
            old_files += 1
            cur = next(published, None)
        old_digest = None
        if cur is not None and cur[0] == e.rel:
            old_digest = cur[1]
            old_files += 1
            cur = next(published, None)
        else:
            plan.same_names = False
        done = journal.get(e.rel)
        digest = None
        if done and done[:2] == (e.size, e.mtime_ns):
            kind, digest = RESUMED, done[2]
        elif e.rel in failed:
            kind = COPY   # `hotcache verify` found it damaged: copy it afresh
        elif old_digest is not None and checksum:
            kind, digest = CHECK, old_digest
        elif old_digest is not None and _unchanged(os.path.join(dest, e.rel), e):
            kind, digest = LINK, old_digest
        else:
            kind = COPY
        plan.kinds[i] = kind
        plan.counts[kind] += 1
        plan.sizes[kind] += e.size
        plan.small += kind != RESUMED and e.size < SMALL
        if digest is not None:
            plan.known[i * DIGEST:(i + 1) * DIGEST] = bytes.fromhex(digest)
    while cur is not None:
        old_files += 1
        cur = next(published, None)
    plan.same_names = plan.same_names and old_files == n
    return plan


def _in_path_order(path: Path) -> Iterator[tuple[str, str]]:
    """A manifest's (path, sha256) pairs in path order: streamed when the file is in
    that order (hotcache writes it so), else read whole and sorted."""
    last = None
    for rel, _digest in manifest.iter_lines(path):
        if last is not None and rel <= last:
            digests = manifest.read(path)
            return ((r, digests[r]) for r in sorted(digests))
        last = rel
    return manifest.iter_lines(path)


def _unchanged(published: str, e: Entry) -> bool:
    """`published` is a str, not a Path: pathlib interns each part of a path, and
    interning millions of names grows the interpreter's table for good."""
    try:
        st = os.lstat(published)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == e.size and st.st_mtime_ns == e.mtime_ns


def check_space(dest: Path, need: int, margin: float, fd: int,
                sizing: Advice | None = None) -> None:
    """`fd`: the folder that holds the staging folder, on DEST's own filesystem."""
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    want = int(need * (1 + margin))
    if free < want:
        raise RefusedError(
            f"not enough space for the copy on the filesystem of {dest}: it needs "
            f"{sizes.size(want)} ({sizes.size(need)} to copy + {margin:.0%} margin, {want} "
            f"bytes) but has {sizes.size(free)} free ({free} bytes)",
            hint=(f"{sizing.message}. " if sizing is not None and sizing.case != FITS else "")
            + "Free some space, copy a smaller subset (--fit, --fraction, --include), or "
              "choose another DEST")


def next_version(old: dict[str, Any] | None) -> str:
    prev = str((old or {}).get("version", "0"))
    return str(int(prev) + 1) if prev.isdigit() else f"{prev}+1"


@dataclass
class Place:
    """Where a copy goes, held by descriptors: DEST's parent folder, DEST itself when it
    exists (checked to be a real folder, never a symlink), whether DEST is a mountpoint
    (then the staging folder lies inside DEST, on DEST's own filesystem), and the
    published copy's metadata, read once through DEST's descriptor: the sizing, the plan
    and the new version all take it from here."""
    dest: Path
    parent_fd: int
    dest_fd: int | None = None
    dest_st: os.stat_result | None = None
    mountpoint: bool = False
    old: dict[str, Any] | None = None

    @classmethod
    def open(cls, dest: Path) -> Place:
        place = cls(dest, beneath.open_root(dest.parent))
        st = beneath.lstat_at(place.parent_fd, dest.name)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                place.close()
                raise RefusedError(f"destination {dest} is not a folder (it changed while "
                                   "hotcache looked at it)", hint="check who writes there")
            fd = beneath.open_at(place.parent_fd, dest.name, beneath.DIR)
            place.dest_fd, place.dest_st = fd, beneath.expect(fd, st, str(dest))
            place.mountpoint = st.st_dev != os.fstat(place.parent_fd).st_dev
            try:
                place.old = metadata_at(fd)
                place.check_replaceable(place.old, publishing=False)
            except BaseException:
                place.close()
                raise
        return place

    def check_replaceable(self, meta: dict[str, Any] | None, publishing: bool = True) -> None:
        """The folder held at DEST may be replaced: a hot copy (`meta`, its metadata read
        through the descriptor held, is not None), or empty (but for a mountpoint's
        lost+found and hotcache's staging folder). Listed through the descriptor held,
        never the path, which anyone who can write to DEST's parent can point at another
        folder (another user's) at any moment."""
        fd = self.dest_dir
        names = [n for n in os.listdir(fd)
                 if n != "lost+found" and not n.endswith(STAGING_SUFFIX)]
        if not names or meta is not None:
            return
        st = self.dest_stat
        what = f"(owned by uid {st.st_uid})" if publishing else "exists,"
        raise RefusedError(f"destination {self.dest} {what} is not empty and is not a hot "
                           "copy; hotcache does not overwrite it",
                           hint="choose a new DEST, or empty that folder yourself")

    @property
    def dest_dir(self) -> int:
        """DEST's descriptor, held since the start (DEST was there: a refresh or a
        mountpoint)."""
        return beneath.held(self.dest_fd, f"{self.dest} was not there when the copy began")

    @property
    def dest_stat(self) -> os.stat_result:
        return beneath.held(self.dest_st, f"{self.dest} was not there when the copy began")

    def staging(self) -> Staging:
        holder = self.dest_dir if self.mountpoint else self.parent_fd
        return Staging((self.dest if self.mountpoint else self.dest.parent)
                       / staging_dir(self.dest).name, holder)

    def close(self) -> None:
        if self.dest_fd is not None:
            os.close(self.dest_fd)
            self.dest_fd = None
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1


def copy(src: Path, dest: Path, opts: CopyOptions,
         meter: NullMeter | None = None) -> CopySummary:
    """Make (or refresh) the hot copy of `src` at `dest`; returns a summary."""
    meter = meter or NullMeter()
    src, dest = check_paths(src, dest)
    owner, mode = parse_owner(opts.owner), parse_mode(opts.mode)
    if opts.margin < 0:
        raise UsageError(f"--margin {opts.margin}: must be 0 or more (0.2 means 20%)")
    if opts.version is not None and not label_ok(opts.version):
        raise UsageError(f"--version {opts.version!r}: a version label is letters, digits "
                         "and . _ + - (no '/', not starting with '.')", hint="e.g. --version 2025-06")
    if not dest.parent.is_dir():
        raise UsageError(f"the folder {dest.parent} that should hold {dest.name} does not exist",
                         hint=f"mkdir -p {dest.parent}")
    # DEST is held from here on, before SRC is walked (seconds to minutes): a folder
    # renamed to DEST's name meanwhile is not the one held, and publishing refuses it.
    place = Place.open(dest)
    src_fd = None
    try:
        sel = select(src, include=opts.include, exclude=opts.exclude,
                     list_file=opts.list_file, fraction=opts.fraction, seed=opts.seed)
        sizing = advice_for(sel, dest, place.old)
        sel = sized(sel, dest, place.old, fit_=opts.fit, budget=opts.budget, margin=opts.margin,
                    seed=opts.seed, redraw=opts.redraw,
                    explicit=opts.fraction is not None or opts.list_file is not None,
                    note=lambda text: meter.note(text))
        for w in sel.warnings:
            meter.note(f"warning: {w}")
        if not sel.entries:
            raise UsageError(f"no files of {src} were selected",
                             hint="check --include/--exclude/--list/--fraction")
        src_fd = beneath.open_root(src)
        return _copy(src, src_fd, place, sel, sizing, opts, owner, mode, meter)
    finally:
        if src_fd is not None:
            os.close(src_fd)
        place.close()


def _copy(src: Path, src_fd: int, place: Place, sel: Selection, sizing: Advice,
          opts: CopyOptions, owner: tuple[int, int] | None, mode: int | None,
          meter: NullMeter) -> CopySummary:
    dest = place.dest
    staging = place.staging()
    try:
        plan = _plan(src, place, staging, sel.entries, opts)
    except BaseException:
        staging.close()
        raise
    old = plan.old
    name = opts.name or (old or {}).get("name") or src.name
    fit: _Fit = {"fit": sel.rule} if sel.rule else {}
    summary: CopyPlanned = {
        "source": str(src), "dest": str(dest), "name": name,
        "files": len(sel.entries), "bytes": sel.bytes,
        "copied_files": plan.counts[COPY], "copied_bytes": plan.sizes[COPY],
        "reused_files": plan.counts[LINK], "resumed_files": plan.counts[RESUMED],
        "checked_files": plan.counts[CHECK],
        "skipped": sel.warnings, **sel.coverage, **fit, "sizing": sizing.to_dict()}
    try:
        if old is not None and _same(plan, opts, name) and not plan.counts[CHECK] and \
                opts.version in (None, old["version"]):
            return _versioned(summary, old["version"], False, {})
        if opts.space_check:
            check_space(dest, plan.copy_bytes, opts.margin, staging.parent_fd, sizing)
        if opts.dry_run:
            return _versioned(summary, opts.version or next_version(old), False,
                              {"dry_run": True})
        existed = staging.is_open
        staging.create(src, dest)
        if existed:
            staging.prune(_resumed(plan))
        digests, mtimes, recopied = _run(src, src_fd, place, staging, plan, opts, owner, mode,
                                         meter)
        summary["copied_files"] += recopied
        if old is not None and _same(plan, opts, name) and not recopied and \
                opts.version in (None, old["version"]):
            staging.remove()   # --checksum found nothing new: keep what is published
            return _versioned(summary, old["version"], False, {})
        version = opts.version or next_version(old)
        verified_at = _read_back(staging, sel.entries, digests, opts, meter) \
            if opts.verify else None
        try:
            meta = _finish(staging, src, dest, digests, mtimes, sel, opts, name, version,
                           old, owner, verified_at)
        except OSError as exc:
            _fail(exc, staging, dest, plan, lambda: None)
            raise
        _publish(staging, place, meter, opts.state)
        # Only now, with DEST in place, does the top folder get its owner and mode: until
        # the rename it stays root's 0700, so nobody can move it or change what it holds.
        # A mountpoint DEST keeps its own unless --owner/--mode say otherwise.
        top = place.dest_dir if place.mountpoint else staging.fd
        if owner:
            os.fchown(top, *owner)
        if mode is not None or not place.mountpoint:
            os.fchmod(top, dir_mode(mode) if mode is not None else 0o755)
        published = os.fstat(top)      # the folder hotcache made, whatever DEST is now
    finally:
        staging.close()
    recorded = _record(dest, meta, opts.state, meter, published)
    return _versioned(summary, meta["version"], True,
                      {"copied_at": meta["copied_at"], "cache": recorded})


def _versioned(planned: CopyPlanned, version: str, changed: bool,
               outcome: _Outcome) -> CopySummary:
    """The summary: what was planned, the version and how the run ended, in that order.
    `outcome` is spread too, never left out when empty: it tells mypy the type of every
    key a summary has beyond `planned`'s, which `planned` spread alone might carry with
    any type (a TypedDict value may hold more keys than its type names)."""
    return {**planned, "version": version, "changed": changed, **outcome}


def _plan(src: Path, place: Place, staging: Staging, entries: Entries,
          opts: CopyOptions) -> CopyPlan:
    """The plan, taking an earlier run's staging journal into account (under its lock:
    the staging folder stays open and locked for the rest of the copy)."""
    journal: dict[str, tuple[int, int, str]] = {}
    if staging.open():
        if staging.source() not in (None, str(src)):
            raise RefusedError(f"{staging.path} holds an unfinished copy of another source "
                               f"({staging.source()})",
                               hint=f"finish that copy, or remove {staging.path}")
        journal = staging.journaled() if staging.source() else {}
    return make_plan(entries, place.dest, place.old, journal, opts.checksum,
                     staging.parent_fd)


def _same(plan: CopyPlan, opts: CopyOptions, name: str) -> bool:
    """Would this run publish exactly what is published now?"""
    return (plan.old is not None and not plan.counts[COPY] and not plan.counts[RESUMED]
            and plan.same_names
            and name == plan.old.get("name") and opts.owner is None and opts.mode is None)


def _resumed(plan: CopyPlan) -> set[str]:
    """The paths an earlier run journaled (and this run keeps)."""
    return {rel for rel, kind in zip(plan.entries.rels(), plan.kinds) if kind == RESUMED}


def _run(src: Path, src_fd: int, place: Place, staging: Staging, plan: CopyPlan,
         opts: CopyOptions, owner: tuple[int, int] | None, mode: int | None,
         meter: NullMeter) -> tuple[Spool, dict[int, int], int]:
    """Copy/link everything in the plan; returns the sha256 of every selected file (32
    bytes each, in the selection's order), the mtimes (ns) of the files whose copy got
    another than the walk saw, by index, and how many files --checksum found changed.
    The work is handed out a window of batches at a time, as the selection is read, so
    nothing per file is held beyond the compact arrays: batches of many small files to
    worker processes, the rest to threads (lanes.py)."""
    dest = place.dest
    worker = FileCopier(src, src_fd, staging.fd, place.dest_fd if plan.old else None, mode,
                        owner, Limiter(opts.bwlimit) if opts.bwlimit else None, meter)
    entries, kinds = plan.entries, plan.kinds
    _make_folders(staging.fd, entries.rels(), mode, owner)
    digests = plan.known   # filled in place: the known ones are already there
    # The mtime each file has in the copy, known without reading it back: a resumed or
    # linked file has the one the walk saw (the plan matched it so), a copied file the
    # one its source had when it was opened (set with utime). Only those that differ
    # from the walk's (a source touched since) are held, so memory stays flat.
    mtimes: dict[int, int] = {}

    def work() -> Iterator[Item]:
        for i, (e, kind) in enumerate(zip(entries, kinds)):
            if kind != RESUMED:
                known = plan.known[i * DIGEST:(i + 1) * DIGEST].hex() if kind != COPY else ""
                yield i, kind, e, known

    todo = len(entries) - plan.counts[RESUMED]
    pending: list[Done] = []
    since = {"bytes": 0, "at": time.monotonic()}

    def checkpoint() -> None:
        if pending:
            fsops.syncfs(staging.fd)   # data first, then the journal that vouches for it
            staging.append(pending)
            pending.clear()
        since.update(bytes=0, at=time.monotonic())

    jobs = opts.jobs or default_jobs()
    recopied = 0
    with lanes.Lanes(worker, _batch, jobs, lanes.processes(plan.small, jobs)) as pool:
        meter.start(f"copy {src.name} -> {dest}", entries.bytes - plan.sizes[RESUMED], todo)
        batches = _batches(work())
        window = WINDOW * jobs

        def submit(n: int) -> set[Future[Finished]]:
            return {pool.submit(b, b[0][2].size < SMALL) for b in itertools.islice(batches, n)}

        remaining = submit(window)
        try:
            while remaining:
                # Woken by each finished batch, to hand out the next one at once: the
                # copiers never wait for the slowest batch of a window.
                done, remaining = wait(remaining, timeout=CHECKPOINT_SECONDS,
                                       return_when=FIRST_COMPLETED)
                for fut in done:
                    finished, moved, changed = fut.result()
                    meter.advance(moved)
                    recopied += changed
                    _store_digests(digests, finished)
                    for i, line in finished:
                        if line[2] != entries.mtime_ns(i):
                            mtimes[i] = line[2]
                        pending.append(line)
                        since["bytes"] += line[1]
                    meter.file_done(len(finished))
                remaining |= submit(window - len(remaining))
                if (since["bytes"] >= CHECKPOINT_BYTES or len(pending) >= CHECKPOINT_FILES
                        or time.monotonic() - since["at"] >= CHECKPOINT_SECONDS):
                    checkpoint()
            checkpoint()
        except BaseException as exc:
            worker.stop.set()
            pool.shutdown(cancel=True)
            died = lanes.worker_died(exc)
            _fail(died or exc, staging, dest, plan, checkpoint)
            if died:
                raise died from exc
            raise
    return digests, mtimes, worker.recopied + recopied


def _make_folders(staging_fd: int, rels: Iterable[str], mode: int | None,
                  owner: tuple[int, int] | None) -> None:
    """Every folder the files lie in, and their parents, made first and once from this
    thread with their final owner and mode: the workers then only create files, and
    publishing walks no tree. Until then nobody else can reach them: the staging folder
    itself stays root's 0700 until it is published."""
    folders: set[str] = set()
    for rel in rels:
        folder = os.path.dirname(rel)
        while folder and folder not in folders:
            folders.add(folder)
            folder = os.path.dirname(folder)
    perm = dir_mode(mode) if mode is not None else 0o755
    for folder in sorted(folders):
        fd = beneath.makedirs(staging_fd, folder, 0o700)
        try:
            if owner:
                os.fchown(fd, *owner)
            os.fchmod(fd, perm)
        finally:
            os.close(fd)


def _store_digests(digests: Spool, finished: list[tuple[int, Done]]) -> None:
    """Put a batch's digests in place, one write per run of consecutive files (a batch
    is a run unless files an earlier run finished sit between its files)."""
    first, run = 0, bytearray()
    for i, (_rel, _size, _mtime_ns, digest) in finished:
        if run and i != first + len(run) // DIGEST:
            digests[first * DIGEST:first * DIGEST + len(run)] = run
            run = bytearray()
        if not run:
            first = i
        run += bytes.fromhex(digest)
    if run:
        digests[first * DIGEST:first * DIGEST + len(run)] = run


def _batches(work: Iterable[Item]) -> Iterator[list[Item]]:
    """Group small files into batches (up to BATCH_FILES or BATCH_BYTES); a large file
    is a batch of its own, so that large files still spread over all threads. A batch
    holds small files only or none (they may go to different lanes)."""
    batch: list[Item] = []
    size = 0
    for item in work:
        if batch and (item[2].size < SMALL) != (batch[0][2].size < SMALL):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item[2].size
        if len(batch) >= BATCH_FILES or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _batch(worker: FileCopier, batch: list[Item]) -> list[tuple[int, Done]]:
    """Copy, link or check each file of a batch (in a thread or a worker process)."""
    out = []
    for i, kind, e, known in batch:
        if worker.stop.is_set():   # another file failed, or Ctrl-C: this batch is void
            raise InterruptedError("stopped")
        if kind == COPY:
            out.append((i, worker.copy(e)))
        elif kind == LINK:
            out.append((i, worker.link(e, known)))
        else:
            out.append((i, worker.check(e, known)))
    return out


def _fail(exc: BaseException, staging: Staging, dest: Path, plan: CopyPlan,
          checkpoint: Callable[[], None]) -> None:
    """Turn a failure into a clear error. A full filesystem gets its staging removed (the
    copy cannot finish there and the space must come back); anything else keeps what is
    journaled so that the next run resumes."""
    if isinstance(exc, OSError) and exc.errno in fsops.NO_SPACE:
        staging.remove()
        raise HotcacheError(
            f"the filesystem of {dest} filled up during the copy ({exc.strerror}); nothing "
            f"was published and the staging folder {staging.path} was removed. The copy "
            f"needs {sizes.size(plan.copy_bytes)} of new data",
            hint="free space there or copy a smaller subset, then run again") from exc
    try:
        checkpoint()
    except OSError:
        pass  # the original error is the one to report; the journal holds what it holds
    if isinstance(exc, OSError):
        raise HotcacheError(f"copy to {dest} failed: {exc.filename or ''}: {exc.strerror}",
                            hint="fix the cause and run the same command again; finished "
                                 "files are not copied again") from exc


def _read_back(staging: Staging, entries: Entries, digests: Spool,
               opts: CopyOptions, meter: NullMeter) -> str:
    """--verify: make the copy durable, drop it from the page cache and hash it again from
    the device. Files that read back wrong are removed from the staging folder (and its
    journal) and nothing is published; the next run copies just those again."""
    fsops.syncfs(staging.fd)
    meter.start("read back", entries.bytes, len(entries))
    bad = hash_files(staging.fd, _pairs(entries, digests), opts.jobs, meter, evict=True)
    if bad:
        staging.forget({p["path"] for p in bad})
        shown = "\n  ".join(f"{p['path']}: {p['problem']}" for p in bad[:10])
        raise DriftError(f"{len(bad)} files read back differently from what was written; "
                         f"nothing was published:\n  {shown}",
                         hint="check the destination device (dmesg, SMART); run again to "
                              "copy those files afresh")
    return now()


def _pairs(entries: Entries, digests: Spool) -> Iterator[tuple[str, str]]:
    """(path, sha256 hex) of every selected file, in path order, one at a time."""
    rels, n = entries.rels(), len(entries)
    for first in range(0, n, _DIGESTS_READ):
        block = digests[first * DIGEST:min(n, first + _DIGESTS_READ) * DIGEST]
        for at in range(0, len(block), DIGEST):
            yield next(rels), block[at:at + DIGEST].hex()


def _finish(staging: Staging, src: Path, dest: Path, digests: Spool, mtimes: dict[int, int],
            sel: Selection, opts: CopyOptions, name: str, version: str,
            old: dict[str, Any] | None, owner: tuple[int, int] | None,
            verified_at: str | None) -> dict[str, Any]:
    """Manifest, metadata, then make it all durable (the folders got their owner and
    mode when they were made). The manifest is written before the journal is dropped: a
    failure here resumes, not starts over."""
    manifest.write(staging.fd, _pairs(sel.entries, digests), owner)
    manifest.write_mtimes(staging.fd, (mtimes.get(i, e.mtime_ns)
                                       for i, e in enumerate(sel.entries)), owner)
    meta: dict[str, Any] = {
        "format": FORMAT, "complete": True, "name": name, "version": str(version),
        "source": str(src), "files": len(sel.entries), "bytes": sel.bytes, "hash": "sha256",
        "copied_at": now(), "verified_at": verified_at,
        "verify_ok": True if verified_at else None,
        "verify_mode": "full (read back before publishing)" if verified_at else None,
        "tool_version": __version__,
        "selection": {"include": opts.include, "exclude": opts.exclude,
                      "list": str(opts.list_file) if opts.list_file else None,
                      "fraction": opts.fraction, "seed": opts.seed if opts.fraction else None,
                      **sel.rule},
        **sel.coverage,
        "owner": opts.owner, "mode": opts.mode,
        "previous_version": (old or {}).get("version"),
    }
    beneath.write_file(staging.fd, METADATA, (json.dumps(meta, indent=2) + "\n").encode(),
                       0o644, owner)
    staging.seal()
    fsops.syncfs(staging.fd)
    return meta


def _publish(staging: Staging, place: Place, meter: NullMeter,
             state: Path | None = None) -> None:
    """One rename makes the copy visible; a refresh swaps old and new in one step. Both
    names are taken relative to the parent's descriptor and checked to still be the
    folders hotcache holds open, so a symlink or folder planted meanwhile is refused."""
    if place.mountpoint:
        return _publish_into_mountpoint(staging, place)
    pfd, dest = place.parent_fd, place.dest
    cur = beneath.lstat_at(pfd, staging.name)
    if cur is None or not beneath.same(cur, staging.st):
        raise RefusedError(f"{staging.path} was moved away during the copy; nothing was "
                           "published", hint="make sure nobody else writes there; run again")
    now_st = beneath.lstat_at(pfd, dest.name)
    if now_st is None:
        beneath.rename_at(pfd, staging.name, pfd, dest.name, beneath.RENAME_NOREPLACE)
    elif place.dest_st is None or not beneath.same(now_st, place.dest_st):
        raise RefusedError(f"{dest} was replaced during the copy (by "
                           f"{stat.filemode(now_st.st_mode)[0]!r} owned by uid "
                           f"{now_st.st_uid}); nothing was published",
                           hint="make sure nobody else writes there; run again")
    elif not os.listdir(place.dest_dir):
        beneath.rename_at(pfd, staging.name, pfd, dest.name)   # replaces the empty folder
    else:
        # Read again, not taken from the start: the folder's owner may have changed what
        # it holds during the copy, and only a look taken now can say that the tree about
        # to be emptied is still a hot copy (filled meanwhile, it is kept).
        place.check_replaceable(metadata_at(place.dest_dir))
        try:
            beneath.rename_at(pfd, staging.name, pfd, dest.name, beneath.RENAME_EXCHANGE)
            aside = staging.name
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
                raise
            # No RENAME_EXCHANGE here: a moment without DEST beats a mixed tree.
            aside = f".{dest.name}.hotcache-old"
            # Recorded before the rename: prune deletes a leftover at an aside name only
            # when hotcache recorded that folder there (anyone may name a folder so).
            # catalog brings the mapping's pydantic models: loaded only once the copy
            # is done (the CLI preloads them in a thread meanwhile), never before it starts
            from hotcache.provision.hotcopy.catalog import record_aside

            record_aside(dest.parent / aside, place.dest_stat, state)
            beneath.rename_at(pfd, dest.name, pfd, aside, beneath.RENAME_NOREPLACE)
            beneath.rename_at(pfd, staging.name, pfd, dest.name, beneath.RENAME_NOREPLACE)
        os.fsync(pfd)
        try:   # the old tree, through the descriptor held since the start
            beneath.empty(place.dest_dir)
            beneath.rmdir_if(pfd, aside, place.dest_stat)
        except OSError as exc:
            meter.note(f"warning: the previous version could not be removed completely "
                       f"({exc}); remove {dest.parent / aside} yourself")
    os.fsync(pfd)


def _publish_into_mountpoint(staging: Staging, place: Place) -> None:
    """DEST is a mountpoint: it cannot be renamed, so the copy was staged inside it and
    its top-level entries are moved in one by one. The metadata file goes first (DEST
    stops being a complete hot copy) and comes back last, so a reader never takes a
    half-swapped DEST for a complete copy. Old entries are swapped into the staging
    folder and removed with it."""
    dfd, sfd = place.dest_dir, staging.fd
    try:
        os.unlink(METADATA, dir_fd=dfd)
    except FileNotFoundError:
        pass
    os.fsync(dfd)
    new = set(os.listdir(sfd)) - {METADATA}
    for name in sorted(new):
        flags = beneath.RENAME_EXCHANGE if beneath.lstat_at(dfd, name) else \
            beneath.RENAME_NOREPLACE
        beneath.rename_at(sfd, name, dfd, name, flags)
    for name in set(os.listdir(dfd)) - new - {staging.name, "lost+found"}:
        beneath.rename_at(dfd, name, sfd, name, beneath.RENAME_NOREPLACE)   # old only
    beneath.rename_at(sfd, METADATA, dfd, METADATA, beneath.RENAME_NOREPLACE)
    os.fsync(dfd)
    beneath.empty(sfd)
    beneath.rmdir_if(dfd, staging.name, staging.st)
    os.fsync(dfd)


def _record(dest: Path, meta: dict[str, Any], state: Path | None, meter: NullMeter,
            st: os.stat_result) -> str | None:
    """Note the copy in the mapping. The copy is already published, so a mapping that
    cannot be written is a warning, not a failed copy."""
    # start-up: the mapping's pydantic models, loaded only once the copy is published
    from hotcache.provision.hotcopy.catalog import record

    try:
        return record(dest, meta, state, st)
    except (HotcacheError, OSError) as exc:
        meter.note(f"warning: {dest} is published but not recorded in the mapping: {exc}")
        return None

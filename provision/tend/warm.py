"""`hotcache warm`: read every file under a path, in parallel, so that training's first
epoch finds it in the cache.

- No hotcache block cache behind the path (or backend `none`): one pass fills the page
  cache.
- Block caches: full passes until a pass's reads were served by the cache (`settled`):
  at most 0.5% of its bytes came from the origin, counted by the origin device itself
  (`origin_reads`: /sys/class/block/<origin>/stat; else the cache's miss counter); or
  the cache is full; or QUIET_PASSES passes in a row neither promoted nor read less from
  the origin; at most `max_passes`. bcache caches every read miss (sequential_cutoff 0,
  congestion bypass off), so one pass usually does it and the second proves it (in the
  guest kernel one parallel pass has left half of a dataset on the origin).
- dm-cache / lvmcache: the smq policy promotes gradually, so before the full passes
  comes a focused sweep: the files (in path order) are cut into about 8 windows by size
  and each window is read again and again, at most one read per second, until its
  promotions stop rising (at most WINDOW_READS reads). Why: smq (dm-cache-policy-smq.c)
  promotes a missed block only when its "hotspot" entry ranks high, raises an entry at
  most once per 1 s tick, and promotes eagerly only when a good share of recent
  lookups land on high-ranked entries. Re-reading one window across several ticks
  lifts exactly those entries above the rest; one read of everything per pass lifts
  every entry alike, which (bench/bench_vm_cache.py) left smq promoting only part of
  the data per pass. smq promotes in waves (a pass without
  promotions can be followed by one with many), so one quiet pass does not end it.
  Full passes are spaced a tick apart, and between two of them the files that the last
  pass read much slower than the rest (they still came from the origin: `slow_files`)
  are re-read on their own, when they are under half of all, until they hit the cache
  (at most FOCUS_READS reads): a full pass raises every hotspot entry alike, a focused
  re-read raises exactly the ones still missing (full passes alone cut the misses only
  by a fraction each). smq may still decline some blocks for good (seen in the
  guest kernel: lvmcache kept a quarter of a small dataset on the origin through 16
  focused reads); the report says how much the last pass read from the origin.
  Raising dm-cache's `migration_threshold` during warm would not help: in the kernel
  it only gates idle-time writeback (`spare_migration_bandwidth`); queued promotions are
  issued regardless (`smq_get_background_work`), so warm leaves the tunable alone.
- Every block cache: a pass that hit with parallel readers is followed by one read with
  a single reader, in path order, as an epoch reads; warm stops only when that pass hits
  too (one pass past `max_passes` if the hit came on the last pass allowed): in the VM
  benchmark a parallel pass that hit was followed by a single-reader pass well below
  the bare SSD's speed (BENCHMARKS.md, "Block caches in a guest kernel").
For block caches, each file is dropped from the page cache (posix_fadvise DONTNEED)
before it is read, so every pass reaches the block device: without that, passes after
the first would be served from RAM and the block cache would never see them. This drops
only these files, not the whole host's page cache. The filesystem's own metadata (inodes,
directory blocks) would still stay in RAM and never reach the cache, so a cold start
(reboot, or a page cache dropped) would read it from the slow origin, and the first
cold pass after warm would run well below the bare SSD's speed. So, as root, before each read warm also asks the kernel to drop reclaimable
dentries and inodes (`echo 2 > /proc/sys/vm/drop_caches`: no file data, nothing dirty;
the kernel rebuilds them on the next lookup), which makes the metadata go through the
block cache too (`metadata_reread` in the report).

The backend's `stats(entry, runner)` is read before and after (and after each pass):
hits, misses, hit_ratio, dirty_bytes, cache_used_bytes, cache_total_bytes, promotions,
policy, state.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypedDict

from hotcache.provision import mapping
from hotcache.provision.backends import BACKENDS, PLAIN, block_cache, get
from hotcache.provision.backends.parts import recorded
from hotcache.provision.backends.parts.dmtable import parse_table
from hotcache.provision.block.host import Host
from hotcache.provision.system import beneath
from hotcache.provision.system import sizes as units
from hotcache.provision.errors import HotcacheError, UsageError
from hotcache.provision.hotcopy.catalog import backing_cache
from hotcache.provision.hotcopy.filecopy import default_jobs
from hotcache.provision.system.chunks import CHUNK, chunks, thread_buffer
from hotcache.provision.system.meter import NullMeter
from hotcache.provision.system.runner import Runner

if TYPE_CHECKING:
    from hotcache.provision.backends.parts.stats import CacheStats
    from hotcache.provision.records import CacheEntry

WINDOWS = 8             # the focused sweep's windows, at most
MIN_WINDOW = 8 << 20    # bytes: smaller data sets get fewer windows
WINDOW_READS = 6        # reads of one window, at most
TICK = 1.1              # seconds: smq lifts a hotspot entry at most once per 1 s tick
MISSED = 5              # per mille: a pass with fewer of its reads missing is the last
SLOWER = 4              # a file read this many times slower than a pass's fastest quarter
SLOW_FLOOR = 0.003      # and slower than this (seconds per MiB) came from the origin
FOCUS_SHARE = 0.5       # re-read the slow files alone when they are under half of all
FOCUS_READS = 16        # reads of them, at most (smq lifts an entry by 1-4 levels a tick)
QUIET_PASSES = 3        # full passes in a row that promoted nothing and missed as much
FULL = 0.99             # share of the cache in use at which it can take no more


# The report `warm` returns and `hotcache warm --json` prints, as TypedDicts: at run time
# the plain dicts the JSON is made of, while mypy checks every key a reader names. The
# order of the keys in the JSON is the order the code below builds them in.

class ReadDoc(TypedDict):
    """One read of a list of files (`Reader.read`), and what the cache did meanwhile."""
    bytes: int
    files: int
    seconds: float
    mib_per_s: float | None
    files_per_s: float | None
    promoted: int                       # blocks the cache took in (0 when it cannot tell)
    lookups: tuple[int, int] | None     # (reads the cache saw, of them misses), if counted
    from_origin: int | None             # bytes the origin device served, if it can tell
    rising: bool                        # promotions or cache use went up
    stats: CacheStats | None            # the cache's statistics after the read


# "pass" is a Python keyword: this part of a pass's shape can only be spelt this way.
_PassNumber = TypedDict("_PassNumber", {"pass": int, "readers": int})


class PassDoc(_PassNumber, ReadDoc):
    """A full pass over the files: its number, how many readers, and the read."""


class RereadDoc(TypedDict):
    """A part of the files read again and again (`reread`)."""
    files: int
    reads: int
    promoted: int
    seconds: float


class WindowDoc(RereadDoc):
    """A window of the focused sweep (dm-cache, lvmcache)."""
    window: int


class FocusDoc(RereadDoc):
    """The slow files of a pass, re-read on their own."""
    after_pass: int


class _Head(TypedDict):
    path: str
    files: int
    bytes: int
    cache: str | None                   # the mapping's cache behind the path, if any
    backend: str


class _Order(_Head, total=False):
    order: str                          # --order: the read-ahead's order file


class WarmReport(_Order):
    """What `warm` did: every read, why it stopped, the cache's statistics around it."""
    evicted_before_reading: bool
    metadata_reread: bool
    sweep: list[WindowDoc]
    passes: list[PassDoc]
    focus: list[FocusDoc]
    stopped: str                        # why it stopped, in words
    before: CacheStats | None
    after: CacheStats | None
    hit_ratio_before: float | None
    hit_ratio_after: float | None


def files_under(root_fd: int) -> list[tuple[Path, int]]:
    """Regular files beneath the folder `root_fd` (paths relative to it; symlinks are
    neither followed nor listed), with their sizes."""
    out = []
    for top, _dirs, names, fd in beneath.walk(root_fd):
        for name in names:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out.append((Path(top) / name, st.st_size))
    return out


def read_file(root_fd: int, rel: Path, evict: bool, meter: NullMeter,
              local: threading.local) -> tuple[int, float]:
    """Read one file beneath `root_fd` (no symlink followed on the way: a folder swapped
    for a symlink since the listing is an error, not a read elsewhere); (bytes, seconds
    the read took)."""
    buf = thread_buffer(local)
    t0 = time.monotonic()
    try:
        fd = beneath.open_at(root_fd, str(rel), os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return 0, time.monotonic() - t0   # removed since the listing: nothing to warm
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EXDEV):
            raise
        return 0, time.monotonic() - t0   # now behind a symlink: never followed
    total = 0
    try:
        if evict:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        for chunk in chunks(fd, buf):
            total += len(chunk)
            meter.advance(len(chunk))
    finally:
        os.close(fd)
    meter.file_done()
    return total, time.monotonic() - t0


def ordered_files(root_fd: int, root: Path, order: Path) -> list[tuple[Path, int]]:
    """The files that `order` lists (one path per line, relative to `root`: what the
    training adapters write as the next epoch's order), in its order, with their sizes.
    Every path must name a regular file beneath `root`, reached without a symlink;
    anything else is refused before a byte is read."""
    hint = (f"give the order file the training adapter wrote for {root}: one path per "
            f"line, relative to {root}")
    try:
        lines = order.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--order {order}: cannot read it ({exc})", hint=hint) from None
    out = []
    for n, rel in enumerate(lines, 1):
        if not rel.strip():
            continue
        where = f"--order {order}, line {n}: {rel!r}"
        if rel.startswith("/") or ".." in rel.split("/"):
            raise UsageError(f"{where} is not a path inside {root}", hint=hint)
        try:   # O_PATH: a handle to stat, not an open of the file (nothing read yet)
            fd = beneath.open_at(root_fd, rel, os.O_PATH)
        except OSError as exc:
            why = {errno.ENOENT: "no such file", errno.ELOOP: "a symlink on the way",
                   errno.EXDEV: "leads out of it"}.get(exc.errno or 0) or exc.strerror
            raise UsageError(f"{where} is not a file inside {root} ({why})",
                             hint=hint) from None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where} is not a regular file", hint=hint)
        out.append((Path(rel), st.st_size))
    if not out:
        raise UsageError(f"--order {order}: lists no file", hint=hint)
    return out


def forget_metadata() -> bool:
    """Drop the kernel's clean dentries and inodes (not file data): the next lookups read
    the filesystem's metadata from the device again. False when not allowed (not root)."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        return True
    except OSError:
        return False


def read_pass(files: list[tuple[Path, int]], jobs: int, evict: bool,
              meter: NullMeter, root_fd: int) -> tuple[int, list[float]]:
    """Read the files (beneath `root_fd`) in parallel; (bytes, each file's read time in
    `files` order)."""
    local = threading.local()
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="hotcache-warm") as pool:
        done = list(pool.map(lambda f: read_file(root_fd, f[0], evict, meter, local), files))
    return sum(n for n, _ in done), [t for _, t in done]


def slow_files(files: list[tuple[Path, int]], seconds: list[float]) -> list[tuple[Path, int]]:
    """The files of a pass that were read several times slower (per MiB) than the pass's
    fastest quarter, and slower than any SSD is: under a block cache those still came,
    at least partly, from the origin. Timing is all there is to go by: dm-cache does not
    say which blocks it holds."""
    if not files:
        return []
    per_mib = [t / max(1.0, size / CHUNK) for (_, size), t in zip(files, seconds)]
    fast = sorted(per_mib)[len(per_mib) // 4]
    limit = max(SLOWER * fast, SLOW_FLOOR)
    return [f for f, t in zip(files, per_mib) if t > limit]


def backing(path: Path, state: Path | None) -> tuple[str, CacheEntry] | None:
    spath = mapping.state_path(state and str(state))
    try:
        return backing_cache(path, mapping.load(spath)) if spath.exists() else None
    except (HotcacheError, OSError):
        return None   # an unreadable mapping: warm the page cache all the same


def backend_stats(entry: CacheEntry, runner: Runner) -> Callable[[], CacheStats | None]:
    host = Host(runner)
    backend = get(entry.backend, host)

    # Each device found by its identity once per warm run, not at every read: the reads
    # only report (and a probe is a blkid, costly where the machine is slow).
    found: dict[str, str | None] = {}

    def read() -> CacheStats | None:
        try:
            if not found:
                found.update({role: recorded.current_node(entry, role, host)
                              for role in entry.devices})
            return backend.stats(entry, found)
        except (HotcacheError, OSError, ValueError, KeyError, IndexError):
            return None   # statistics are a report, not a reason to stop warming
    return read


def promotions(st: CacheStats | None) -> int:
    return (st.get("promotions") if st else None) or 0


def rising(before: CacheStats | None, after: CacheStats | None) -> bool:
    """Did the cache take in more blocks during the last pass?"""
    if not before or not after:
        return False
    return ((after.get("promotions") or 0) > (before.get("promotions") or 0)
            or (after.get("cache_used_bytes") or 0) > (before.get("cache_used_bytes") or 0))


def windows(files: list[tuple[Path, int]]) -> list[list[tuple[Path, int]]]:
    """The files in path order (for files written together, close to disk order), cut
    into at most WINDOWS runs of about equal size, none under MIN_WINDOW bytes."""
    files = sorted(files)
    total = sum(size for _, size in files)
    count = max(1, min(WINDOWS, total // MIN_WINDOW))
    out: list[list[tuple[Path, int]]] = [[]]
    done = 0
    for f in files:
        if done >= total * len(out) / count and out[-1] and len(out) < count:
            out.append([])
        out[-1].append(f)
        done += f[1]
    return [w for w in out if w]


def hit_cache(read: ReadDoc) -> str | None:
    """What shows that a read was served by the cache (at most MISSED per mille of it came
    from the origin), or None. The origin device's own read counter decides when known;
    else the cache's miss counter (dm-cache counts bios, not bytes)."""
    origin = read.get("from_origin")
    if origin is not None and read["bytes"]:
        if origin * 1000 <= read["bytes"] * MISSED:
            return f"{units.size(origin)} of {units.size(read['bytes'])} came from the origin"
        return None
    seen = read.get("lookups")
    if seen and seen[0] and seen[1] * 1000 <= seen[0] * MISSED:
        return f"{seen[1]} of {seen[0]} reads missed"
    return None


def still_missing(read: ReadDoc) -> str:
    origin, seen = read.get("from_origin"), read.get("lookups")
    if origin is not None:
        return f"; {units.size(origin)} of {units.size(read['bytes'])} in the last pass " \
               "came from the origin"
    return f"; {seen[1]} of {seen[0]} reads in the last pass missed" if seen and seen[0] \
        else ""


def window_done(reads: list[ReadDoc]) -> bool:
    """Stop re-reading a window once a read hit the cache, or promotions stopped for two
    reads in a row after reads that promoted (smq promotes in waves: one quiet read is no
    end), or three reads promoted nothing at all (smq will not take it now); at most
    WINDOW_READS reads."""
    if len(reads) >= WINDOW_READS or hit_cache(reads[-1]):
        return True
    gains = [r["promoted"] for r in reads]
    return gains[-2:] == [0, 0] and (any(gains) or len(gains) >= 3)


def focus_done(reads: list[ReadDoc]) -> bool:
    """Stop re-reading the slow files only once they hit the cache (or after FOCUS_READS
    reads): the entries smq keeps for them start low and rise by at most 4 of its 64
    levels a tick, promotion needs level 48 while most lookups land low, so reads that
    promote nothing at first are still on the way."""
    return len(reads) >= FOCUS_READS or hit_cache(reads[-1]) is not None


def lookups(before: CacheStats | None, after: CacheStats | None) -> tuple[int, int] | None:
    """(reads and writes the cache saw, of them misses) between two statistics reads, or
    None when the backend does not count hits and misses."""
    if not before or not after:
        return None
    hits0, misses0 = before.get("hits"), before.get("misses")
    hits1, misses1 = after.get("hits"), after.get("misses")
    if hits0 is None or misses0 is None or hits1 is None or misses1 is None:
        return None
    hits, misses = hits1 - hits0, misses1 - misses0
    return hits + misses, misses


def falling(before: ReadDoc | None, after: ReadDoc) -> bool:
    """Did the origin serve clearly less (under 90%) in `after` than in `before`? (bcache
    has no promotion counter, and its cache use is reported in whole per cents.)"""
    a, b = before.get("from_origin") if before else None, after.get("from_origin")
    return a is not None and b is not None and b * 10 < a * 9


def settled(passes: list[PassDoc]) -> str | None:
    """Why the full passes can stop after the last one, or None to read again.

    What counts is whether reads still go to the origin: a pass that promoted nothing can
    still have missed (smq's promotions come in waves: a pass promoting nothing can be
    followed by one promoting many), so a quiet pass alone is not the end. Not on a
    plateaued read rate either: it can plateau while the CPU is the limit and part of
    the data is still on the origin only."""
    last = passes[-1]
    hit = hit_cache(last)
    if hit:
        return f"reads hit the cache: {hit} in the last pass"
    if last["stats"] is None:
        return "no cache statistics to follow" + still_missing(last)
    used, size = last["stats"].get("cache_used_bytes"), last["stats"].get("cache_total_bytes")
    if used and size and used >= FULL * size and not last["rising"]:
        return "the cache is full" + still_missing(last)
    known = last.get("from_origin") is not None or last.get("lookups") is not None
    quiet = [p for i, p in enumerate(passes) if i >= len(passes) - QUIET_PASSES
             and not p["rising"] and not falling(passes[i - 1] if i else None, p)]
    if len(quiet) == QUIET_PASSES or (not known and not last["rising"]):
        return "promotions and cache use stopped rising" + still_missing(last)
    return None


def origin_reads(path: Path, runner: Runner) -> Callable[[], int | None] | None:
    """A reader of the bytes read so far from the slow device behind the block cache that
    holds `path` (its /sys/class/block/.../stat), or None when there is none to find.
    The origin's own counter says what the caches' statistics may not: bcache folds its
    counters in every few seconds, dm-cache counts bios, and neither counts the reads
    its promotions make."""
    dev = os.stat(path).st_dev
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        top = Path(f"/sys/dev/block/{majmin}").resolve(strict=True)
        if (top / "dm").is_dir():     # dm-cache, lvmcache: the cache target's origin
            found = _cache_origin(majmin, runner)
        else:   # bcache: the backing device (of its two slaves, the one holding bcache/)
            found = (top / "bcache").resolve(strict=True).parent
    except (OSError, ValueError, HotcacheError):
        return None
    stat_file = found / "stat"

    def read() -> int | None:
        try:
            return int(stat_file.read_text().split()[2]) * 512
        except (OSError, ValueError, IndexError):
            return None
    return read


def _cache_origin(majmin: str, runner: Runner) -> Path:
    """The origin device under dm device `majmin`: its cache target's origin, through
    the linear top device raw dm-cache puts over the cache (the filesystem past
    hotcache's header on the origin). ValueError when there is no cache target."""
    for _ in range(2):
        major, minor = majmin.split(":")
        table = runner.run(["dmsetup", "table", "-j", major, "-m", minor]).stdout.strip()
        fields = table.split()
        if len(fields) == 5 and fields[2] == "linear" and ":" in fields[3]:
            majmin = fields[3]          # the top device: the cache device is under it
            continue
        return Path(f"/sys/dev/block/{parse_table(table).origin}").resolve(strict=True)
    raise ValueError(f"no dm-cache table under {majmin}")


@dataclass
class Reader:
    """Reads a list of files once and reports what the cache did meanwhile."""
    jobs: int
    evict: bool
    meter: NullMeter
    stats: Callable[[], CacheStats | None]
    last: CacheStats | None
    root_fd: int              # the folder being warmed: every file is opened beneath it

    origin: Callable[[], int | None] = lambda: None   # bytes read from the origin so far
    metadata: bool = True     # still allowed to drop dentries and inodes
    seconds: list[float] = field(default_factory=list)   # per file, of the last read

    def read(self, label: str, files: list[tuple[Path, int]], note: bool) -> ReadDoc:
        if self.evict and self.metadata:
            self.metadata = forget_metadata()
        self.meter.start(label, sum(size for _, size in files), len(files))
        origin0 = self.origin()
        t0 = time.monotonic()
        read, self.seconds = read_pass(files, self.jobs, self.evict, self.meter,
                                       self.root_fd)
        seconds = time.monotonic() - t0
        now, origin1 = self.stats(), self.origin()
        out: ReadDoc = {"bytes": read, "files": len(files), "seconds": round(seconds, 3),
               "mib_per_s": round(read / (1 << 20) / seconds, 1) if seconds else None,
               "files_per_s": round(len(files) / seconds, 1) if seconds else None,
               "promoted": max(0, promotions(now) - promotions(self.last)),
               "lookups": lookups(self.last, now),
               "from_origin": None if origin0 is None or origin1 is None else origin1 - origin0,
               "rising": rising(self.last, now), "stats": now}
        if note:
            self.meter.note(f"{label}: {out['files_per_s'] or 0:.0f} files/s, "
                            f"{out['promoted']} promoted (total {now.get('promotions') if now else None})"
                            f"{still_missing(out)}, cache used "
                            f"{units.size(now.get('cache_used_bytes') if now else None)}")
        self.last = now
        return out


def reread(reader: Reader, part: list[tuple[Path, int]], label: str,
           done: Callable[[list[ReadDoc]], bool] = window_done) -> RereadDoc:
    """Read a part of the files again and again, at most once per smq tick, until `done`
    says so."""
    reads: list[ReadDoc] = []
    while not reads or not done(reads):
        if reads and reads[-1]["seconds"] < TICK:
            time.sleep(TICK - reads[-1]["seconds"])   # a read in the same tick counts once
        reads.append(reader.read(f"{label}, read {len(reads) + 1}", part, note=False))
    promoted = sum(r["promoted"] for r in reads)
    reader.meter.note(f"{label}: {len(part)} files, {len(reads)} reads, {promoted} promoted")
    return {"files": len(part), "reads": len(reads), "promoted": promoted,
            "seconds": round(sum(r["seconds"] for r in reads), 3)}


def sweep(reader: Reader, files: list[tuple[Path, int]]) -> list[WindowDoc]:
    """Phase 1 for smq: each window read until its promotions stop (see the module doc)."""
    parts = windows(files)
    return [{"window": i, **reread(reader, part, f"warm window {i}/{len(parts)}")}
            for i, part in enumerate(parts, 1)]


def warm(path: Path, *, jobs: int = 0, max_passes: int = 8, state: Path | None = None,
         runner: Runner | None = None, meter: NullMeter | None = None,
         stats: Callable[[], CacheStats | None] | None = None, backend: str | None = None,
         origin: Callable[[], int | None] | None = None,
         order: Path | None = None) -> WarmReport:
    """Warm the cache(s) behind `path`; returns a report of every pass.

    With `order` (a file listing paths under `path`, the next epoch's order as the
    training adapters write it), read exactly those files once, in that order, into the
    page cache: a read-ahead of what the next epoch will read from the cold tier, not a
    block-cache warm-up (no eviction, no passes).

    `stats`, `backend` and `origin` (bytes read from the origin so far) override what the
    mapping and sysfs say (tests, or callers that already hold the mapping entry);
    normally they come from the entry whose mount holds `path`. `max_passes` bounds the
    full passes (block caches; after the focused sweep for dm-cache and lvmcache).
    """
    meter = meter or NullMeter()
    path = Path(os.path.abspath(path))
    if not path.exists():
        raise UsageError(f"{path} does not exist", hint="give a hot copy or a dataset folder")
    if max_passes < 1:
        raise UsageError(f"--max-passes {max_passes}: must be at least 1")
    cache = None
    if backend is None:
        found = backing(path, state)
        if found:
            cache, entry = found
            backend = entry.backend
            if block_cache(backend):
                runner = runner or Runner()
                stats = stats or backend_stats(entry, runner)
                origin = origin or origin_reads(path, runner)
    backend = backend or PLAIN
    stats = stats or (lambda: None)
    if order is not None and not path.is_dir():
        raise UsageError(f"--order needs a folder: {path} is not one",
                         hint="give the dataset folder the order file's paths are relative to")
    root_fd = beneath.open_root(path if path.is_dir() else path.parent)
    try:
        if order is not None:
            return _read_ahead(path, root_fd, Path(order), jobs, meter, backend, cache)
        return _warm(path, root_fd, jobs, max_passes, meter, stats, backend, origin, cache)
    finally:
        os.close(root_fd)


def _read_ahead(path: Path, root_fd: int, order: Path, jobs: int, meter: NullMeter,
                backend: str, cache: str | None) -> WarmReport:
    """One pass over the files `order` lists, in its order (with several readers each
    takes the next file in the list, so the reads run at most `jobs` files apart)."""
    files = ordered_files(root_fd, path, order)
    reader = Reader(jobs or default_jobs(), False, meter, lambda: None, None, root_fd)
    one = reader.read(f"read ahead in the order of {order.name}", files, note=False)
    return {"path": str(path), "files": len(files), "bytes": sum(s for _, s in files),
            "cache": cache, "backend": backend, "order": str(order),
            "evicted_before_reading": False, "metadata_reread": False, "sweep": [],
            "passes": [{"pass": 1, "readers": reader.jobs, **one}], "focus": [],
            "stopped": f"read the {len(files)} files {order} lists, in its order",
            "before": None, "after": None, "hit_ratio_before": None, "hit_ratio_after": None}


def _warm(path: Path, root_fd: int, jobs: int, max_passes: int, meter: NullMeter,
          stats: Callable[[], CacheStats | None], backend: str,
          origin: Callable[[], int | None] | None, cache: str | None) -> WarmReport:
    files = _listing(path, root_fd)
    facts = BACKENDS.get(backend)
    block = facts is not None and facts.block_cache
    smq = facts is not None and facts.promotes_gradually   # a sweep of windows first
    before = stats()
    reader = Reader(jobs or default_jobs(), block, meter, stats, before, root_fd,
                    origin or (lambda: None))
    swept = sweep(reader, files) if smq and before is not None else []
    passes, focused, reason = _full_passes(reader, files, block=block, smq=smq,
                                           max_passes=max_passes)
    last = reader.last
    return {"path": str(path), "files": len(files), "bytes": sum(size for _, size in files),
            "cache": cache, "backend": backend, "evicted_before_reading": block,
            "metadata_reread": block and reader.metadata, "sweep": swept,
            "passes": passes, "focus": focused, "stopped": reason,
            "before": before, "after": last,
            "hit_ratio_before": before.get("hit_ratio") if before else None,
            "hit_ratio_after": last.get("hit_ratio") if last else None}


def _listing(path: Path, root_fd: int) -> list[tuple[Path, int]]:
    """The files to warm: every one under a folder, or the one file given (none when it
    is not a regular file)."""
    if path.is_dir():
        return files_under(root_fd)
    st = os.stat(path.name, dir_fd=root_fd, follow_symlinks=False)
    return [(Path(path.name), st.st_size)] if stat.S_ISREG(st.st_mode) else []


def _full_passes(reader: Reader, files: list[tuple[Path, int]], *, block: bool, smq: bool,
                 max_passes: int) -> tuple[list[PassDoc], list[FocusDoc], str]:
    """Read every file, pass after pass, until _stop_reason says why to stop (one pass
    for the page cache alone); between two passes under smq, the slow files are re-read
    on their own. Returns the passes, the focused re-reads and why it stopped."""
    passes: list[PassDoc] = []
    focused: list[FocusDoc] = []
    limit = max_passes if block else 1
    while True:
        n = len(passes) + 1
        if smq and passes and passes[-1]["seconds"] < TICK:
            time.sleep(TICK - passes[-1]["seconds"])   # smq counts one hit per tick
        one = reader.read(_pass_label(n, limit, reader.jobs, block), files, note=block)
        passes.append({"pass": n, "readers": reader.jobs, **one})
        if not block:
            return passes, focused, "page cache: one pass"
        if _epoch_pass_due(passes, reader.jobs):
            reader.jobs = 1
            limit = max(limit, n + 1)
            continue
        reason = _stop_reason(passes, reader.jobs, limit, max_passes)
        if reason:
            return passes, focused, reason
        slow = slow_files(files, reader.seconds)
        if _focus_due(smq, slow, files):
            # like a window of the sweep, but only the files that still missed
            focused.append({"after_pass": n, **reread(
                reader, slow, f"warm: {len(slow)} slow files after pass {n}", focus_done)})


def _pass_label(n: int, limit: int, jobs: int, block: bool) -> str:
    """How the meter names pass `n` of at most `limit`."""
    label = f"warm pass {n}/{limit}" if limit > 1 else "warm"
    if jobs == 1 and block:
        label += " (one reader, as an epoch reads)"
    return label


def _epoch_pass_due(passes: list[PassDoc], jobs: int) -> bool:
    """Whether the last pass, read in parallel, settled with its reads hitting the cache,
    so that a pass with a single reader comes next. An epoch reads one file after
    another, and such a pass after a parallel warm that hit can still miss
    (BENCHMARKS.md): the last word goes to a pass read the way an epoch reads it (one
    past --max-passes if need be)."""
    return jobs > 1 and bool(settled(passes)) and bool(hit_cache(passes[-1]))


def _stop_reason(passes: list[PassDoc], jobs: int, limit: int, max_passes: int) -> str | None:
    """Why the full passes end after the last one (settled, or `limit` passes read), or
    None to read again."""
    stop = settled(passes)
    if stop and hit_cache(passes[-1]) and jobs == 1:
        stop += " (read by one reader, as an epoch reads)"
    if stop:
        return stop
    if len(passes) >= limit:
        return f"reached --max-passes {max_passes}" + still_missing(passes[-1])
    return None


def _focus_due(smq: bool, slow: list[tuple[Path, int]], files: list[tuple[Path, int]]) -> bool:
    """Whether the slow files of the last pass are re-read on their own before the next:
    under smq, when there are some and they are under FOCUS_SHARE of all."""
    return smq and bool(slow) and len(slow) < FOCUS_SHARE * len(files)

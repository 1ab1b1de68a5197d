"""`hotcache warm`: read every file under a path, in parallel, so that training's first
epoch finds it in the cache.

- No hotcache block cache behind the path (or backend `none`): one pass fills the page
  cache.
- bcache: one pass fills it (with sequential_cutoff 0, every read is cached).
- dm-cache / lvmcache: the smq policy promotes gradually, so warm works in two phases:
  1. a focused sweep: the files (in path order) are cut into about 8 windows by size and
     each window is read again and again, at most one read per second, until its
     promotions stop rising (at most WINDOW_READS reads). Why: smq (dm-cache-policy-smq.c)
     promotes a missed block only when its "hotspot" entry ranks high, raises an entry at
     most once per 1 s tick, and promotes eagerly only when a good share of recent
     lookups land on high-ranked entries. Re-reading one window across several ticks
     lifts exactly those entries above the rest; one read of everything per pass lifts
     every entry alike, which (measured: README, block-cache benchmark) left smq
     promoting only part of the data per pass.
  2. full passes over everything until the cache settles (`settled`): promotions and
     cache use stopped rising, or the last pass promoted under 0.2% of all promotions,
     at most `max_passes` times.
  Raising dm-cache's `migration_threshold` during warm would not help: in the kernel
  it only gates idle-time writeback (`spare_migration_bandwidth`); queued promotions are
  issued regardless (`smq_get_background_work`), so warm leaves the tunable alone.
For block caches, each file is dropped from the page cache (posix_fadvise DONTNEED)
before it is read, so every pass reaches the block device: without that, passes after
the first would be served from RAM and the block cache would never see them. This drops
only these files, not the whole host's page cache. The filesystem's own metadata (inodes,
directory blocks) would still stay in RAM and never reach the cache, so a cold start
(reboot, or a page cache dropped) would read it from the slow origin: measured in the VM
benchmark, the first cold pass after warm ran at 0.63x the bare SSD and the one after it
at 0.99x. So, as root, before each read warm also asks the kernel to drop reclaimable
dentries and inodes (`echo 2 > /proc/sys/vm/drop_caches`: no file data, nothing dirty;
the kernel rebuilds them on the next lookup), which makes the metadata go through the
block cache too (`metadata_reread` in the report).

The backend's `stats(entry, runner)` is read before and after (and after each pass):
hits, misses, hit_ratio, dirty_bytes, cache_used_bytes, cache_total_bytes, promotions,
policy, state.
"""

from __future__ import annotations

import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import HotcacheError, UsageError
from .filecopy import CHUNK, default_jobs
from .meter import NullMeter

REPEATING = ("dm-cache", "lvmcache")   # promote gradually: read until it stops rising
BLOCK_CACHES = ("bcache", *REPEATING)
WINDOWS = 8             # the focused sweep's windows, at most
MIN_WINDOW = 8 << 20    # bytes: smaller data sets get fewer windows
WINDOW_READS = 6        # reads of one window, at most
TICK = 1.1              # seconds: smq lifts a hotspot entry at most once per 1 s tick
DWINDLED = 2            # per mille: a pass promoting fewer of all promotions is the last


def files_under(path: Path) -> list[tuple[Path, int]]:
    """Regular files under `path` (symlinks are not followed), with their sizes."""
    if path.is_file():
        return [(path, path.stat().st_size)]
    out = []
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            p = Path(dirpath) / name
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out.append((p, st.st_size))
    return out


def read_file(path: Path, evict: bool, meter: NullMeter, local) -> int:
    buf = getattr(local, "buf", None)
    if buf is None:
        buf = local.buf = memoryview(bytearray(CHUNK))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    total = 0
    try:
        if evict:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while n := os.readv(fd, [buf]):
            total += n
            meter.advance(n)
    finally:
        os.close(fd)
    return total


def forget_metadata() -> bool:
    """Drop the kernel's clean dentries and inodes (not file data): the next lookups read
    the filesystem's metadata from the device again. False when not allowed (not root)."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        return True
    except OSError:
        return False


def read_pass(files: list[tuple[Path, int]], jobs: int, evict: bool, meter: NullMeter) -> int:
    import threading

    local = threading.local()
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="hotcache-warm") as pool:
        return sum(pool.map(lambda f: read_file(f[0], evict, meter, local), files))


def backing(path: Path, state: Path | None) -> tuple[str, dict] | None:
    from . import mapping
    from .copies import backing_cache

    spath = mapping.state_path(state and str(state))
    try:
        return backing_cache(path, mapping.load(spath)) if spath.exists() else None
    except (HotcacheError, OSError):
        return None   # an unreadable mapping: warm the page cache all the same


def backend_stats(entry: dict, runner) -> Callable[[], dict | None]:
    from .backends import get

    backend = get(entry["backend"])

    def read() -> dict | None:
        try:
            return backend.stats(entry, runner)
        except (HotcacheError, OSError, ValueError, KeyError):
            return None   # statistics are a report, not a reason to stop warming
    return read


def promotions(st: dict | None) -> int:
    return (st or {}).get("promotions") or 0


def rising(before: dict | None, after: dict | None) -> bool:
    """Did the cache take in more blocks during the last pass?"""
    if not before or not after:
        return False
    return any((after.get(k) or 0) > (before.get(k) or 0)
               for k in ("promotions", "cache_used_bytes"))


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


def window_done(reads: list[dict]) -> bool:
    """Stop re-reading a window once a read promoted nothing more after reads that did,
    or after three reads that promoted nothing at all (smq will not take it now)."""
    gains = [r["promoted"] for r in reads]
    if len(gains) >= WINDOW_READS:
        return True
    if gains[-1] > 0:
        return False
    return any(gains) or len(gains) >= 3


def settled(passes: list[dict]) -> str | None:
    """Why the full passes can stop after the last one, or None to read again.

    Not on a plateaued read rate: measured in the VM benchmark, the rate plateaued while
    the CPU was the limit and ~7% of the data was still on the origin only."""
    last = passes[-1]
    if last["stats"] is None:
        return "no cache statistics to follow"
    if not last["rising"]:
        return "promotions and cache use stopped rising"
    if last["promoted"] * 1000 < promotions(last["stats"]) * DWINDLED:
        return (f"promotions dwindled ({last['promoted']} in the last pass, "
                f"{promotions(last['stats'])} in all)")
    return None


@dataclass
class Reader:
    """Reads a list of files once and reports what the cache did meanwhile."""
    jobs: int
    evict: bool
    meter: NullMeter
    stats: Callable[[], dict | None]
    last: dict | None

    metadata: bool = True     # still allowed to drop dentries and inodes

    def read(self, label: str, files: list[tuple[Path, int]], note: bool) -> dict:
        if self.evict and self.metadata:
            self.metadata = forget_metadata()
        self.meter.start(label, sum(size for _, size in files))
        t0 = time.monotonic()
        read = read_pass(files, self.jobs, self.evict, self.meter)
        seconds = time.monotonic() - t0
        now = self.stats()
        out = {"bytes": read, "files": len(files), "seconds": round(seconds, 3),
               "mib_per_s": round(read / (1 << 20) / seconds, 1) if seconds else None,
               "files_per_s": round(len(files) / seconds, 1) if seconds else None,
               "promoted": max(0, promotions(now) - promotions(self.last)),
               "rising": rising(self.last, now), "stats": now}
        if note:
            self.meter.note(f"{label}: {out['files_per_s'] or 0:.0f} files/s, "
                            f"{out['promoted']} promoted (total {(now or {}).get('promotions')})"
                            f", cache used {(now or {}).get('cache_used_bytes')}")
        self.last = now
        return out


def sweep(reader: Reader, files: list[tuple[Path, int]]) -> list[dict]:
    """Phase 1 for smq: each window read until its promotions stop (see the module doc)."""
    out = []
    parts = windows(files)
    for i, part in enumerate(parts, 1):
        reads: list[dict] = []
        while not reads or not window_done(reads):
            if reads and reads[-1]["seconds"] < TICK:
                time.sleep(TICK - reads[-1]["seconds"])   # a read in the same tick counts once
            reads.append(reader.read(f"warm window {i}/{len(parts)}, read {len(reads) + 1}",
                                     part, note=False))
        promoted = sum(r["promoted"] for r in reads)
        reader.meter.note(f"window {i}/{len(parts)}: {len(part)} files, {len(reads)} reads, "
                          f"{promoted} promoted")
        out.append({"window": i, "files": len(part), "reads": len(reads),
                    "promoted": promoted, "seconds": round(sum(r["seconds"] for r in reads), 3)})
    return out


def warm(path: Path, *, jobs: int = 0, max_passes: int = 8, state: Path | None = None,
         runner=None, meter: NullMeter | None = None,
         stats: Callable[[], dict | None] | None = None, backend: str | None = None) -> dict:
    """Warm the cache(s) behind `path`; returns a report of every pass.

    `stats` and `backend` override what the mapping says (tests, or callers that already
    hold the mapping entry); normally both come from the entry whose mount holds `path`.
    `max_passes` bounds the full passes after the focused sweep (dm-cache, lvmcache).
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
            backend = entry.get("backend")
            if backend in BLOCK_CACHES and stats is None:
                from .runner import Runner

                stats = backend_stats(entry, runner or Runner())
    backend = backend or "none"
    stats = stats or (lambda: None)
    files = files_under(path)
    total = sum(size for _, size in files)
    block = backend in BLOCK_CACHES
    repeating = backend in REPEATING
    limit = max_passes if repeating else 1
    before = stats()
    reader = Reader(jobs or default_jobs(), block, meter, stats, before)
    swept = sweep(reader, files) if repeating and before is not None else []
    passes: list[dict] = []
    reason = "one pass fills it"
    for n in range(1, limit + 1):
        one = reader.read(f"warm pass {n}/{limit}" if limit > 1 else "warm", files,
                          note=repeating)
        passes.append({"pass": n, **one})
        if repeating:
            stop = settled(passes)
            reason = stop or f"reached --max-passes {max_passes}"
            if stop:
                break
    if not block:
        reason = "page cache: one pass"
    last = reader.last
    return {"path": str(path), "files": len(files), "bytes": total, "cache": cache,
            "backend": backend, "evicted_before_reading": block,
            "metadata_reread": block and reader.metadata, "sweep": swept,
            "passes": passes, "stopped": reason, "before": before, "after": last,
            "hit_ratio_before": (before or {}).get("hit_ratio"),
            "hit_ratio_after": (last or {}).get("hit_ratio")}

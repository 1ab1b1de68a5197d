"""`hotcache warm`: read every file under a path, in parallel, so that training's first
epoch finds it in the cache.

- No hotcache block cache behind the path (or backend `none`): one pass fills the page
  cache.
- bcache: one pass fills it (with sequential_cutoff 0, every read is cached).
- dm-cache / lvmcache: the smq policy promotes gradually, so warm reads again until
  neither `promotions` nor `cache_used_bytes` rises, at most `max_passes` times.
For block caches, each file is dropped from the page cache (posix_fadvise DONTNEED)
before it is read, so every pass reaches the block device: without that, passes after
the first would be served from RAM and the block cache would never see them. This drops
only these files, not the whole host's page cache.

The backend's `stats(entry, runner)` is read before and after (and after each pass):
hits, misses, hit_ratio, dirty_bytes, cache_used_bytes, cache_total_bytes, promotions,
policy, state.
"""

from __future__ import annotations

import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .errors import HotcacheError, UsageError
from .filecopy import CHUNK, default_jobs
from .meter import NullMeter

REPEATING = ("dm-cache", "lvmcache")   # promote gradually: read until it stops rising
BLOCK_CACHES = ("bcache", *REPEATING)


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


def rising(before: dict | None, after: dict | None) -> bool:
    """Did the cache take in more blocks during the last pass?"""
    if not before or not after:
        return False
    return any((after.get(k) or 0) > (before.get(k) or 0)
               for k in ("promotions", "cache_used_bytes"))


def warm(path: Path, *, jobs: int = 0, max_passes: int = 8, state: Path | None = None,
         runner=None, meter: NullMeter | None = None,
         stats: Callable[[], dict | None] | None = None, backend: str | None = None) -> dict:
    """Warm the cache(s) behind `path`; returns a report of every pass.

    `stats` and `backend` override what the mapping says (tests, or callers that already
    hold the mapping entry); normally both come from the entry whose mount holds `path`.
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
    limit = max_passes if backend in REPEATING else 1
    before = stats()
    passes, last, reason = [], before, "one pass fills it"
    for n in range(1, limit + 1):
        meter.start(f"warm pass {n}/{limit}" if limit > 1 else "warm", total)
        t0 = time.monotonic()
        read = read_pass(files, jobs or default_jobs(), block, meter)
        seconds = time.monotonic() - t0
        now_stats = stats()
        passes.append({"pass": n, "bytes": read, "seconds": round(seconds, 3),
                       "mib_per_s": round(read / (1 << 20) / seconds, 1) if seconds else None,
                       "stats": now_stats})
        if backend in REPEATING:
            meter.note(f"pass {n}: {read / (1 << 20) / max(seconds, 1e-9):.0f} MiB/s, "
                       f"promotions {(now_stats or {}).get('promotions')}, cache used "
                       f"{(now_stats or {}).get('cache_used_bytes')}")
            if not rising(last, now_stats):
                reason = ("promotions and cache use stopped rising" if now_stats
                          else "no cache statistics to follow")
                last = now_stats
                break
            reason = f"reached --max-passes {max_passes}"
        last = now_stats
    if not block:
        reason = "page cache: one pass"
    return {"path": str(path), "files": len(files), "bytes": total, "cache": cache,
            "backend": backend, "evicted_before_reading": block, "passes": passes,
            "stopped": reason, "before": before, "after": last,
            "hit_ratio_before": (before or {}).get("hit_ratio"),
            "hit_ratio_after": (last or {}).get("hit_ratio")}

"""The statistics a block cache reports (`Backend.stats`), as one typed shape.

They cross subsystems: status puts them in its row (`cache`), doctor, metrics, warm and
the working-set advice read them, and `hotcache status --json` prints them as they are.
A TypedDict rather than a class, so that at run time they stay the plain dict the JSON
documents are made of, while mypy checks every key a reader names.
"""

from __future__ import annotations

from typing import TypedDict


class _Common(TypedDict):
    """What every block cache reports (None: this backend cannot tell)."""
    mode: str                       # the cache mode the kernel runs: writeback, ...
    policy: str | None              # the replacement policy: smq, lru, ...
    state: str                      # clean, dirty, needs_check, ... (bcache: its own words)
    hits: int
    misses: int
    hit_ratio: float | None         # None before the first lookup
    dirty_bytes: int                # written to the cache only
    cache_used_bytes: int | None
    cache_total_bytes: int | None
    promotions: int | None          # None: bcache fills on every miss, it counts none


class CacheStats(_Common, total=False):
    """A block cache's statistics; the keys below are reported by some backends only."""
    demotions: int                  # dm-cache, lvmcache
    bypassed: int                   # bcache: I/Os sent past the cache
    priority: dict[str, int] | None  # bcache: buckets by state, in percent
    sequential_cutoff: int          # bcache

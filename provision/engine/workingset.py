"""A cache against its working set: sizing advice for `plan`, `status` and `doctor`, and
whether a block cache is thrashing.

What is to be cached is a dataset path (`plan --dataset`), the data on a block cache's
filesystem, or the hot copies on a plain SSD; the fast tier's capacity is the cache
device (block caches) or the filesystem (backend none). sizing.advise says which of the
three cases applies. A block cache that thrashes shows it in its counters: dm-cache and
lvmcache demote about as many blocks as they promote (each promotion evicts a block that
is needed again later); bcache shows no free buckets while it keeps missing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotcache.provision.backends import block_cache
from hotcache.provision.block import blockdev
from hotcache.provision.block.host import Host
from hotcache.provision.hotcopy.sizing import advise

if TYPE_CHECKING:
    from hotcache.provision.backends.parts.stats import CacheStats
    from hotcache.provision.engine.spec import CacheSpec, HostSpec
    from hotcache.provision.engine.statusrow import (BucketActivity, PromotionActivity,
                                                     RowFacts, Verdict)
    from hotcache.provision.hotcopy.sizing import AdviceDoc

THRASH_RATIO = 0.8        # demotions >= 80% of promotions over an interval: thrashing
FULL_UNUSED_PERCENT = 2   # bcache: at most this share of buckets unused counts as full


def dataset_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (symlinks not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(dirpath, name)):
                total += st.st_size
    return total


def fast_tier_bytes(cache: CacheSpec) -> int | None:
    """The size of a spec'd cache's fast device (the SSD; for backend none, the origin),
    from the loop image's size or the block device, None when it cannot be read."""
    ref = cache.cache if block_cache(cache.backend) else cache.origin
    if ref is None:
        return None
    if ref.loop is not None:
        return ref.loop.bytes
    try:
        return blockdev.size_bytes(Host(), ref.file)
    except OSError:
        return None


def plan_advice(host: HostSpec, datasets: list[Path]) -> list[dict[str, Any]]:
    """`plan --dataset PATH`: each dataset against each cache's fast tier."""
    out: list[dict[str, Any]] = []
    sizes = {str(d): dataset_bytes(d) for d in datasets}
    for cache in host.caches:
        capacity = fast_tier_bytes(cache)
        for d, need in sizes.items():
            if capacity is None:
                out.append({"cache": cache.name, "dataset": d, "case": None,
                            "message": f"{cache.name}: the fast device's size cannot be read"})
                continue
            tier = f"its {cache.backend} cache" if block_cache(cache.backend) else "its SSD"
            a = advise(need, capacity, f"{d}", f"{cache.name} ({tier})")
            out.append({"cache": cache.name, "dataset": d, **a.to_dict()})
    return out


def row_advice(row: RowFacts, copies: list[dict[str, Any]]) -> AdviceDoc | None:
    """A status row's working set against its fast tier: a block cache's filesystem data
    against the cache device; a plain SSD's hot copies against its filesystem."""
    stats = row.get("cache")
    if not block_cache(row["backend"]):
        need = sum(c.get("bytes") or 0 for c in copies)
        room = row["size_bytes"]
        if not need or not room:
            return None
        return advise(need, room, "the hot copies", f"{row['name']}'s filesystem").to_dict()
    total = stats.get("cache_total_bytes") if stats else None
    used = row["used_bytes"]
    if not total or used is None:
        return None
    return advise(used, total, f"the data on {row['name']}",
                  f"its {row['backend']} cache").to_dict()


def churn(before: CacheStats | None, after: CacheStats,
          seconds: float | None) -> BucketActivity | PromotionActivity | None:
    """dm-cache/lvmcache over an interval (or since the cache started, without `before`):
    promotions, demotions and the verdict; bcache: its buckets from priority_stats."""
    prio = after.get("priority")
    if prio is not None:       # bcache: no eviction counter, but a full set that misses
        full = prio.get("unused", 100) <= FULL_UNUSED_PERCENT
        missing = (after.get("hit_ratio") or 0) < 0.5
        seen: Verdict = "thrashing" if full and missing else "full" if full else "filling"
        bucket: BucketActivity = {"buckets": prio, "hit_ratio": after.get("hit_ratio"),
                                  "verdict": seen,
                                  "message": _bcache_message(seen, prio, after.get("hit_ratio"))}
        return bucket
    p, d = after.get("promotions"), after.get("demotions")
    if p is None or d is None:
        return None
    if before is not None:
        p, d = p - (before.get("promotions") or 0), d - (before.get("demotions") or 0)
    span = f"in {seconds:g} s" if before is not None and seconds else "since the cache started"
    verdict: Verdict
    if p <= 0:
        verdict, why = "settled", f"no promotions {span}"
    elif d >= THRASH_RATIO * p:
        verdict, why = "thrashing", (f"{d} demotions for {p} promotions {span}: the working "
                                     "set is larger than the cache; pin a subset with "
                                     "`hotcache copy SRC DEST --fit` instead")
    else:
        verdict, why = "filling", f"{p} promotions, {d} demotions {span}"
    moved: PromotionActivity = {
        "promotions": p, "demotions": d, "interval_s": seconds if before else None,
        "demotions_per_promotion": round(d / p, 3) if p > 0 else None,
        "verdict": verdict, "message": why}
    return moved


def _bcache_message(verdict: str, prio: dict[str, int], hit_ratio: float | None) -> str:
    shares = ", ".join(f"{k} {v}%" for k, v in prio.items())
    if verdict == "thrashing":
        return (f"no free buckets ({shares}) and a hit ratio of {hit_ratio}: the working set "
                "is larger than the cache; pin a subset with `hotcache copy SRC DEST --fit`")
    return f"buckets: {shares}"


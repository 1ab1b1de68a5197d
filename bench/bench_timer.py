"""Benchmark (c): what the timing wrapper costs per batch.

Baseline: the same items through a bare generator that only re-yields them (any
wrapper costs at least that). Measured: `timed(...)` with its defaults, logging on (INFO
to a handler that drops the records: the periodic summary every 100 batches is part of
the price) and logging off (no periodic work at all). Best of 5 rounds of 300,000 items,
all in this run. Goal: under 2 µs per batch over the bare loop.

    .venv/bin/python bench/bench_timer.py
"""

from __future__ import annotations

import logging
from time import perf_counter

from hotcache.adapters import timed

N = 300_000


def bare(items):
    yield from items


def consume(iterable) -> float:
    t0 = perf_counter()
    for _ in iterable:
        pass
    return perf_counter() - t0


def main() -> None:
    items = list(range(N))
    logger = logging.getLogger("hotcache.adapters")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    gen = min(consume(bare(items)) for _ in range(5))
    logger.setLevel(logging.INFO)
    on = min(consume(timed(items)) for _ in range(5))
    logger.setLevel(logging.WARNING)
    off = min(consume(timed(items)) for _ in range(5))
    print(f"per batch: bare generator {gen / N * 1e9:.0f} ns, timed() logging on "
          f"{on / N * 1e9:.0f} ns, logging off {off / N * 1e9:.0f} ns")
    print(f"timed() overhead over a bare generator: {(on - gen) / N * 1e6:.3f} µs with logging, "
          f"{(off - gen) / N * 1e6:.3f} µs without (goal < 2 µs); "
          f"ratio timed/bare = {on / gen:.1f}x / {off / gen:.1f}x")


if __name__ == "__main__":
    main()

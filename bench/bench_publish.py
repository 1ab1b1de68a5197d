"""Benchmark: what publishing the timing figures costs the training thread per batch.

Baseline: `timed(...)` with logging on and nothing published (bench_timer.py's
"logging on": a summary every 100 batches). Measured, in the same run, rounds
interleaved with the baseline's:
- pushgateway: timed(..., sinks=[Pushgateway(URL)]) with its background thread held
  still, so that only what the training thread does is counted (store the figures,
  wake the thread: once per window);
- tensorboard: timed(..., tensorboard=torch SummaryWriter) over a temporary folder
  (four scalars per window written on the training thread, as the loss is);
- both.
Medians of 7 rounds of 300,000 items each. Goal: under 2 µs per batch over the
baseline, as the timer itself.

    .venv/bin/python bench/bench_publish.py
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import threading
from time import perf_counter

from hotcache.adapters import timed
from hotcache.adapters.pushgateway import Pushgateway

N = 300_000
ROUNDS = 7


def consume(iterable) -> float:
    t0 = perf_counter()
    for _ in iterable:
        pass
    return perf_counter() - t0


class HeldStill(Pushgateway):
    """The publisher as the training thread sees it; its pushing thread never runs."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self.latest = {}
        self._pending = False
        self.node = "bench"


def main() -> None:
    from torch.utils.tensorboard import SummaryWriter

    items = list(range(N))
    logger = logging.getLogger("hotcache.adapters")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    logger.setLevel(logging.INFO)
    push = HeldStill()
    with tempfile.TemporaryDirectory() as folder:
        writer = SummaryWriter(folder)
        variants = {
            "timer": lambda: timed(items, tensorboard="", pushgateway=""),
            "pushgateway": lambda: timed(items, tensorboard="", pushgateway="", sinks=[push]),
            "tensorboard": lambda: timed(items, tensorboard=writer, pushgateway=""),
            "both": lambda: timed(items, tensorboard=writer, pushgateway="", sinks=[push]),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, make in variants.items():
                times[name].append(consume(make()))
        writer.close()
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["timer"]
    print(f"per batch, medians of {ROUNDS} rounds of {N:,}: " +
          ", ".join(f"{name} {t / N * 1e9:.0f} ns" for name, t in med.items()))
    for name in ("pushgateway", "tensorboard", "both"):
        print(f"{name}: {(med[name] - base) / N * 1e6:+.3f} µs per batch over the timer alone "
              f"(goal < 2 µs); ratio {med[name] / base:.2f}x; "
              f"{(med[name] - base) / (N / 100) * 1e6:.1f} µs per window of 100")


if __name__ == "__main__":
    main()

"""How long a training loop waits for each batch.

    for batch in timed(loader, name="train"):
        step(batch)

Each `next()` on the wrapped iterator is timed with `perf_counter`, the clock started
*before* the call (a timer started after `next()` returns measures nothing of the fetch).
The first batch (worker start-up, file opening) is kept apart from the steady state.
"Step time" is the time from one batch's arrival to the next one's: compute + wait.

The verdict uses the thresholds of the TensorFlow profiler's input-pipeline analysis
(and PyTorch's TensorBoard plugin warns from 5 %): waiting >= 20 % of step time is highly
input-bound, >= 5 % moderately.

Per batch the wrapper does two clock reads, one list append and a counter decrement;
all logging and statistics happen every `log_every` batches and at the end.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from time import perf_counter, time
from typing import Any, Generic, TypedDict, TypeVar, cast

from .figures import Summary as Summary   # re-exported: hotcache.adapters.timing.Summary
from .logs import log, mode, ready
from . import publish
from .publish import Sink
from .standin import StandsIn

ENV_LOG = "HOTCACHE_TIMING_LOG"
RANK_ENV = ("RANK", "LOCAL_RANK")     # torchrun's, Accelerate's and Lightning's
T = TypeVar("T")
# A batch's stamp: the worker seconds, or (seconds or None, hot samples, samples) when
# reads are tiered.
Stamp = float | tuple[float | None, int, int]
HIGHLY = 0.20
MODERATELY = 0.05


def verdict(wait_share: float | None) -> str:
    if wait_share is None:
        return "unknown"
    if wait_share >= HIGHLY:
        return "highly input-bound"
    if wait_share >= MODERATELY:
        return "moderately input-bound"
    return "not input-bound"


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not ordered:
        return 0.0
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def ranks() -> dict[str, int]:
    """{"rank": RANK, "local_rank": LOCAL_RANK} for those set to an integer."""
    found = {}
    for var in RANK_ENV:
        value = os.environ.get(var, "").strip()
        if value.lstrip("-").isdigit():
            found[var.lower()] = int(value)
    return found


def split_stamps(stamps: Sequence[Stamp] | None
                 ) -> tuple[Sequence[float] | None, list[tuple[int, int]] | None]:
    """Per-batch stamps -> (worker seconds, (hot, samples) pairs). A stamp is the worker
    seconds, or (seconds or None, hot samples, samples) when reads are tiered."""
    if not stamps or not isinstance(stamps[0], tuple):
        # every stamp of a list is of one kind, the first one's: here, seconds
        return cast("Sequence[float] | None", stamps or None), None
    tiered = cast("Sequence[tuple[float | None, int, int]]", stamps)
    secs = [s[0] for s in tiered if s[0] is not None]
    return (secs or None), [(s[1], s[2]) for s in tiered]


class TierFigures(TypedDict, total=False):
    """Summary's fields for tiered reads: all of them (tier_figures), or none."""

    hot_share: float | None
    hot_batches: int
    hot_wait_s: float | None
    cold_batches: int
    cold_wait_s: float | None


def tier_figures(tiers: list[tuple[int, int]], waits: list[float]) -> TierFigures:
    """Hot share of `tiers` and the mean wait of mostly-hot vs mostly-cold batches;
    `waits` belong to the last len(waits) batches of `tiers`."""
    samples = sum(n for _h, n in tiers)
    hot: list[float] = []
    cold: list[float] = []
    for (h, n), w in zip(tiers[len(tiers) - len(waits):], waits):
        (hot if 2 * h >= n else cold).append(w)

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {"hot_share": round(sum(h for h, _n in tiers) / samples, 4) if samples else None,
            "hot_batches": len(hot), "hot_wait_s": mean(hot),
            "cold_batches": len(cold), "cold_wait_s": mean(cold)}


def summarize(name: str, epoch: int, first: float | None, waits: list[float], wall: float,
              steps: int, worker_loads: Sequence[Stamp] | None = None, *,
              batches: int | None = None, window: int | None = None) -> Summary:
    """`wall` spans `steps` steps, from the first batch's arrival on. `worker_loads`:
    one stamp per batch (see split_stamps)."""
    worker_loads, tiers = split_stamps(worker_loads)
    ordered = sorted(waits)
    total = sum(ordered)
    # With one batch there is no steady state to judge.
    share = total / wall if ordered and wall > 0 else None
    loads = sum(worker_loads) if worker_loads else None
    per_batch = loads / len(worker_loads) if loads is not None and worker_loads else None
    if batches is None:
        batches = len(ordered) + (first is not None)
    return Summary(name, epoch, batches, first, total,
                   _percentile(ordered, 50), _percentile(ordered, 95), _percentile(ordered, 99),
                   ordered[-1] if ordered else 0.0, wall / steps if steps else 0.0, wall,
                   share, verdict(share), loads,
                   per_batch, window,
                   **(tier_figures(tiers, waits) if tiers else {}), **ranks())


class BatchTimer(StandsIn, Generic[T]):
    """Wrap an iterable; each `iter()` over it is one epoch, timed batch by batch.

    log_every: log (and write a JSON line) every N batches; 0 logs only at the end.
    log_path:  append JSON lines here (default: $HOTCACHE_TIMING_LOG, if set).
    stamped:   the iterable yields (batch, worker_seconds) pairs; the timer keeps the
               seconds apart (workers' load time) and yields only the batch.
    clock:     seconds, monotonic (perf_counter; tests pass a fake one).
    tensorboard: write the figures as TensorBoard scalars to this writer or folder
               (default: $HOTCACHE_TENSORBOARD); see publish.py.
    pushgateway: push them to this Pushgateway (default: $HOTCACHE_PUSHGATEWAY); see
               pushgateway.py. "" turns either off whatever the environment says.
    sinks:     more callables `sink(summary, final, step)`, called at each window and
               epoch with the global step (the batch's index across epochs).
    """

    def __init__(self, iterable: Iterable[T], *, name: str = "batches", log_every: int = 100,
                 log_path: str | os.PathLike[str] | None = None,
                 logger: logging.Logger | None = None, stamped: bool = False,
                 clock: Callable[[], float] = perf_counter, tensorboard: Any = None,
                 pushgateway: str | None = None, sinks: Iterable[Sink] = ()) -> None:
        self.iterable = iterable
        self.clock = clock
        self.name = name
        self.log_every = log_every
        self.log_path = log_path if log_path is not None else os.environ.get(ENV_LOG) or None
        self.logger = logger or log
        self.stamped = stamped
        self.epoch = -1
        self.summaries: list[Summary] = []
        self.sinks: list[Sink] = [*publish_sinks(tensorboard, pushgateway), *sinks]
        self.step = 0           # batches delivered in the epochs before this one
        self._reset()

    def _reset(self) -> None:
        self.first: float | None = None
        self.waits: list[float] = []
        self.worker_loads: list[Stamp] = []
        self._t_first = self._t_last = self._t_window = 0.0
        self._ended = False    # the last step (after the last batch) is inside the wall time

    def __iter__(self) -> Iterator[T]:
        return self.run(self.epoch + 1)

    def run(self, epoch: int) -> Iterator[T]:
        """One epoch, numbered `epoch`, timed (from the first next() on)."""
        self.epoch = epoch
        self._reset()
        # tf.data with tiered reads: the pipeline logs each batch's hot count, in order.
        tier_log = getattr(self.iterable, "_hotcache_tiers", None)
        if tier_log is not None:
            tier_log.clear()
        it = iter(self.iterable)
        self._tiered = tier_log is not None
        if tier_log is not None:
            it = tier_log.stamp(it)
        clock = self.clock
        waits = self.waits
        record = waits.append
        loads = self.worker_loads.append
        stamped = self.stamped or self._tiered
        # No periodic work at all when nobody would read it.
        target = ready(self.logger)
        every = self.log_every if (self.log_path or self.sinks or (
            target is not None and target.isEnabledFor(logging.INFO))) else 0
        countdown = every or -1
        t0 = clock()
        try:
            item = next(it)
        except StopIteration:
            return
        self._t_first = self._t_last = t = clock()
        self.first = t - t0
        try:
            if stamped:
                item, load = item
                loads(load)
            yield item
            while True:
                t0 = clock()
                try:
                    item = next(it)
                except StopIteration:
                    self._t_last = t0
                    break
                self._t_last = t = clock()
                record(t - t0)
                if stamped:
                    item, load = item
                    loads(load)
                countdown -= 1
                if not countdown:
                    countdown = every
                    self._emit(self._window(every, t), final=False)
                yield item
        finally:
            if self._t_last == t:
                # The consumer stopped early (break, exception): its last step ends now.
                self._t_last = self.clock()
            self._ended = True
            summary = self.summary()
            self.summaries.append(summary)
            self._emit(summary, final=True)
            self.step += summary.batches

    def _window(self, n: int, now: float) -> Summary:
        """The last `n` batches only: a periodic line must not re-sort the whole epoch."""
        window = self.waits[-n:]
        start = self._t_window if self._t_window else self._t_first
        self._t_window = now
        return summarize(self.name, self.epoch, self.first, window, now - start, len(window),
                         self.worker_loads[-n:] if self._stamps() else None,
                         batches=len(self.waits) + 1, window=len(window))

    def summary(self) -> Summary:
        """The current (or last) epoch's figures; cheap enough to call any time."""
        wall = self._t_last - self._t_first
        steps = len(self.waits) + self._ended
        return summarize(self.name, max(self.epoch, 0), self.first, self.waits, wall, steps,
                         self.worker_loads if self._stamps() else None)

    def _stamps(self) -> bool:
        return self.stamped or getattr(self, "_tiered", False)

    def _emit(self, summary: Summary, *, final: bool) -> None:
        emit(summary, final=final, logger=self.logger, log_path=self.log_path)
        # The global step of the last batch the figures cover.
        step = self.step + max(summary.batches - 1, 0)
        for sink in self.sinks:
            sink(summary, final, step)


def emit(summary: Summary, *, final: bool, logger: logging.Logger = log,
         log_path: str | os.PathLike[str] | None = None) -> None:
    """Log a summary, and append it as one JSON line to `log_path` when given."""
    target = ready(logger)
    if target is not None and target.isEnabledFor(logging.INFO):
        if mode() == "json":
            target.info("%s", json.dumps({**summary.to_dict(), "final": final}))
        else:
            target.info("%s%s", "timing " if final else "timing (so far) ", summary.line())
    if log_path:
        record = {**summary.to_dict(), "final": final, "time": time(), "pid": os.getpid()}
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")


def timed(iterable: Iterable[T], *, name: str = "batches", log_every: int = 100,
          log_path: str | os.PathLike[str] | None = None, logger: logging.Logger | None = None,
          stamped: bool = False, clock: Callable[[], float] = perf_counter,
          tensorboard: Any = None, pushgateway: str | None = None,
          sinks: Iterable[Sink] = ()) -> BatchTimer[T]:
    """`BatchTimer(iterable, ...)`: time every batch fetch of any iterable; with
    `tensorboard=` / `pushgateway=`, publish the figures there too (publish.py)."""
    return BatchTimer(iterable, name=name, log_every=log_every, log_path=log_path,
                      logger=logger, stamped=stamped, clock=clock, tensorboard=tensorboard,
                      pushgateway=pushgateway, sinks=sinks)


def publish_sinks(tensorboard: Any = None, pushgateway: str | None = None) -> list[Sink]:
    """The sinks asked for by argument or environment; none loads a writer (TensorBoard's,
    the Pushgateway's) unless one is asked for."""
    if tensorboard is None and pushgateway is None and not (
            os.environ.get("HOTCACHE_TENSORBOARD") or os.environ.get("HOTCACHE_PUSHGATEWAY")):
        return []
    return publish.sinks(tensorboard, pushgateway)

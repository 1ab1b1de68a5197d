"""Lightning: the training loop's input wait in the trainer's own logger(s).

    from hotcache.adapters.lightning import DataWaitMonitor
    trainer = Trainer(callbacks=[DataWaitMonitor()])      # beside the loss, in its logger

The scalars of publish.py (`input/wait_p50_ms`, ... per window, `input/epoch/...` per
epoch) go to every logger of the trainer (`log_metrics`, at the trainer's global step),
as LearningRateMonitor's and DeviceStatsMonitor's figures do.

Over a make_loader loader the figures are the loader's own (each fetch timed where the
loop asks for it, workers' time apart), one window per its `log_every` batches, and the
epoch's figures when Lightning ends the epoch (Lightning stops reading a loader of known
length after its last batch, so the loader's own end of epoch comes late or never). Over any
other DataLoader the callback times the loop from its hooks: the time from the end of a
batch (or the epoch's start) to the start of the next, which also holds Lightning's own
work between them (moving the batch to the device, the hooks of other callbacks); one
window per `log_every` batches (default: the trainer's `log_every_n_steps`).
Importing this module imports Lightning (`lightning`, else `pytorch_lightning`).
"""

from __future__ import annotations

from dataclasses import replace
from time import perf_counter
from typing import TYPE_CHECKING, Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:       # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment,no-redef,unused-ignore]

from .publish import Sink, logger_sink
from .timedloader import TimedLoader
from .figures import Summary
from .timing import BatchTimer, summarize

if TYPE_CHECKING:     # the hooks' argument types; the standalone package has the same
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.utilities.types import STEP_OUTPUT


def _loaders(iterables: Any) -> list[Any]:
    """The loaders inside what `trainer.train_dataloader` gives (one, a list, a dict)."""
    if isinstance(iterables, dict):
        return [x for v in iterables.values() for x in _loaders(v)]
    if isinstance(iterables, (list, tuple)):
        return [x for v in iterables for x in _loaders(v)]
    return [iterables] if iterables is not None else []


class DataWaitMonitor(Callback):
    """Logs the input-wait figures through the trainer's loggers (see the module doc)."""

    def __init__(self, log_every: int | None = None, name: str = "train") -> None:
        self.log_every = log_every
        self.name = name
        self.summaries: list[Summary] = []
        self._timers: list[BatchTimer[Any]] = []
        self._sink: Sink | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._sink = logger_sink(lambda: trainer.loggers, lambda: trainer.global_step)
        timed = [x for x in _loaders(trainer.train_dataloader) if isinstance(x, TimedLoader)]
        self._timers = [x.timer for x in timed]
        for timer in self._timers:
            timer.sinks.append(self._windows)
        # Lightning's logger connector sets log_every_n_steps; Trainer does not declare it.
        self._every: int = self.log_every if self.log_every is not None \
            else trainer.log_every_n_steps  # type: ignore[attr-defined]

    def _windows(self, summary: Summary, final: bool, step: int) -> None:
        """A make_loader loader's windows; its epochs are published at on_train_epoch_end."""
        if not final:
            self._publish(summary, final=False)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for timer in self._timers:
            if self._windows in timer.sinks:
                timer.sinks.remove(self._windows)
        self._timers = []

    # Any other loader: timed from the hooks.
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch = trainer.current_epoch
        self._first: float | None = None
        self._waits: list[float] = []
        self._t_first = self._t_window = 0.0
        self._t_asked = self._t_end = perf_counter()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._timers:
            return
        wait = perf_counter() - self._t_asked
        if self._first is None:
            self._first = wait
            self._t_first = self._t_window = perf_counter()
        else:
            self._waits.append(wait)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: STEP_OUTPUT,
                           batch: Any, batch_idx: int) -> None:
        if self._timers:
            return
        self._t_asked = self._t_end = now = perf_counter()
        n = self._every
        if n and self._waits and len(self._waits) % n == 0:
            window = self._waits[-n:]
            summary = summarize(self.name, self._epoch, self._first, window,
                                now - self._t_window, len(window),
                                batches=len(self._waits) + 1, window=len(window))
            self._t_window = now
            self._publish(summary, final=False)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for timer in self._timers:
            summary = replace(timer.summary(), epoch=trainer.current_epoch)
            self.summaries.append(summary)
            self._publish(summary, final=True)
        if self._timers or self._first is None:
            return
        summary = summarize(self.name, self._epoch, self._first, self._waits,
                            self._t_end - self._t_first, len(self._waits))
        self.summaries.append(summary)
        self._publish(summary, final=True)

    def _publish(self, summary: Summary, *, final: bool) -> None:
        if self._sink is not None:
            self._sink(summary, final, 0)        # the step is the trainer's

"""Where the timing figures go besides the log lines: TensorBoard scalars beside the
loss, and a Prometheus Pushgateway beside the cache's own metrics.

    timed(loader, tensorboard=writer)       # a torch SummaryWriter, a tf.summary writer,
                                            # or a folder (HOTCACHE_TENSORBOARD=DIR)
    timed(loader, pushgateway="http://pushgw:9091")        # or HOTCACHE_PUSHGATEWAY=URL

The scalars, for each logging window (every `log_every` batches) under `input/` and for
each epoch under `input/epoch/`, at the global step (the batch's index since the timer
was made, counted across epochs; Keras and Lightning use their own step):

    wait_p50_ms, wait_p95_ms   the batch wait's median and 95th percentile, milliseconds
    waiting_share              the share of step time spent waiting, 0..1
    hot_fraction               the share of samples read from a hot copy, 0..1: measured
                               per batch where reads are tiered (DATA_COLD_ROOT), else 1
                               when the process's data root is a hot copy and 0 when not;
                               left out when the process resolved no data root

A sink is called on the training thread once per window and once per epoch, never per
batch. The TensorBoard sink writes through the writer there (as the loss is written);
the Pushgateway sink only hands the figures to a background thread (pushgateway.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from .figures import Summary, data_root_now, figures

ENV_TENSORBOARD = "HOTCACHE_TENSORBOARD"
ENV_PUSHGATEWAY = "HOTCACHE_PUSHGATEWAY"
WINDOW, EPOCH = "input/", "input/epoch/"


# sink(summary, final, step): final for an epoch's summary, else a window's.
Sink = Callable[[Summary, bool, int], None]


class MetricsLogger(Protocol):
    """What logger_sink writes through: a Lightning logger's `log_metrics`."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


def scalars(summary: Summary, final: bool, root: Any = None) -> dict[str, float]:
    """TensorBoard tags and values: `input/NAME` for a window, `input/epoch/NAME` for an
    epoch."""
    prefix = EPOCH if final else WINDOW
    return {prefix + name: value for name, value in figures(summary, root).items()}


def _tf_summary_writer(writer: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(writer, tf.summary.SummaryWriter)


def _keras_tensorboard(target: Any) -> bool:
    """A keras.callbacks.TensorBoard: its own "train" writer, beside Keras's loss."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(target, keras.callbacks.TensorBoard)


def open_writer(folder: str | os.PathLike[str]) -> Any:
    """A writer of event files in `folder`: TensorFlow's when TensorFlow is loaded (it
    needs no tensorboard package), else torch's SummaryWriter when torch is loaded, else
    the tensorboard package's own."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"].summary.create_file_writer(os.fspath(folder))
    if "torch" in sys.modules:
        # the writer of the framework already loaded: never load another one for it
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(os.fspath(folder))
    try:    # an optional package, loaded only when a TensorBoard folder is named
        from tensorboard.summary import Writer  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as exc:
        raise ImportError(f"tensorboard={folder}: writing TensorBoard event files without "
                          "torch or TensorFlow needs the tensorboard package "
                          "(pip install tensorboard)") from exc
    return Writer(os.fspath(folder))


class TensorBoard:
    """Writes each summary's scalars to `target`: an object with `add_scalar(tag, value,
    step)` (torch's SummaryWriter, tensorboardX's, tensorboard's own), a tf.summary
    writer, a keras.callbacks.TensorBoard (into its "train" run, beside the loss), or a
    folder, where this sink opens a writer of its own and flushes it at each epoch's
    end."""

    def __init__(self, target: Any):
        self.owned = isinstance(target, (str, os.PathLike))
        self.keras = target if _keras_tensorboard(target) else None
        if self.keras is not None:
            return                  # its writer exists once Keras gave it the model
        self.writer = open_writer(target) if self.owned else target
        self._tf = _tf_summary_writer(self.writer)
        if not self._tf and not callable(getattr(self.writer, "add_scalar", None)):
            raise TypeError(f"tensorboard={target!r}: give a folder, a SummaryWriter (with "
                            "add_scalar), a tf.summary writer or a keras TensorBoard callback")

    def __call__(self, summary: Summary, final: bool, step: int) -> None:
        values = scalars(summary, final, data_root_now())
        if self.keras is not None:
            # Keras's own writer of its "train" run, the file a running TensorBoard
            # follows there (a second file in that folder would not be followed).
            self._write_tf(self.keras._train_writer, values, step)
        elif self._tf:
            self._write_tf(self.writer, values, step)
        else:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, step)
        if final and self.owned:
            self.writer.flush()

    @staticmethod
    def _write_tf(writer: Any, values: dict[str, float], step: int) -> None:
        tf = sys.modules["tensorflow"]
        with writer.as_default():
            for tag, value in values.items():
                tf.summary.scalar(tag, value, step=step)

    def close(self) -> None:
        if self.owned:
            self.writer.close()


def sinks(tensorboard: Any = None, pushgateway: str | None = None) -> list[Sink]:
    """The sinks the arguments (or HOTCACHE_TENSORBOARD / HOTCACHE_PUSHGATEWAY) ask for;
    pass "" (or False) to turn one off whatever the environment says."""
    out: list[Sink] = []
    if tensorboard is None:
        tensorboard = os.environ.get(ENV_TENSORBOARD) or None
    if tensorboard not in (None, "", False):
        out.append(TensorBoard(tensorboard))
    if pushgateway is None:
        pushgateway = os.environ.get(ENV_PUSHGATEWAY) or None
    if pushgateway:
        from .pushgateway import publisher   # start-up: urllib.request only with a Pushgateway

        out.append(publisher(pushgateway))
    return out


def logger_sink(loggers: Callable[[], Sequence[MetricsLogger]], step: Callable[[], int]) -> Sink:
    """A sink that logs through loggers with Lightning's `log_metrics(metrics, step)`,
    at the step `step()` says (the trainer's global step)."""
    def log(summary: Summary, final: bool, _step: int) -> None:
        values = scalars(summary, final, data_root_now())
        for lg in loggers():
            lg.log_metrics(values, step=step())
    return log

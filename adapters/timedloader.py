"""The DataLoader make_loader returns: a real `torch.utils.data.DataLoader`, timed.

Accelerate's `prepare()` and Lightning read a loader's DataLoader attributes (dataset,
sampler, batch_sampler, collate_fn, num_workers...) and Accelerate builds its own
DataLoader from them. So a TimedLoader *is* a DataLoader of the user's dataset with the
user's options: rebuilt by Accelerate it still yields the same batches. Iterating a
TimedLoader itself reads through a second DataLoader over the same sampler, whose
samples come stamped with the seconds the workers took to load them (the figure the
timing summary shows apart from the loop's wait).

Epochs, as Accelerate's loaders count them: an iteration read to its end advances the
epoch, one left early (a `next(iter(loader))` peek, a `break`) does not, and
`set_epoch(e)` sets the next one (a resumed job). The loader sets the epoch only of a
sampler make_loader created; a sampler of the user's keeps the epoch its owner (the
user, Lightning) gives it with `sampler.set_epoch(e)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from .prefetch import ThreadPrefetch
from .timing import BatchTimer, Stamp, Summary


class Batch:
    """A batch decoded in place: images N×C×H×W uint8, labels collated as DataLoader
    would collate the targets, `targets` the targets themselves."""

    __slots__ = ("images", "labels", "targets", "hot")

    def __init__(self, images: torch.Tensor, targets: list[Any], hot: int | None = None,
                 labels: Any = None) -> None:
        self.images, self.targets = images, targets
        self.labels = torch.tensor(targets) if labels is None else labels
        self.hot = hot                        # tiered reads: samples served hot

    def samples(self) -> list[tuple[torch.Tensor, Any]]:
        return list(zip(self.images, self.targets))


class BatchCollate:
    """The collate function of a dataset that may hand whole decoded batches (Batch):
    [images, labels] for those (the user's collate_fn gets the samples), the user's
    collate_fn (or DataLoader's default) for anything else. It is the loader's
    `collate_fn`, so a DataLoader rebuilt from the loader's attributes (Accelerate)
    collates the same way."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        self.user_collate = collate_fn
        self.collate_fn = collate_fn or default_collate

    def __call__(self, samples: Any) -> Any:
        if isinstance(samples, Batch):
            if self.user_collate is None:
                return [samples.images, samples.labels]
            samples = samples.samples()
        return self.collate_fn(samples)


class Stamped(Dataset[Any]):
    """Runs in the workers: each sample (or batch) comes with the seconds it took to load,
    and for tiered reads (seconds, hot samples[, samples]): which tier served it."""

    def __init__(self, dataset: Any) -> None:    # map-style: len(), [i], maybe __getitems__
        self.dataset = dataset
        self.tiered = getattr(dataset, "tiers", None) is not None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, float | tuple[float, bool | None]]:
        t0 = perf_counter()
        if self.tiered:
            sample, hot = self.dataset.fetch(index)
            return sample, (perf_counter() - t0, hot)
        sample = self.dataset[index]
        return sample, perf_counter() - t0

    def __getitems__(self, indices: list[int]
                      ) -> list[tuple[Any, float | tuple[float, bool | None]]] | Loaded:
        batched = getattr(self.dataset, "__getitems__", None)
        if batched is None or (self.tiered and not self.dataset.batches):
            return [self[i] for i in indices]
        t0 = perf_counter()
        samples = batched(indices)
        seconds = perf_counter() - t0
        hot = getattr(samples, "hot", None)
        return Loaded(samples, seconds if hot is None else (seconds, hot, len(indices)))


class Loaded:
    """What a batched fetch hands to the collate function: the batch and its load time."""

    __slots__ = ("samples", "seconds")

    def __init__(self, samples: Any, seconds: float | tuple[float, int, int]) -> None:   # tiered: (s, hot, n)
        self.samples, self.seconds = samples, seconds


class StampedCollate:
    """Collate the samples as the loader's collate_fn does; add up their load seconds."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, stamped: Loaded | list[tuple[Any, Any]]) -> tuple[Any, Stamp]:
        if isinstance(stamped, Loaded):
            return self.collate_fn(stamped.samples), stamped.seconds
        batch = self.collate_fn([s for s, _ in stamped])
        if stamped and isinstance(stamped[0][1], tuple):     # tiered: (seconds, hot)
            return batch, (sum(t for _, (t, _h) in stamped),
                           sum(1 for _, (_t, h) in stamped if h), len(stamped))
        return batch, sum(t for _, t in stamped)


class TimedLoader(DataLoader[Any]):
    """A DataLoader whose every batch fetch is timed (see BatchTimer): `summary()`,
    `summaries`, `worker_loads`; `reader` is the DataLoader that reads the stamped
    samples, `iterable` what the timer iterates (it, or a read-ahead thread over it).

    own_sampler: the sampler make_loader created (a DistributedSampler, EpochOrder), whose
    epoch this loader sets; None when the order is the user's or DataLoader's own."""

    # Set on the loader after it is made (Lightning sets worker_init_fn to seed the
    # workers): the reader, which runs the workers, takes them too.
    MIRRORED = frozenset({"worker_init_fn", "timeout", "generator", "multiprocessing_context",
                          "pin_memory", "pin_memory_device", "in_order"})

    def __init__(self, dataset: Dataset[Any], *, stamped: bool = True, own_sampler: Any = None,
                 read_ahead: int = 0, name: str = "train", log_every: int = 100,
                 log_path: str | os.PathLike[str] | None = None, clock: Callable[[], float] = perf_counter,
                 tensorboard: Any = None, pushgateway: str | None = None, sinks: Any = (),
                 **options: Any) -> None:
        # Every argument is kept under its own name, so that a DataLoader rebuilt from the
        # attributes (Lightning, to add a sampler) is a TimedLoader like this one.
        super().__init__(dataset, **options)
        self.stamped, self.read_ahead, self.name = stamped, read_ahead, name
        self.log_every, self.log_path, self.clock = log_every, log_path, clock
        reader_options = {**options, "collate_fn": self.collate_fn}
        if stamped:
            reader_options["collate_fn"] = StampedCollate(self.collate_fn)
        if reader_options.get("batch_sampler") is None and not isinstance(dataset, IterableDataset):
            # The same sampler object (a shuffle's generator state, a DistributedSampler's
            # epoch), whoever set it up: DataLoader's own, or the one given.
            reader_options.update(sampler=self.sampler, shuffle=None)
        self.reader = DataLoader(Stamped(dataset) if stamped else dataset, **reader_options)
        source = ThreadPrefetch(self.reader, read_ahead) if read_ahead else self.reader
        self.timer: BatchTimer[Any] = BatchTimer(source, stamped=stamped, name=name,
                                                 log_every=log_every, log_path=log_path, clock=clock,
                                                 tensorboard=tensorboard, pushgateway=pushgateway,
                                                 sinks=sinks)
        # Resolved into the timer's sinks: a loader rebuilt from these attributes
        # (Lightning) publishes through the same ones, not a second set.
        self.tensorboard, self.pushgateway, self.sinks = "", "", self.timer.sinks
        # Only while it is still the sampler read (a rebuilt loader may have another).
        read = (self.sampler, getattr(self.batch_sampler, "sampler", None))
        self.own_sampler = own_sampler if any(own_sampler is s for s in read) else None
        self._next_epoch = 0

    def __setattr__(self, attr: str, value: Any) -> None:
        super().__setattr__(attr, value)
        reader = self.__dict__.get("reader")
        if reader is not None and attr in self.MIRRORED:
            setattr(reader, attr, value)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator, not DataLoader's iterator class
        epoch = self._epoch_now()
        yield from self.timer.run(epoch)
        # Read to its end (a loop that stops early, or a peek, does not get here).
        self._next_epoch = epoch + 1
        if self.own_sampler is not None:
            self.own_sampler.epoch = epoch + 1

    def _epoch_now(self) -> int:
        """The epoch about to be read: the sampler's own where it has one (make_loader's,
        or a user's DistributedSampler), else this loader's count."""
        sampler = self.batch_sampler.sampler if self.batch_sampler is not None and \
            hasattr(self.batch_sampler, "sampler") else self.sampler
        epoch = getattr(sampler, "epoch", None)
        return epoch if isinstance(epoch, int) else self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (a job resumed at epoch `epoch`), passed
        to the sampler, batch sampler or dataset that has a set_epoch, as Accelerate's
        loaders do."""
        self._next_epoch = epoch
        parts = (self.batch_sampler, getattr(self.batch_sampler, "sampler", None),
                 self.sampler, self.dataset)
        for part in {id(p): p for p in parts if p is not None}.values():   # each once
            set_epoch = getattr(part, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    @property
    def iterable(self) -> Any:
        return self.timer.iterable

    @property
    def epoch(self) -> int:
        """The epoch of the last iteration started (-1 before the first)."""
        return self.timer.epoch

    @property
    def summaries(self) -> list[Summary]:
        return self.timer.summaries

    @property
    def worker_loads(self) -> list[Stamp]:
        return self.timer.worker_loads

    def summary(self) -> Summary:
        return self.timer.summary()

"""PyTorch: an image-folder Dataset under DATA_ROOT and a timed DataLoader.

    from hotcache.adapters import make_loader
    loader = make_loader(batch_size=64, image_size=(224, 224))   # reads DATA_ROOT
    for epoch in range(3):
        for images, labels in loader:        # every fetch timed, logged every 100 batches
            ...
    print(loader.summary().line())

The loader's workers time each sample they load and send the seconds along with the
batch, so the summary shows the workers' loading time apart from how long the training
loop itself waited. Importing this module imports torch; `hotcache.adapters` does not.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from time import perf_counter
from typing import IO, TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch
from torch.utils.data import (Dataset, DistributedSampler, IterableDataset, Sampler, default_collate,
                              get_worker_info)

from .dataroot import data_root
from .decode import check_resample, decode_array, pillow_decode
from .retry import read_bytes
from .imagefolder import TORCHVISION, Samples, list_image_folder
from .order import ENV_ORDER, cold_order, write_order
from .tiered import Tiers, list_tiered
from .timedloader import Batch, BatchCollate, TimedLoader

if TYPE_CHECKING:
    from typing import Unpack       # mypy reads it; Python 3.10 never imports it

    import PIL.Image

__all__ = ["ImageFolderDataset", "TimedLoader", "make_loader", "decode_image", "to_tensor"]


def decode_image(path: str | os.PathLike[str] | IO[bytes], image_size: tuple[int, int] | None = None, draft: bool = True,
                 resample: str = "bilinear") -> PIL.Image.Image:
    """A JPEG/PNG file as a PIL RGB image, resized to image_size=(height, width) when asked.

    draft: a JPEG that is to be shrunk is decoded at the smallest DCT scale (1/2, 1/4,
    1/8) that still covers `image_size` (Pillow's `draft`, libjpeg's scaled decoding),
    then resized: several times less decoding for nearly the same pixels.
    resample: the resize filter, "bilinear" by default (tf.image.resize's default);
    Pillow's own default, bicubic, costs about twice as much."""
    return pillow_decode(path, image_size, draft, check_resample(resample))


def to_tensor(img: PIL.Image.Image) -> torch.Tensor:
    """PIL image -> uint8 tensor C×H×W (no scaling: do that on the accelerator)."""
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


class ImageFolderDataset(Dataset[tuple[Any, Any]]):
    """root/<class>/<image>: class folders, sorted by name, give labels 0..n-1, listed as
    torchvision's ImageFolder lists them (imagefolder.TORCHVISION: its extensions,
    symlinked folders followed, an empty class refused). ImageFolder's attributes are
    here: `classes`, `class_to_idx`, `samples` (and `imgs`), `targets`, `transform`,
    `target_transform` (applied to each label).

    decode=True:  Pillow decodes (and resizes to `image_size` with `resample`, with
                  scaled JPEG decoding unless draft=False); `transform` gets the PIL
                  image, else the sample is a uint8 C×H×W tensor.
    decode=False: `transform` gets the file's raw bytes (bytes are returned as they are
                  when there is no transform).

    With a fixed `image_size` and no transform, a DataLoader fetches whole batches
    (`__getitems__`): `threads` threads decode the batch's files straight into one
    preallocated uint8 N×C×H×W tensor (in shared memory inside a worker), so one tensor
    per batch crosses to the training process instead of one per sample. Pillow
    releases the GIL while it decodes and resizes, so the threads run in parallel."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *,
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None,
                 decode: bool = True, image_size: tuple[int, int] | None = None,
                 draft: bool = True, resample: str = "bilinear", threads: int = 1) -> None:
        check_resample(resample)
        root = root if root is not None else data_root()
        self.root = Path(root)
        self.tiers: Tiers | None = getattr(root, "tiers", None)     # a DataRoot with a cold root
        self.draft = draft
        self.resample = resample
        self.threads = max(1, int(threads))
        self.paths: Sequence[str]
        if self.tiers is not None:
            self.rels, self.labels, self.classes = list_tiered(self.tiers, TORCHVISION)
            self.paths = [self.tiers.path(r) for r in self.rels]
        else:
            self.paths, self.labels, self.classes = list_image_folder(self.root, TORCHVISION)
        self.class_to_idx = {cls: i for i, cls in enumerate(self.classes)}
        self.targets = self.labels                 # ImageFolder's name (class weights...)
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.image_size: tuple[int, int] | None = \
            (int(image_size[0]), int(image_size[1])) if image_size else None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def samples(self) -> Samples:
        """(path, class index) pairs, ImageFolder's `samples`, read from the compact lists."""
        return Samples(self.paths, self.labels)

    imgs = samples                                 # ImageFolder's older name

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return self.fetch(index)[0]

    def _target(self, index: int) -> Any:
        label = self.labels[index]
        return self.target_transform(label) if self.target_transform else label

    def fetch(self, index: int) -> tuple[tuple[Any, Any], bool | None]:
        """((sample, label), served hot?); served hot is None without a cold root."""
        source, hot = self._source(index)
        sample: Any
        img: np.ndarray | PIL.Image.Image
        if self.batches and self.image_size:
            # the same decoder as the batched path: one sample, one set of pixels
            img = decode_array(source, self.image_size, self.resample, self.draft,
                               name=self._name(index))
            sample = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        elif self.decode:
            img = pillow_decode(io.BytesIO(source) if isinstance(source, bytes) else source,
                                self.image_size, self.draft, check_resample(self.resample),
                                name=self._name(index))
            sample = self.transform(img) if self.transform else to_tensor(img)
        else:
            data = source if isinstance(source, bytes) else read_bytes(source)
            sample = self.transform(data) if self.transform else data
        return (sample, self._target(index)), hot

    def _name(self, index: int) -> str:
        """The file, for error messages."""
        return self.paths[index]

    def _source(self, index: int) -> tuple[str | bytes, bool | None]:
        """(the file's path, None), or for tiered reads (its bytes, read from the hot
        copy?): the tier is known per file, not guessed."""
        if self.tiers is None:
            return self.paths[index], None
        return self.tiers.read(self.rels[index])

    @property
    def batches(self) -> bool:
        """Whether whole batches decode in place (a fixed size, no transform)."""
        return bool(self.decode and self.transform is None and self.image_size)

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]] | Batch:
        """A batch: a _Batch when it can be decoded in place, else a list of samples."""
        size = self.image_size
        if not self.batches or size is None:
            return [self[i] for i in indices]
        height, width = size
        shape = (len(indices), 3, height, width)
        images: torch.Tensor
        if get_worker_info() is not None:     # as default_collate does: no extra copy
            # torch leaves share_memory_ unannotated (it returns the tensor itself)
            images = torch.empty(0, dtype=torch.uint8).new_empty(shape).share_memory_()  # type: ignore[no-untyped-call]
        else:
            images = torch.empty(shape, dtype=torch.uint8)

        out = images.numpy()                  # the same memory, written in place
        hot: list[bool | None] = [None] * len(indices)

        def decode_into(slot: int, index: int) -> None:
            source, hot[slot] = self._source(index)
            img = decode_array(source, size, self.resample, self.draft, name=self._name(index))
            out[slot] = img.transpose(2, 0, 1)

        if self.threads > 1:
            list(self._threads().map(decode_into, range(len(indices)), indices))
        else:
            for slot, index in enumerate(indices):
                decode_into(slot, index)
        targets = [self._target(i) for i in indices]
        # Transformed targets collate as DataLoader would collate them.
        return Batch(images, targets, None if self.tiers is None else sum(map(bool, hot)),
                     labels=default_collate(targets) if self.target_transform else None)

    def _threads(self) -> ThreadPoolExecutor:
        # One pool per process: a worker forked from a process that had one starts anew.
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="decode")
            self._pool_pid = os.getpid()
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"], state["_pool_pid"] = None, 0      # threads do not cross processes
        return state


class EpochOrder(Sampler[int]):
    """A seeded shuffle whose order for epoch e depends on (seed, e) alone, so each epoch
    can write the next one's cold files to `order_file` for `hotcache warm --order`
    (adapters/order.py). The first epoch's order is written at once. Its epoch is set as
    a DistributedSampler's is: `set_epoch(e)`, or by the loader when an epoch was read
    to its end."""

    def __init__(self, dataset: Any, seed: int, order_file: str | os.PathLike[str]) -> None:
        self.dataset, self.seed, self.order_file = dataset, seed, order_file
        self.epoch = 0
        self._write(0)

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def _write(self, epoch: int) -> None:
        write_order(self.order_file, cold_order(self.dataset, self.order(epoch))[1])

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._write(epoch)      # the epoch about to be read, for the warm-up beside it

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[int]:
        current = self.order(self.epoch)
        self._write(self.epoch + 1)
        return iter(current)


# Batched decoding runs this many threads per process by default: threads decode one
# batch together, so the first batch of an epoch arrives sooner than when each of N
# processes decodes a whole batch alone, and fewer processes cost less pickling and
# scheduling. Up to this many CPUs, the threads run in the training process itself,
# read ahead by a prefetch thread (adapters/prefetch.py), and no decoded pixels cross a
# process boundary (bench/bench_loader.py compares the two; figures in BENCHMARKS.md).
THREADS_PER_WORKER = 4


def _cpu_share() -> int:
    """CPUs this process may use, shared among the ranks on this host."""
    cpus = len(os.sched_getaffinity(0))
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, cpus // max(per_host, 1))


def default_workers(batched: bool = False) -> int:
    """Worker processes: one per CPU of this rank's share, at most 8; for batched
    decoding, none up to THREADS_PER_WORKER CPUs (threads in the training process),
    else one per THREADS_PER_WORKER CPUs (the threads use the rest)."""
    share = _cpu_share()
    if batched:
        if share <= THREADS_PER_WORKER:
            return 0
        share = -(-share // THREADS_PER_WORKER)
    return max(1, min(8, share))


def default_decode_threads(num_workers: int) -> int:
    """Decode threads per worker: enough for the workers together to use every CPU this
    rank may use."""
    return max(1, -(-_cpu_share() // max(num_workers, 1)))


def _needs_workers(persistent_workers: bool | None, options: dict[str, Any]) -> bool:
    """Options DataLoader accepts only with worker processes: asked for, they get one
    worker (with the decode threads) instead of the in-process threads."""
    return bool(persistent_workers or options.get("timeout") or options.get("worker_init_fn")
                or options.get("multiprocessing_context"))


class LoaderOptions(TypedDict, total=False):
    """DataLoader's keywords that make_loader passes through as they are (and any a newer
    torch adds: they go to DataLoader, which checks them)."""

    timeout: float
    worker_init_fn: Callable[[int], None] | None
    multiprocessing_context: Any
    pin_memory_device: str
    in_order: bool


class _DefaultBatchSize(int):
    """make_loader's default batch size, told apart from the same number given (a batch
    sampler refuses a batch_size given beside it, as DataLoader does)."""


DEFAULT_BATCH_SIZE = _DefaultBatchSize(32)


def make_loader(root: str | os.PathLike[str] | None = None, *, dataset: Dataset[Any] | None = None,
                batch_size: int | None = DEFAULT_BATCH_SIZE, shuffle: bool | None = None,
                sampler: Sampler[Any] | Iterable[Any] | None = None,
                batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
                generator: torch.Generator | None = None,
                num_workers: int | None = None, pin_memory: bool | None = None,
                persistent_workers: bool | None = None, prefetch_factor: int | None = None,
                drop_last: bool = False, collate_fn: Callable[[list[Any]], Any] | None = None,
                transform: Callable[[Any], Any] | None = None,
                target_transform: Callable[[int], Any] | None = None,
                decode: bool = True, image_size: tuple[int, int] | None = None,
                resample: str = "bilinear", decode_threads: int | None = None,
                distributed: bool | None = None, seed: int = 0,
                order_file: str | os.PathLike[str] | None = None,
                name: str = "train", log_every: int = 100, log_path: str | os.PathLike[str] | None = None,
                clock: Callable[[], float] = perf_counter,
                tensorboard: Any = None, pushgateway: str | None = None,
                **loader_options: Unpack[LoaderOptions]) -> TimedLoader:
    """A timed torch DataLoader (a TimedLoader, a DataLoader subclass) over `dataset`, or
    over the image folder at `root` (default: `data_root()`, which logs where the data
    really comes from), listed as torchvision's ImageFolder lists it.

    Every DataLoader keyword is passed through (`**loader_options` takes the rest:
    timeout, worker_init_fn, multiprocessing_context, in_order...), and contradictory
    ones are refused by DataLoader itself. What make_loader adds to DataLoader:
    - timing: every batch fetch is timed (TimedLoader, see timing.py), with the workers'
      load time per batch; a summary is logged every `log_every` batches and per epoch.
    - decode: over an image folder with `image_size=(height, width)` and no `transform`,
      each process decodes whole batches in `decode_threads` threads (default: the CPUs
      left over per worker) straight into one uint8 N×3×H×W tensor, resized with
      `resample` ("bilinear", tf.image.resize's filter; see adapters/decode.py).
    - order file (order_file or $DATA_ORDER_FILE): a shuffle whose order depends on
      (seed, epoch) alone, and the next epoch's cold files written there in reading
      order as each epoch starts, for `hotcache warm COLD_ROOT --order FILE`
      (adapters/order.py). Image-folder datasets on one rank only.
    - epochs: `loader.set_epoch(e)` sets the next epoch (a resumed job); an epoch read to
      its end advances it. The loader sets the epoch only of a sampler it made.
    - publishing: `tensorboard=` (a SummaryWriter or a folder; $HOTCACHE_TENSORBOARD)
      writes the timing figures as scalars, `pushgateway=URL` ($HOTCACHE_PUSHGATEWAY)
      pushes them for Prometheus (adapters/publish.py, adapters/pushgateway.py).

    Its defaults, where DataLoader's differ:
    - order: a sampler or batch_sampler you give decides it, and make_loader adds none;
      otherwise it shuffles (shuffle=None means yes) with `generator`, or one seeded with
      `seed`, and uses a DistributedSampler when torch.distributed is initialised
      (`distributed=True/False` overrides).
    - batch_size 32 (unless a batch_sampler is given).
    - workers: one per CPU of this rank's share, at most 8; when whole batches decode in
      threads, none up to four CPUs (a thread reads prefetch_factor batches ahead) and one
      per four CPUs above. An explicit num_workers=0 loads each batch when the loop asks,
      as DataLoader does; options only workers take (persistent_workers, timeout,
      worker_init_fn, multiprocessing_context) get one worker instead of none.
    - pin_memory when CUDA is there, persistent workers, prefetch_factor 4."""
    built = dataset is None
    if dataset is None:
        dataset = ImageFolderDataset(root, transform=transform, target_transform=target_transform,
                                     decode=decode, image_size=image_size, resample=resample)
    options: dict[str, Any] = dict(loader_options)
    workers = _workers(dataset if isinstance(dataset, ImageFolderDataset) and built else None,
                       num_workers, decode_threads, persistent_workers, prefetch_factor, options)
    # An IterableDataset has no index to time per sample, and shards itself across
    # ranks and workers: it goes to the DataLoader as it is.
    stamped = not isinstance(dataset, IterableDataset)
    order = _order(dataset, stamped, shuffle=shuffle, sampler=sampler,
                   batch_sampler=batch_sampler, generator=generator, distributed=distributed,
                   seed=seed, drop_last=drop_last, order_file=order_file)
    own = order.pop("own")
    if batch_sampler is not None and batch_size is DEFAULT_BATCH_SIZE:
        batch_size = 1                  # DataLoader's default beside a batch sampler
    if isinstance(dataset, ImageFolderDataset):
        collate_fn = BatchCollate(collate_fn)      # whole decoded batches, or the user's
    return TimedLoader(dataset, stamped=stamped, own_sampler=own, read_ahead=workers.read_ahead,
                       name=name, log_every=log_every, log_path=log_path, clock=clock,
                       tensorboard=tensorboard, pushgateway=pushgateway,
                       batch_size=None if batch_size is None else int(batch_size),
                       drop_last=drop_last, **order, **workers.options,
                       pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
                       collate_fn=collate_fn, **options)


class _Workers:
    """How a loader loads: DataLoader's worker options, and how many batches a thread
    reads ahead in the training process (0: none)."""

    def __init__(self, options: dict[str, Any], read_ahead: int) -> None:
        self.options, self.read_ahead = options, read_ahead


def _workers(built: ImageFolderDataset | None, num_workers: int | None,
             decode_threads: int | None, persistent_workers: bool | None,
             prefetch_factor: int | None, loader_options: dict[str, Any]) -> _Workers:
    """Worker processes and decode threads (see make_loader's defaults). `built`: the
    image-folder dataset make_loader made, whose decode threads are set here."""
    default = num_workers is None       # an explicit num_workers=0 stays synchronous
    if num_workers is None:
        # Fewer processes only where this call also sets the threads that make up for them.
        num_workers = default_workers(batched=built is not None and built.batches)
        if num_workers == 0 and _needs_workers(persistent_workers, loader_options):
            num_workers = 1
    if built is not None:
        threads = default_decode_threads(num_workers) if decode_threads is None else decode_threads
        built.threads = max(1, int(threads))
    if persistent_workers is None:
        persistent_workers = num_workers > 0
    read_ahead = 0
    if num_workers == 0:
        if default:   # without worker processes a thread reads ahead, as deep as workers would
            read_ahead, prefetch_factor = prefetch_factor or 4, None
    elif prefetch_factor is None:
        prefetch_factor = 4
    return _Workers({"num_workers": num_workers, "persistent_workers": persistent_workers,
                     "prefetch_factor": prefetch_factor}, read_ahead)


def _order(dataset: Dataset[Any], stamped: bool, *, shuffle: bool | None,
           sampler: Sampler[Any] | Iterable[Any] | None,
           batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None,
           generator: torch.Generator | None, distributed: bool | None, seed: int, drop_last: bool,
           order_file: str | os.PathLike[str] | None) -> dict[str, Any]:
    """DataLoader's shuffle, sampler, batch_sampler and generator: the caller's own where
    given, else a seeded shuffle, a DistributedSampler or an EpochOrder (order file);
    "own": the sampler made here, whose epoch the loader sets (None: not ours)."""
    users = sampler is not None or batch_sampler is not None
    if shuffle is None:
        shuffle = stamped and not users
    if distributed is None:
        distributed = stamped and not users and torch.distributed.is_available() \
            and torch.distributed.is_initialized()
    order_file = order_file or os.environ.get(ENV_ORDER) or None
    own: Sampler[Any] | None = None
    if order_file:
        if users or distributed or not shuffle or not hasattr(dataset, "paths"):
            raise ValueError(f"order_file={order_file}: the next epoch's order is written only "
                             f"for make_loader's own shuffle of an image-folder dataset on one "
                             f"rank; drop order_file (or unset {ENV_ORDER}) for this loader")
        sampler = own = EpochOrder(dataset, seed, order_file)
        shuffle = False
    elif distributed:
        if users:
            raise ValueError("distributed=True with your own sampler: give a "
                             "DistributedSampler yourself, or leave distributed unset")
        sampler = own = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
        shuffle = False            # the sampler shuffles; DataLoader refuses both
    if generator is None and shuffle:
        generator = torch.Generator().manual_seed(seed)
    return {"shuffle": shuffle, "sampler": sampler, "batch_sampler": batch_sampler,
            "generator": generator, "own": own}

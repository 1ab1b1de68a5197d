"""tf.data: an input pipeline over an image folder or TFRecord files under DATA_ROOT.

    from hotcache.adapters import make_dataset, timed, DataWaitCallback
    ds = make_dataset(batch_size=64, image_size=(224, 224), cache_dir="/mnt/ssd/tfcache")
    for images, labels in timed(ds): ...             # plain loop, every fetch timed
    wait = DataWaitCallback()
    model.fit(wait.wrap(ds), epochs=3, callbacks=[wait])   # Keras: data wait per step

The pipeline: list the files, (interleave TFRecord shards | map-read the images) with
AUTOTUNE parallelism, decode, optional user map, optional `cache()` on the SSD (see
tfcache), shuffle, batch, prefetch. Importing this module imports TensorFlow.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from time import perf_counter
from typing import Any, TypedDict, TypeVar

import numpy as np
import tensorflow as tf

from hotcache.provision.hotcopy.format import read_metadata

from . import tfcache
from .dataroot import data_root, hot_copy_at
from .errors import DataRootError
from .imagefolder import KERAS, list_image_folder
from .retry import read_bytes, retry_seconds
from .tfdecode import decode_named
from .tiered import Tiers, list_tiered
from .timing import ENV_LOG, Summary, emit, publish_sinks, summarize

AUTOTUNE = tf.data.AUTOTUNE
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")
T = TypeVar("T")


def _tfrecord_files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.suffix in TFRECORD_SUFFIXES and p.is_file())


def _dataset_version(root: Path, files: list[str]) -> dict[str, Any]:
    """What identifies the data: the hot copy's name/version/copy time, or for a plain
    folder the listing with sizes and modification times."""
    copy = hot_copy_at(root)
    if copy.state in ("hot", "unverified") and copy.root is not None:
        meta = read_metadata(Path(copy.root)) or {}
        return {"copy": copy.name, "version": copy.version, "copied_at": meta.get("copied_at"),
                "files": meta.get("files"), "sub": str(root.relative_to(copy.root))}
    stats = [(f, (st := os.stat(f)).st_size, st.st_mtime_ns) for f in files]
    return {"listing": tfcache.fingerprint({"files": stats})}


SUBSETS = ("training", "validation", "both")


class _Settings(TypedDict):
    """make_dataset's settings, as _pipeline takes them."""

    image_size: tuple[int, int] | None
    decode: bool
    map_fn: Callable[..., Any] | None
    cache_dir: str | os.PathLike[str] | None
    shuffle: bool
    shuffle_buffer: int
    seed: int | None
    batch_size: int
    drop_remainder: bool
    deterministic: bool | None
    features: tuple[str, str]
    kind: str


def make_dataset(root: str | os.PathLike[str] | None = None, *, batch_size: int = 32,
                 image_size: tuple[int, int] | None = None, kind: str = "auto",
                 decode: bool = True, map_fn: Callable[..., Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 shuffle: bool = True, shuffle_buffer: int = 1024, seed: int | None = None,
                 drop_remainder: bool = False, deterministic: bool | None = None,
                 features: tuple[str, str] = ("image", "label"),
                 validation_split: float | None = None, subset: str | None = None,
                 follow_links: bool = False) -> Any:
    """A batched `(images, labels)` tf.data pipeline over `root` (default `data_root()`).

    kind: "images" (root/<class>/<image>, listed as Keras's image_dataset_from_directory
    lists it: its formats, which tf.io.decode_image reads, and `follow_links`), "tfrecord"
    (tf.train.Example records with a bytes feature and an int64 feature named by
    `features`), or "auto". An image folder's dataset carries Keras's `class_names` and
    `file_paths`.
    image_size: (height, width) to resize to; images come out uint8 H×W×3, the resized
    pixels rounded to the nearest level (Keras keeps the float; within 0.5 of it).
    decode=False hands the encoded bytes to `map_fn` instead.
    cache_dir: cache the decoded (and mapped) samples under this folder, in a subfolder
    keyed by the data's version and these settings.
    validation_split, subset ("training", "validation", or "both": a (training,
    validation) pair): Keras's split of an image folder's files, the same files as
    image_dataset_from_directory with the same seed.

    root may be a DataRoot with a cold root (DATA_COLD_ROOT, image folders): each file is
    read from the hot copy when the copy holds it, else from the cold root, and `timed()`
    over the returned dataset reports the share of samples served hot."""
    _check_split(validation_split, subset, shuffle, seed)
    root = root if root is not None else data_root()
    tiers: Tiers | None = getattr(root, "tiers", None)
    root = Path(root).resolve()
    tfrecords = _tfrecord_files(root) if kind in ("auto", "tfrecord") else []
    if kind == "auto":
        kind = "tfrecord" if tfrecords else "images"
    if kind == "tfrecord" and validation_split:
        raise ValueError("validation_split splits an image folder's files; split TFRecord "
                         "shards into two folders instead")
    settings: _Settings = dict(image_size=image_size, decode=decode, map_fn=map_fn,
                               cache_dir=cache_dir, shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                               seed=seed, batch_size=batch_size, drop_remainder=drop_remainder,
                               deterministic=deterministic, features=features, kind=kind)
    if kind == "tfrecord":
        return _pipeline(root, tiers, None, tfrecords=tfrecords, **settings)
    listing = _image_listing(root, tiers, follow_links)
    if not validation_split:
        return _pipeline(root, tiers, listing, **settings)
    training, validation = _split(listing, validation_split, shuffle, seed)
    if subset == "training":
        return _pipeline(root, tiers, training, **settings)
    unshuffled: _Settings = {**settings, "shuffle": False}     # the validation subset's
    if subset == "validation":
        return _pipeline(root, tiers, validation, **unshuffled)
    return (_pipeline(root, tiers, training, **settings),       # "both", as Keras returns it
            _pipeline(root, tiers, validation, **unshuffled))


def _check_split(validation_split: float | None, subset: str | None, shuffle: bool,
                 seed: int | None) -> None:
    """Keras's rules (check_validation_split_arg), with its messages."""
    if validation_split and not 0 < validation_split < 1:
        raise ValueError(f"`validation_split` must be between 0 and 1, received: {validation_split}")
    if (validation_split or subset) and not (validation_split and subset):
        raise ValueError("If `subset` is set, `validation_split` must be set, and inversely.")
    if subset not in (*SUBSETS, None):
        raise ValueError(f'`subset` must be either "training", "validation" or "both", received: {subset}')
    if validation_split and shuffle and seed is None:
        raise ValueError("If using `validation_split` and shuffling the data, you must provide a "
                         "`seed` argument, to make sure that there is no overlap between the "
                         "training and validation subset.")


class _Listing:
    """An image folder's files (full paths), labels, class names, and for tiered reads
    whether the hot copy serves each file."""

    def __init__(self, files: list[str], labels: list[int], classes: list[str],
                 hot: list[bool] | None = None):
        self.files, self.labels, self.classes, self.hot = files, labels, classes, hot

    def take(self, part: slice) -> "_Listing":
        return _Listing(self.files[part], self.labels[part], self.classes,
                        None if self.hot is None else self.hot[part])


def _image_listing(root: Path, tiers: Tiers | None, follow_links: bool) -> _Listing:
    if tiers is not None:
        rels, labels, classes = list_tiered(tiers, KERAS)
        return _Listing([tiers.path(r) for r in rels], labels, classes,
                        [tiers.is_hot(r) for r in rels])
    listed, labels, classes = list_image_folder(root, KERAS, follow_links=follow_links)
    return _Listing(list(listed), labels, classes)   # tf.data holds them as one tensor anyway


def _split(listing: _Listing, validation_split: float, shuffle: bool,
           seed: int | None) -> tuple[_Listing, _Listing]:
    """Keras's split (index_directory, get_training_or_validation_split): the files
    shuffled by numpy's RandomState(seed) when shuffling, the last int(split × n) for
    validation."""
    order = np.arange(len(listing.files))
    if shuffle:
        np.random.RandomState(seed).shuffle(order)
    whole = _Listing([listing.files[i] for i in order], [listing.labels[i] for i in order],
                     listing.classes, None if listing.hot is None else [listing.hot[i] for i in order])
    n_val = int(validation_split * len(whole.files))
    if not n_val or n_val == len(whole.files):
        raise DataRootError(f"validation_split={validation_split} of {len(whole.files)} files "
                            f"leaves one subset empty", hint="use a split that leaves files in both")
    return whole.take(slice(None, -n_val)), whole.take(slice(-n_val, None))


def _pipeline(root: Path, tiers: Tiers | None, listing: _Listing | None, *,
              image_size: tuple[int, int] | None, decode: bool, map_fn: Callable[..., Any] | None,
              cache_dir: str | os.PathLike[str] | None, shuffle: bool, shuffle_buffer: int,
              seed: int | None, batch_size: int, drop_remainder: bool, deterministic: bool | None,
              features: tuple[str, str], kind: str, tfrecords: Iterable[str] = ()) -> Any:
    prepare = _preparer(decode, image_size, map_fn)
    # Shuffling the file list suffices unless a cache freezes the order it was written in.
    early = bool(shuffle and not cache_dir)
    if listing is None:
        ds, files = _records(root, list(tfrecords), features, prepare, shuffle=early, seed=seed,
                             deterministic=deterministic)
    else:
        ds, files = _images(listing, prepare, shuffle=early, seed=seed, deterministic=deterministic)
        tiers = tiers if listing.hot is not None else None
    if cache_dir:
        settings = {"kind": kind, "image_size": image_size, "decode": decode, "features": features,
                    "map_fn": tfcache.function_identity(map_fn), "root": str(root),
                    "data": _dataset_version(root, files), "tf": tf.__version__,
                    "pixels": "rounded"}
        ds = ds.cache(str(_cache_folder(cache_dir, root, settings)))
    if shuffle and (cache_dir or kind == "tfrecord"):
        # Sample-level shuffle only where file order alone is not enough: records sit in
        # shard order, and a cache freezes the order it was written in. (Filling a large
        # buffer delays the first batch, so plain image folders skip it.)
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=AUTOTUNE)
    if tiers is not None and listing is not None:
        log = TierLog()
        ds = log.strip(ds)
        ds = ds.prefetch(AUTOTUNE)
        ds._hotcache_tiers = log      # BatchTimer (timed) reads it
    else:
        ds = ds.prefetch(AUTOTUNE)
    if listing is not None:           # what Keras's image_dataset_from_directory sets
        ds.class_names = listing.classes
        ds.file_paths = listing.files
    return ds


def _preparer(decode: bool, image_size: tuple[int, int] | None,
              map_fn: Callable[..., Any] | None) -> Callable[..., Any]:
    """(encoded bytes, label) -> the sample: decoded and resized to (height, width) when
    asked, then the user's map_fn."""
    def prepare(data: tf.Tensor, label: tf.Tensor, path: tf.Tensor | None = None) -> Any:
        if decode:
            data = decode_named(data, path) if path is not None else \
                tf.io.decode_image(data, channels=3, expand_animations=False)
            if image_size:
                # tf.image.resize gives float32 (Keras keeps it): round to the nearest
                # level, not down (a cast alone truncates, half a level darker).
                data = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(data, image_size)),
                                                0, 255), tf.uint8)
        return (map_fn(data, label) if map_fn else (data, label))

    return prepare


def _records(root: Path, files: list[str], features: tuple[str, str], prepare: Callable[..., Any], *,
             shuffle: bool, seed: int | None, deterministic: bool | None) -> tuple[tf.data.Dataset, list[str]]:
    """Samples from TFRecord shards, read interleaved (the shard order shuffled)."""
    if not files:
        raise DataRootError(f"{root}: no TFRecord files ({', '.join(TFRECORD_SUFFIXES)}) found",
                            hint="point DATA_ROOT at the folder holding the shards, or use kind='images'")
    image_key, label_key = features
    spec = {image_key: tf.io.FixedLenFeature([], tf.string),
            label_key: tf.io.FixedLenFeature([], tf.int64)}

    def parse(record: tf.Tensor) -> Any:
        ex = tf.io.parse_single_example(record, spec)
        return prepare(ex[image_key], ex[label_key])

    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        ds = ds.shuffle(len(files), seed=seed)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                       num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    return ds.map(parse, num_parallel_calls=AUTOTUNE, deterministic=deterministic), files


def _images(listing: _Listing, prepare: Callable[..., Any], *, shuffle: bool, seed: int | None,
            deterministic: bool | None) -> tuple[tf.data.Dataset, list[str]]:
    """Samples from an image folder; for tiered reads each with whether the hot copy
    served it."""
    files = listing.files
    if listing.hot is not None:
        ds = tf.data.Dataset.from_tensor_slices((files, listing.labels, listing.hot))
    else:
        ds = tf.data.Dataset.from_tensor_slices((files, listing.labels))
    if shuffle:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    retrying = bool(retry_seconds())
    if retrying:
        ds = ds.batch(READ_GROUP).map(_read_group, num_parallel_calls=AUTOTUNE,
                                      deterministic=deterministic).unbatch()

    def load(path: tf.Tensor, label: tf.Tensor, *rest: tf.Tensor) -> Any:
        # (bytes read by _read_group, hot flag) or (hot flag) or nothing
        data, hot = (rest[0], rest[1:]) if retrying else (tf.io.read_file(path), rest)
        sample = prepare(data, tf.cast(label, tf.int64), path)
        return (sample, *hot) if hot else sample

    return ds.map(load, num_parallel_calls=AUTOTUNE, deterministic=deterministic), files


# Files read a group at a time: a call into Python for each file cost about a fifth of
# the pipeline's throughput; for a group, the call's cost is shared.
READ_GROUP = 16


def _read_many(paths: np.ndarray) -> np.ndarray:
    # An object array: numpy's bytes type would drop a file's trailing NUL bytes.
    out = np.empty(len(paths), dtype=object)
    out[:] = [read_bytes(os.fsdecode(p)) for p in paths]
    return out


def _read_group(paths: tf.Tensor, labels: tf.Tensor, *hot: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """(paths, labels[, hot]) of a group -> (paths, labels, the files' bytes[, hot]):
    each file read as tf.io.read_file reads it, but each EIO retried for a bounded time
    (retry.py), so a cache failing over to its origin costs a slow batch, not the run.
    The reads run in Python (the GIL is released while they wait on the disk); with
    HOTCACHE_EIO_RETRY_S=0 the pipeline uses TensorFlow's own read_file. A read that
    fails for good ends the iteration with tf.errors.UnknownError, whose message is the
    OSError's, naming the file."""
    data = tf.numpy_function(_read_many, [paths], tf.string, stateful=False)
    data.set_shape(paths.shape)
    return (paths, labels, data, *hot)


def _cache_folder(cache_dir: str | os.PathLike[str], root: Path, settings: dict[str, Any]) -> Path:
    """The cache's folder under cache_dir, named by the data's version and a fingerprint
    of every setting that changes what is cached."""
    version = str(settings["data"].get("version") or "src")
    if not tfcache.label_ok(version):
        raise DataRootError(f"{root}: the hot copy's version label {version!r} cannot go "
                            "into a cache folder name",
                            hint="copy it again with a plain --version (letters, digits, "
                                 ". _ + -)")
    name = f"{root.name}-{version}-{tfcache.fingerprint(settings)[:16]}"
    return tfcache.prepare(cache_dir, name)


class TierLog:
    """Each batch's (hot samples, samples), logged in batch order by a sequential map
    after `batch`, and taken in the same order by the BatchTimer as it receives them."""

    def __init__(self) -> None:
        self.counts: deque[tuple[int, int]] = deque(maxlen=1 << 16)

    def strip(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """(element, hot flags) batches -> element batches, each batch's count logged."""
        def push(hot: tf.Tensor, n: tf.Tensor) -> int:
            self.counts.append((int(hot), int(n)))
            return 0

        def split(element: Any, hot: tf.Tensor) -> Any:
            n = tf.size(hot)
            t = tf.py_function(push, [tf.reduce_sum(tf.cast(hot, tf.int32)), n], tf.int32)
            with tf.control_dependencies([t]):
                return tf.nest.map_structure(tf.identity, element)

        return ds.map(split)        # sequential: batches are logged in the order they leave

    def clear(self) -> None:
        self.counts.clear()

    def stamp(self, it: Iterable[T]) -> Iterator[tuple[T, tuple[None, int, int]]]:
        """Pair each batch with its (None, hot, samples) stamp."""
        for item in it:
            hot, n = self.counts.popleft() if self.counts else (0, 0)
            yield item, (None, hot, n)


class DataWaitCallback(tf.keras.callbacks.Callback):  # type: ignore[misc]  # TensorFlow is untyped: Any to mypy
    """Keras `fit`: how long each training step waited for its batch.

    Keras pulls batches inside its compiled train function, out of Python's sight, so
    `wrap(ds)` zips the pipeline with a one-stamp dataset: zip asks its inputs in order,
    in the consumer's own thread, so the first stamp marks the moment the step asks for a
    batch and a sequential map after the zip marks the moment it gets it. The first step
    of each epoch (tracing, pipeline start-up) is reported apart, as in BatchTimer.

    tensorboard: a keras.callbacks.TensorBoard (the figures go into its "train" run,
    beside the loss), a tf.summary writer or a folder; pushgateway: a Pushgateway URL
    (see publish.py; $HOTCACHE_TENSORBOARD, $HOTCACHE_PUSHGATEWAY). The step is the
    number of batches trained before, across epochs and fit() calls."""

    def __init__(self, name: str = "fit", log_every: int = 100,
                 log_path: str | os.PathLike[str] | None = None, *,
                 tensorboard: Any = None, pushgateway: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.log_every = log_every
        self.log_path = log_path if log_path is not None else os.environ.get(ENV_LOG) or None
        self.sinks = publish_sinks(tensorboard, pushgateway)
        self.summaries: list[Summary] = []
        self.step = 0                # batches trained before this epoch
        self._asked = 0.0
        self._pending = 0.0          # wait accumulated since the last step ended

    def wrap(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        asks = tf.data.Dataset.from_tensors(tf.constant(0.0, tf.float64)).repeat().map(
            lambda _: tf.py_function(self._ask, [], tf.float64))

        def got(_asked: tf.Tensor, element: Any) -> Any:
            t = tf.py_function(self._got, [], tf.float64)
            with tf.control_dependencies([t]):
                return tf.nest.map_structure(tf.identity, element)

        options = tf.data.Options()
        # An injected prefetch would move the zip to a background thread and hide the wait.
        options.experimental_optimization.inject_prefetch = False
        return tf.data.Dataset.zip((asks, ds)).map(got).with_options(options)

    def _ask(self) -> float:
        self._asked = perf_counter()
        return 0.0

    def _got(self) -> float:
        self._pending += perf_counter() - self._asked
        return 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._first: float | None = None
        self._waits: list[float] = []
        self._t_first: float | None = None
        self._t_end: float | None = None
        self._t_window: float | None = None
        self._pending = 0.0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        end = perf_counter()
        wait, self._pending = self._pending, 0.0
        if self._first is None:
            self._first, self._t_first = wait, end
        else:
            self._waits.append(wait)
        self._t_end = end
        if self.log_every and self._waits and len(self._waits) % self.log_every == 0:
            self._emit(self._window(end), final=False)

    def _window(self, now: float) -> Summary:
        """The last log_every steps, as BatchTimer's periodic lines."""
        window = self._waits[-self.log_every:]
        start = self._t_window if self._t_window is not None else self._t_first
        assert start is not None        # a window follows the epoch's first step
        self._t_window = now
        return summarize(self.name, self._epoch, self._first, window, now - start, len(window),
                         batches=len(self._waits) + 1, window=len(window))

    def _summary(self) -> Summary:
        wall = (self._t_end - self._t_first) if self._t_first is not None and self._t_end is not None else 0.0
        return summarize(self.name, self._epoch, self._first, self._waits, wall, len(self._waits))

    def _emit(self, summary: Summary, *, final: bool) -> None:
        emit(summary, final=final, log_path=self.log_path)
        step = self.step + max(summary.batches - 1, 0)
        for sink in self.sinks:
            sink(summary, final, step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        summary = self._summary()
        self.summaries.append(summary)
        self._emit(summary, final=True)
        self.step += summary.batches

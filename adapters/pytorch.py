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

import os
from pathlib import Path
from time import perf_counter

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset
from torch.utils.data import default_collate

from .dataroot import data_root
from .imagefolder import list_image_folder
from .timing import BatchTimer


def decode_image(path: str, image_size: tuple[int, int] | None = None, draft: bool = True):
    """A JPEG/PNG file as a PIL RGB image, resized to (width, height) when asked.

    draft: a JPEG that is to be shrunk is decoded at the smallest DCT scale (1/2, 1/4,
    1/8) that still covers `image_size` (Pillow's `draft`, libjpeg's scaled decoding),
    then resized: several times less decoding for nearly the same pixels."""
    from PIL import Image

    with Image.open(path) as im:
        if draft and image_size:
            im.draft("RGB", image_size)
        img = im.convert("RGB")
    return img.resize(image_size) if image_size else img


def to_tensor(img) -> torch.Tensor:
    """PIL image -> uint8 tensor C×H×W (no scaling: do that on the accelerator)."""
    return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)


class ImageFolderDataset(Dataset):
    """root/<class>/<image>: class folders, sorted by name, give labels 0..n-1.

    decode=True:  Pillow decodes (and resizes to `image_size`, with scaled JPEG decoding
                  unless draft=False); `transform` gets the PIL image, else the sample
                  is a uint8 C×H×W tensor.
    decode=False: `transform` gets the file's raw bytes (bytes are returned as they are
                  when there is no transform)."""

    def __init__(self, root: str | os.PathLike | None = None, *, transform=None,
                 decode: bool = True, image_size: tuple[int, int] | None = None,
                 draft: bool = True):
        self.root = Path(root) if root is not None else data_root().path
        self.draft = draft
        self.paths, self.labels, self.classes = list_image_folder(self.root)
        self.transform = transform
        self.decode = decode
        self.image_size = tuple(image_size) if image_size else None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        path = self.paths[index]
        if self.decode:
            img = decode_image(path, self.image_size, self.draft)
            sample = self.transform(img) if self.transform else to_tensor(img)
        else:
            data = Path(path).read_bytes()
            sample = self.transform(data) if self.transform else data
        return sample, self.labels[index]


class _Stamped(Dataset):
    """Runs in the workers: each sample comes with the seconds it took to load."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        t0 = perf_counter()
        sample = self.dataset[index]
        return sample, perf_counter() - t0


class _StampedCollate:
    """Collate the samples with the user's collate_fn; add up their load seconds."""

    def __init__(self, collate_fn=None):
        self.collate_fn = collate_fn or default_collate

    def __call__(self, stamped):
        return self.collate_fn([s for s, _ in stamped]), sum(t for _, t in stamped)


class TimedLoader(BatchTimer):
    """A DataLoader whose every batch fetch is timed (see BatchTimer); `.loader` is the
    DataLoader, `.dataset` the user's dataset. Each epoch sets the DistributedSampler's
    epoch, so shuffling differs between epochs on every rank."""

    def __init__(self, loader: DataLoader, dataset, *, stamped: bool = True, **options):
        super().__init__(loader, stamped=stamped, **options)
        self.loader = loader
        self.dataset = dataset

    def __iter__(self):
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(self.epoch + 1)
        return super().__iter__()


def default_workers() -> int:
    """CPUs this process may use, shared among the ranks on this host, at most 8."""
    cpus = len(os.sched_getaffinity(0))
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(8, cpus // max(per_host, 1)))


def make_loader(root: str | os.PathLike | None = None, *, dataset=None, batch_size: int = 32,
                shuffle: bool = True, num_workers: int | None = None,
                pin_memory: bool | None = None, persistent_workers: bool | None = None,
                prefetch_factor: int | None = None, drop_last: bool = False,
                transform=None, decode: bool = True, image_size: tuple[int, int] | None = None,
                collate_fn=None, distributed: bool | None = None, seed: int = 0,
                name: str = "train", log_every: int = 100, log_path=None,
                **loader_options) -> TimedLoader:
    """A timed DataLoader over `dataset`, or over the image folder at `root`
    (default: `data_root()`, which logs where the data really comes from).

    Defaults: workers from the CPU count, pin_memory when CUDA is there, persistent
    workers, prefetch_factor 4, and a DistributedSampler when torch.distributed is
    initialised (`distributed=True/False` overrides)."""
    if dataset is None:
        dataset = ImageFolderDataset(root, transform=transform, decode=decode, image_size=image_size)
    if num_workers is None:
        num_workers = default_workers()
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    if persistent_workers is None:
        persistent_workers = num_workers > 0
    if prefetch_factor is None and num_workers > 0:
        prefetch_factor = 4
    if distributed is None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    # An IterableDataset has no index to time per sample, and shards itself across
    # ranks and workers: it goes to the DataLoader as it is.
    stamped = not isinstance(dataset, IterableDataset)
    sampler = None
    if not stamped:
        shuffle = distributed = False
    if distributed:
        sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
        shuffle = False            # the sampler shuffles; DataLoader refuses both
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    loader = DataLoader(_Stamped(dataset) if stamped else dataset, batch_size=batch_size,
                        shuffle=shuffle, sampler=sampler, num_workers=num_workers,
                        pin_memory=pin_memory, persistent_workers=persistent_workers,
                        prefetch_factor=prefetch_factor, drop_last=drop_last,
                        collate_fn=_StampedCollate(collate_fn) if stamped else collate_fn,
                        generator=generator, **loader_options)
    return TimedLoader(loader, dataset, stamped=stamped, name=name, log_every=log_every,
                       log_path=log_path)

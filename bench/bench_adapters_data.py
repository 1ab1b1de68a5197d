"""Shared by the adapter benchmarks: a JPEG dataset on disk and the serial baseline
(read, decode with Pillow, batch, one sample after another, as a training script
without an input pipeline does)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))      # tests.unit.adapters.helpers writes hot copies by hand


def make_dataset_on_disk(root: Path, images: int, size: int = 256, classes: int = 4,
                         width: int | None = None) -> Path:
    """`images` JPEGs of noisy gradients (they compress and decode like photos do,
    roughly), `width`×`size` pixels (square by default), spread over `classes` folders."""
    from PIL import Image

    width = width or size
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 200, width, dtype=np.float32)
    for i in range(images):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = ramp[None, :, None] + rng.normal(0, 25, (size, width, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{i:05d}.jpg", quality=90)
    return root


def serial_batches(root: Path, batch_size: int, image_size: int):
    """The baseline: no workers, no prefetch; each batch is read and decoded on demand."""
    import torch
    from PIL import Image

    from hotcache.adapters.imagefolder import list_image_folder

    paths, labels, _ = list_image_folder(root)
    order = np.random.default_rng(0).permutation(len(paths))
    for start in range(0, len(order), batch_size):
        images, batch_labels = [], []
        for i in order[start:start + batch_size]:
            with open(paths[i], "rb") as f, Image.open(f) as im:
                img = im.convert("RGB").resize((image_size, image_size))
            images.append(np.asarray(img))
            batch_labels.append(labels[i])
        yield torch.from_numpy(np.stack(images)), torch.tensor(batch_labels)


def cpus() -> int:
    return len(os.sched_getaffinity(0))

"""The image-folder layout both loaders read: ROOT/<class>/<file>, classes sorted by name
and numbered from 0 (the torchvision ImageFolder convention, so labels agree across
frameworks). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import DataRootError
from hotcache.provision.hotcopy.format import RESERVED

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def list_image_folder(root: str | os.PathLike,
                      extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> tuple[list[str], list[int], list[str]]:
    """(paths, labels, class names) for every image under root/<class>/, in a stable order."""
    root = Path(root)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    paths: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / cls):
            dirnames.sort()
            for f in sorted(filenames):
                if f.lower().endswith(extensions) and f not in RESERVED:
                    paths.append(os.path.join(dirpath, f))
                    labels.append(label)
    if not paths:
        raise DataRootError(f"{root}: no images found in class folders ({root}/<class>/*.jpg)",
                            hint="point DATA_ROOT at the folder that holds one folder per class")
    return paths, labels, classes

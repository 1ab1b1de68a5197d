"""The image-folder layout both loaders read: ROOT/<class>/<file>, classes sorted by name
and numbered from 0 (the torchvision ImageFolder convention, so labels agree across
frameworks). Standard library only."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from .errors import DataRootError
from hotcache.provision.hotcopy.format import RESERVED

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class PathList(Sequence):
    """The paths of a listing in compact form: one byte string of the paths below the
    root and an array of where each ends, about 40 bytes a file instead of a list of
    str (over 100). At millions of files that is the difference between megabytes and
    gigabytes, in the training process and in every DataLoader worker that indexes it
    (touching a list's str objects copies their pages into each worker)."""

    __slots__ = ("root", "_blob", "_ends")

    def __init__(self, root: str, rels: Iterable[str] = ()):
        self.root = root
        self._blob = bytearray()
        self._ends = array("Q")
        for rel in rels:
            self.append_rel(rel)

    def append_rel(self, rel: str) -> None:
        self._blob += os.fsencode(rel)
        self._ends.append(len(self._blob))

    def __len__(self) -> int:
        return len(self._ends)

    def rel(self, i: int) -> str:
        return os.fsdecode(bytes(self._blob[self._ends[i - 1] if i else 0:self._ends[i]]))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return os.path.join(self.root, self.rel(i))

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        return (isinstance(other, Sequence) and len(self) == len(other)
                and all(a == b for a, b in zip(self, other)))
    # No __hash__: a class that defines __eq__ alone is unhashable, as a list is.

    def __getstate__(self):
        return self.root, bytes(self._blob), self._ends

    def __setstate__(self, state) -> None:
        self.root, blob, self._ends = state
        self._blob = bytearray(blob)


def list_image_folder(root: str | os.PathLike,
                      extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> tuple[PathList, list[int], list[str]]:
    """(paths, labels, class names) for every image under root/<class>/, in a stable order.
    The paths are a PathList (a sequence of str, stored compactly)."""
    root = Path(root)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    paths = PathList("" if str(root) == "." else str(root))   # as os.walk names them
    labels: list[int] = []
    for label, cls in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / cls):
            dirnames.sort()
            below = os.path.relpath(dirpath, root)
            for f in sorted(filenames):
                if f.lower().endswith(extensions) and f not in RESERVED:
                    paths.append_rel(os.path.join(below, f))
                    labels.append(label)
    if not paths:
        raise DataRootError(f"{root}: no images found in class folders ({root}/<class>/*.jpg)",
                            hint="point DATA_ROOT at the folder that holds one folder per class")
    return paths, labels, classes

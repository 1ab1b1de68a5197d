"""The image-folder layout both loaders read: ROOT/<class>/<file>, classes sorted by name
and numbered from 0, so labels agree across frameworks. Standard library only.

Each loader lists exactly what its framework's own loader would, so that swapping one
for the other changes neither the count, the order nor a label:
- TORCHVISION (make_loader): torchvision's `ImageFolder` (0.28): its IMG_EXTENSIONS,
  every folder a class (dot folders too), symlinked folders followed, and a class
  folder without one image is an error naming it (a silent label would shift every
  later class's index).
- KERAS (make_dataset): Keras 3's `image_dataset_from_directory`: its allowlist, which is
  what `tf.io.decode_image` decodes (no .tif, which would end an epoch), dot folders
  skipped, symlinks inside a class followed only when asked, an empty class kept.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from .errors import DataRootError, EmptyClassError

# torchvision.datasets.folder.IMG_EXTENSIONS (0.28), in its order (its error lists them).
TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# keras.src.utils.image_dataset_utils.ALLOWLIST_FORMATS (Keras 3).
KERAS_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


class PathList(Sequence[str]):
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

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return os.path.join(self.root, self.rel(i))

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Sequence) and len(self) == len(other)
                and all(a == b for a, b in zip(self, other)))
    # No __hash__: a class that defines __eq__ alone is unhashable, as a list is.

    def __getstate__(self) -> tuple[str, bytes, array[int]]:
        return self.root, bytes(self._blob), self._ends

    def __setstate__(self, state: tuple[str, bytes, array[int]]) -> None:
        self.root, blob, self._ends = state
        self._blob = bytearray(blob)


class Samples(Sequence[tuple[str, int]]):
    """(path, class index) pairs over a listing's paths and labels, as ImageFolder's
    `samples` list reads, without a tuple per file held in memory."""

    __slots__ = ("paths", "labels")

    def __init__(self, paths: Sequence[str], labels: Sequence[int]):
        self.paths, self.labels = paths, labels

    def __len__(self) -> int:
        return len(self.paths)

    @overload
    def __getitem__(self, i: int) -> tuple[str, int]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, int]]: ...

    def __getitem__(self, i: int | slice) -> tuple[str, int] | list[tuple[str, int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.paths[i], self.labels[i]

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Sequence) and len(self) == len(other)
                and all(tuple(a) == tuple(b) for a, b in zip(self, other)))


@dataclass(frozen=True)
class Rule:
    """How a framework's own loader lists an image folder."""

    name: str
    extensions: tuple[str, ...]
    dot_classes: bool           # a folder named .x is a class
    empty_class_error: bool     # a class without an image is refused


TORCHVISION = Rule("torchvision ImageFolder", TORCHVISION_EXTENSIONS, True, True)
KERAS = Rule("Keras image_dataset_from_directory", KERAS_EXTENSIONS, False, False)


def class_names(root: str | os.PathLike[str], rule: Rule = TORCHVISION) -> list[str]:
    """The class folders (symlinks to folders included), sorted by name."""
    return sorted(e.name for e in os.scandir(Path(root))
                  if e.is_dir() and (rule.dot_classes or not e.name.startswith(".")))


def list_image_folder(root: str | os.PathLike[str], rule: Rule = TORCHVISION, *,
                      follow_links: bool = True) -> tuple[PathList, list[int], list[str]]:
    """(paths, labels, class names) for every image under root/<class>/, in the order
    the rule's framework gives them: classes by name, then each class's folders walked
    and sorted by path, files sorted by name. The paths are a PathList (a sequence of
    str, stored compactly). `follow_links`: walk into symlinked folders inside a class
    (torchvision always does; Keras's follow_links)."""
    root = Path(root)
    classes = class_names(root, rule)
    paths = PathList("" if str(root) == "." else str(root))   # as os.walk names them
    labels: list[int] = []
    empty = []
    for label, cls in enumerate(classes):
        before = len(paths)
        # Sorted by folder path, as both frameworks sort os.walk's output (not os.walk's
        # own depth-first order: "a-b" sorts before "a/b").
        for dirpath, _dirs, filenames in sorted(os.walk(root / cls, followlinks=follow_links),
                                                key=lambda walked: walked[0]):
            below = os.path.relpath(dirpath, root)
            for f in sorted(filenames):
                if f.lower().endswith(rule.extensions):
                    paths.append_rel(os.path.join(below, f))
                    labels.append(label)
        if len(paths) == before:
            empty.append(cls)
    if not paths:
        raise DataRootError(f"{root}: no images found in class folders ({root}/<class>/*.jpg; "
                            f"{rule.name} reads {' '.join(rule.extensions)})",
                            hint="point DATA_ROOT at the folder that holds one folder per class")
    if empty and rule.empty_class_error:
        raise EmptyClassError(
            f"{root}: found no valid file for the classes {', '.join(empty)} "
            f"(as {rule.name} does, a class without images is refused: it would take a "
            f"label and shift every later class's index). Supported extensions are: "
            f"{', '.join(rule.extensions)}",
            hint="remove the empty class folders, or put their images in")
    return paths, labels, classes

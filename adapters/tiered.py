"""Tiered reads: a partial hot copy on the SSD in front of the whole dataset on the origin.

    DATA_ROOT=/mnt/hot/ds DATA_COLD_ROOT=/data/ds python train.py
    root = data_root(hot="/mnt/hot/ds", cold="/data/ds")    # the same, from Python

Each file is read from the hot copy when the copy holds it (its manifest lists it) and
the copy is verified, otherwise from the cold root. The split is decided per file from
the manifest, so the adapters know (not guess) which tier served each sample, and the
batch timer reports the share served hot. Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DataRootError, EmptyClassError
from .imagefolder import Rule, list_image_folder
from .retry import read_bytes
from hotcache.provision.hotcopy.format import MANIFEST, RESERVED, read_manifest

ENV_COLD = "DATA_COLD_ROOT"


@dataclass(frozen=True)
class Tiers:
    hot: Path                       # DATA_ROOT: the hot copy, or a folder inside it
    cold: Path                      # DATA_COLD_ROOT: the whole dataset
    members: frozenset[str] = field(default_factory=frozenset)   # relative to hot/cold

    @classmethod
    def of(cls, hot: Path, cold: Path, copy_root: str | None, verified: bool) -> "Tiers":
        """The members of a verified hot copy under `hot`; none for any other copy."""
        if not (verified and copy_root):
            return cls(hot, cold)
        listed = read_manifest(Path(copy_root) / MANIFEST)
        sub = hot.relative_to(copy_root).as_posix()
        if sub in ("", "."):
            return cls(hot, cold, frozenset(listed))
        prefix = sub + "/"
        return cls(hot, cold, frozenset(r[len(prefix):] for r in listed if r.startswith(prefix)))

    def is_hot(self, rel: str) -> bool:
        return rel in self.members

    def path(self, rel: str) -> str:
        """Where `rel` is read from (the hot copy for members)."""
        return os.path.join(self.hot if rel in self.members else self.cold, rel)

    def read(self, rel: str) -> tuple[bytes, bool]:
        """The bytes of `rel` and whether the hot copy served them. A member missing from
        the copy is read from the cold root; missing from both is an error naming it."""
        if rel in self.members:
            try:
                # an EIO is retried while the cache under the hot copy fails over
                return read_bytes(os.path.join(self.hot, rel)), True
            except FileNotFoundError:
                pass
        try:
            with open(os.path.join(self.cold, rel), "rb") as f:
                return f.read(), False
        except FileNotFoundError:
            raise DataRootError(f"{rel}: missing from both the hot copy {self.hot} and the "
                                f"cold root {self.cold}",
                                hint="restore the file at the cold root (the dataset's "
                                     "source), then refresh the hot copy") from None

    def fraction(self, total: int) -> float:
        return round(len(self.members) / total, 4) if total else 0.0


def count_files(root: Path) -> int:
    """Regular files under root, hotcache's own files left out."""
    return sum(len([f for f in files if f not in RESERVED]) for _d, _s, files in os.walk(root))


def list_tiered(tiers: Tiers, rule: Rule) -> tuple[list[str], list[int], list[str]]:
    """(relative paths, labels, class names) of the image folder made of both tiers: the
    cold root's files (listed by `rule`, the loader's framework's) plus any member the
    cold root lacks, classes numbered by name."""
    by_class: dict[str, set[str]] = {}
    try:
        paths, labels, classes = list_image_folder(tiers.cold, rule)
        for p, label in zip(paths, labels):
            by_class.setdefault(classes[label], set()).add(os.path.relpath(p, tiers.cold))
    except EmptyClassError:
        raise
    except DataRootError:
        if not tiers.members:
            raise
    for rel in tiers.members:
        cls, sep, _rest = rel.partition("/")
        if sep and (rule.dot_classes or not cls.startswith(".")) and rel.lower().endswith(rule.extensions):
            by_class.setdefault(cls, set()).add(rel)
    names = sorted(by_class)
    rels, out_labels = [], []
    for label, cls in enumerate(names):
        members = sorted(by_class[cls])
        rels += members
        out_labels += [label] * len(members)
    return rels, out_labels, names

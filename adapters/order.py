"""The next epoch's file order, written ahead for `hotcache warm --order FILE`.

    make_loader(image_size=(224, 224), order_file="/run/train/next-epoch.txt")
    hotcache warm /data/ds --order /run/train/next-epoch.txt     # beside the job

A seeded shuffle knows every epoch's order in advance. When an epoch starts, the loader
writes the order of the one after it: the files that will be read from the cold tier
(DATA_COLD_ROOT when tiered, else the data root), one path per line relative to that
root, in the order training will read them. `hotcache warm --order` then reads them
ahead into the page cache, as NoPFS and FFCV exploit a known order. Standard library
only.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

ENV_ORDER = "DATA_ORDER_FILE"


def cold_order(dataset: Any, indices: list[int]) -> tuple[Path, list[str]]:
    """(the root the lines are relative to, the cold files of `indices` in that order)
    for an image-folder dataset (`paths`, and `tiers`/`rels` when tiered): the hot copy's
    members are left out, as they are on the SSD already."""
    tiers = getattr(dataset, "tiers", None)
    if tiers is not None:
        return tiers.cold, [dataset.rels[i] for i in indices if not tiers.is_hot(dataset.rels[i])]
    root = str(dataset.root)
    return dataset.root, [os.path.relpath(dataset.paths[i], root) for i in indices]


def write_order(path: str | os.PathLike[str], lines: list[str]) -> None:
    """Replace `path` atomically (a reader sees the old list or the new one, never half)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(f"{line}\n" for line in lines))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

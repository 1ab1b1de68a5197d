"""hotcache's training side: what a training job imports.

    from hotcache.adapters import data_root, timed
    root = data_root("/mnt/hdd/imagenet")          # logs which copy is really used
    for batch in timed(loader):                     # logs how long each batch was waited for
        ...

`make_loader` (PyTorch) and `make_dataset` (tf.data) load their framework on first use:
importing this package imports neither torch nor TensorFlow (nor typer, pyudev, rich).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .dataroot import DataRoot, HotCopy, data_root
from .retry import read_bytes
from .timing import BatchTimer, Summary, timed, verdict

if TYPE_CHECKING:     # a type checker sees their signatures; Python loads them on first use
    from .pytorch import ImageFolderDataset, make_loader
    from .lightning import DataWaitMonitor
    from .tfdata import DataWaitCallback, make_dataset

_LAZY = {
    "make_loader": "pytorch", "ImageFolderDataset": "pytorch",
    "make_dataset": "tfdata", "DataWaitCallback": "tfdata", "DataWaitMonitor": "lightning",
}

__all__ = ["DataRoot", "HotCopy", "data_root", "read_bytes", "BatchTimer", "Summary", "timed",
           "verdict",
           "make_loader", "ImageFolderDataset", "make_dataset", "DataWaitCallback", "DataWaitMonitor"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

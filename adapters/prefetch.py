"""Read ahead in a thread: batches of the next steps are fetched while the training loop
works on this one.

Used by make_loader when batches decode in threads in the training process itself
(num_workers=0): the decoders release the GIL, so no worker process has to carry the
decoded pixels across a process boundary (shared memory, pickling, a file-descriptor
round trip per batch): a higher accelerator utilisation and more samples/s than one
worker process with the same threads (bench/bench_loader.py; figures in BENCHMARKS.md)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from .standin import StandsIn

class _Ended:
    """What the thread puts last: the end of the epoch, or the error that ended it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class ThreadPrefetch(StandsIn):
    """Iterate `iterable` (a DataLoader) `depth` items ahead in a daemon thread; each
    `iter()` is one epoch. An error in the thread is raised in the loop, with its type;
    leaving the loop early stops the thread."""

    def __init__(self, iterable: Iterable[Any], depth: int = 4) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth {depth}: read at least one batch ahead")
        self.iterable = iterable
        self.depth = depth

    def __iter__(self) -> Iterator[Any]:
        ahead: queue.Queue[Any] = queue.Queue(self.depth)
        stop = threading.Event()

        def put(item: object) -> bool:
            while not stop.is_set():
                try:
                    ahead.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def fetch() -> None:
            try:
                for item in self.iterable:
                    if not put(item):
                        return
            except BaseException as exc:     # noqa: BLE001 - handed to the loop, raised there
                put(_Ended(exc))
                return
            put(_Ended())

        thread = threading.Thread(target=fetch, name="hotcache-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = ahead.get()
                if isinstance(item, _Ended):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            stop.set()
            thread.join()

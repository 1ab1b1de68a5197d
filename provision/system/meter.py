"""Progress for long byte-moving work (copy, verify, warm): a rich bar with bytes/s and
ETA on a terminal, nothing elsewhere. The workers call `advance` (bytes) and `file_done`
from many threads; `start` begins a phase with its totals. observe/progress.py adds a
meter that publishes the same numbers as metrics while the command runs."""

from __future__ import annotations

import sys


class NullMeter:
    def start(self, label: str, total_bytes: int, total_files: int | None = None) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file_done(self, n: int = 1) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def stop(self) -> None:
        pass


class RichMeter(NullMeter):
    """One bar at a time on stderr; `start` again replaces it (e.g. warm's next pass)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  DownloadColumn(binary_units=True), TransferSpeedColumn(),
                                  TimeRemainingColumn(), console=Console(stderr=True),
                                  transient=False)
        self._task = None
        self._progress.start()

    def start(self, label: str, total_bytes: int, total_files: int | None = None) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)
        self._task = self._progress.add_task(label, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, nbytes)

    def note(self, text: str) -> None:
        self._progress.console.print(text, highlight=False, markup=False)

    def stop(self) -> None:
        self._progress.stop()


class PlainMeter(NullMeter):
    """Not a terminal: one line when each phase starts, and notes, on stderr."""

    def start(self, label: str, total_bytes: int, total_files: int | None = None) -> None:
        from hotcache.provision.system.sizes import size

        files = "" if total_files is None else f" in {total_files} files"
        sys.stderr.write(f"{label}: {size(total_bytes)}{files}\n")

    def note(self, text: str) -> None:
        sys.stderr.write(text + "\n")


def for_terminal(quiet: bool = False) -> NullMeter:
    if quiet:
        return NullMeter()
    return RichMeter() if sys.stderr.isatty() else PlainMeter()

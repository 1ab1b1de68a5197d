"""Progress for long byte-moving work (copy, verify, warm): a rich bar with bytes/s and
ETA on a terminal; elsewhere (Ansible, cron, a systemd unit, a pipe) one plain line on
stderr every HOTCACHE_PROGRESS_SECONDS (default 30) with files, bytes, rate and ETA.
The workers call `advance` (bytes) and `file_done` from many threads; `start` begins a
phase with its totals. observe/progress.py adds a
meter that publishes the same numbers as metrics while the command runs."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from hotcache.provision.system.sizes import size

if TYPE_CHECKING:
    from rich.progress import TaskID


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
    """One bar at a time on stderr; `start` again replaces it (e.g. warm's next pass).
    The bar's refresh thread starts with the first `start`, not before: a copy forks its
    worker processes before that, and a fork must not catch a thread holding stderr."""

    def __init__(self) -> None:
        # start-up: rich only for the bar on a terminal; the plain lines never load it
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn, TransferSpeedColumn)

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  DownloadColumn(binary_units=True), TransferSpeedColumn(),
                                  TimeRemainingColumn(), console=Console(stderr=True),
                                  transient=False)
        self._task: TaskID | None = None

    def start(self, label: str, total_bytes: int, total_files: int | None = None) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)
        else:
            self._progress.start()
        self._task = self._progress.add_task(label, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, nbytes)

    def note(self, text: str) -> None:
        self._progress.console.print(text, highlight=False, markup=False)

    def stop(self) -> None:
        self._progress.stop()


PROGRESS_ENV = "HOTCACHE_PROGRESS_SECONDS"
PROGRESS_SECONDS = 30.0


def progress_interval() -> float:
    try:
        return max(0.01, float(os.environ.get(PROGRESS_ENV) or PROGRESS_SECONDS))
    except ValueError:
        return PROGRESS_SECONDS


class PlainMeter(NullMeter):
    """Not a terminal: a line when each phase starts, then one every `interval` seconds
    from a timer thread, whether or not bytes moved (a log that stops means a stuck
    command, not a quiet one), and notes; all on stderr, each line whole:
    `copy: 1200/5000 files, 1.2 GiB/4.0 GiB (30%), 85.3 MiB/s, ETA 0:00:45`."""

    def __init__(self, interval: float | None = None, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.interval = interval if interval is not None else progress_interval()
        self.out, self.clock = out or sys.stderr, clock
        self.lock = threading.Lock()
        self.label, self.total_bytes = "", 0
        self.total_files: int | None = None
        self.bytes_done = self.files_done = 0
        self.began = clock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def start(self, label: str, total_bytes: int, total_files: int | None = None) -> None:
        with self.lock:
            self.label, self.total_bytes, self.total_files = label, total_bytes, total_files
            self.bytes_done = self.files_done = 0
            self.began = self.clock()
        files = "" if total_files is None else f" in {total_files} files"
        self._say(f"{label}: {size(total_bytes)}{files}")
        if self._timer is None:
            self._timer = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._timer.start()

    def advance(self, nbytes: int) -> None:
        with self.lock:
            self.bytes_done += nbytes

    def file_done(self, n: int = 1) -> None:
        with self.lock:
            self.files_done += n

    def note(self, text: str) -> None:
        self._say(text)

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()

    def line(self) -> str:
        """The progress line for now."""
        with self.lock:
            label, done, total = self.label, self.bytes_done, self.total_bytes
            files, total_files = self.files_done, self.total_files
            elapsed = max(self.clock() - self.began, 1e-9)
        rate = done / elapsed
        files_text = f"{files}/{total_files} files" if total_files is not None \
            else f"{files} files"
        share = f" ({done / total:.0%})" if total else ""
        eta = "-"
        if rate > 0 and total >= done:
            seconds = int((total - done) / rate)
            eta = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return (f"{label}: {files_text}, {size(done)}/{size(total)}{share}, "
                f"{size(int(rate))}/s, ETA {eta}")

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._say(self.line())

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


def for_terminal(quiet: bool = False) -> NullMeter:
    if quiet:
        return NullMeter()
    return RichMeter() if sys.stderr.isatty() else PlainMeter()

"""Progress of a running `hotcache copy` or `hotcache warm` as Prometheus metrics, so that
a dashboard, and a job's init container, can wait for "hot" on numbers that come from the
data itself (a warm-up that says Complete at 0 % cached is what users of other tools
complain about).

While the command runs, a file of its own in node_exporter's textfile folder,
`hotcache-progress-<operation>-<hash of the path>.prom`, holds bytes and files done and
left in the current phase (copy, read back, verify, warm pass N), whether it is still
running, and when it was written. It is rewritten atomically (temp file + rename), at most
every `interval` seconds and at each phase's start and at the end; the last write says
running 0. One file per operation and path: a later run of the same command replaces it,
and node_exporter merges it with the metrics timer's file. Each refresh of the metrics
timer removes progress files nobody has written for a day (`sweep`), so copies to many
paths, or runs that were killed, do not pile up in node_exporter's folder.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hotcache.provision.system.atomic import write_atomic
from hotcache.provision.system.meter import NullMeter

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

ENV_DIR = "HOTCACHE_METRICS_DIR"
DEFAULT_DIR = "/var/lib/prometheus/node-exporter"
INTERVAL = 5.0
LABELS = ["operation", "path", "phase"]


def metrics_dir(option: str | os.PathLike[str] | None) -> Path | None:
    """Where progress goes: the option, else $HOTCACHE_METRICS_DIR (empty: nowhere), else
    node_exporter's textfile folder when this user can write there, else nowhere."""
    if option is not None:
        return Path(option)
    env = os.environ.get(ENV_DIR)
    if env is not None:
        return Path(env) if env else None
    return Path(DEFAULT_DIR) if os.access(DEFAULT_DIR, os.W_OK | os.X_OK) else None


def progress_file(folder: Path, operation: str, path: Path) -> Path:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return folder / f"hotcache-progress-{operation}-{digest}.prom"


STALE_AFTER = 86400.0


def sweep(folder: Path, stale_after: float = STALE_AFTER, now: float | None = None) -> list[str]:
    """Remove the progress files in `folder` that this account wrote and nobody updated
    for `stale_after` seconds; returns their names. Only regular files with the progress
    name are touched (lstat on the folder's descriptor: a link is never followed) and
    others' files are left alone."""
    now = time.time() if now is None else now
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return []
    removed = []
    try:
        for name in sorted(os.listdir(fd)):
            if not (name.startswith("hotcache-progress-") and name.endswith(".prom")):
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and \
                        now - st.st_mtime >= stale_after:
                    os.unlink(name, dir_fd=fd)
                    removed.append(name)
            except FileNotFoundError:
                continue                # a run that ended meanwhile replaced or removed it
    finally:
        os.close(fd)
    return removed


class TextfileMeter(NullMeter):
    """Counts what `inner` (the terminal's meter) is told and publishes it as metrics."""

    def __init__(self, inner: NullMeter, file: Path, operation: str, path: Path,
                 interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner, self.file, self.interval, self.clock = inner, file, interval, clock
        self.labels = [operation, str(path), ""]
        self.lock = threading.Lock()
        self.bytes_total = self.bytes_done = self.files_done = 0
        self.files_total: int | None = None
        self.running = True
        self.written_at: float | None = None
        self.writes = 0

    def start(self, label: str, total_bytes: int, total_files: int | None = None) -> None:
        self.inner.start(label, total_bytes, total_files)
        with self.lock:
            self.labels[2] = label
            self.bytes_total, self.files_total = total_bytes, total_files
            self.bytes_done = self.files_done = 0
        self._write(force=True)

    def advance(self, nbytes: int) -> None:
        self.inner.advance(nbytes)
        with self.lock:
            self.bytes_done += nbytes
        self._write()

    def file_done(self, n: int = 1) -> None:
        self.inner.file_done(n)
        with self.lock:
            self.files_done += n
        self._write()

    def note(self, text: str) -> None:
        self.inner.note(text)

    def stop(self) -> None:
        self.running = False
        self._write(force=True)
        self.inner.stop()

    def collect(self) -> Iterator[Metric]:
        # prometheus_client is imported only where metrics are written: a copy or warm
        # without a metrics folder starts faster (it and its http/email modules: ~45 ms)
        from prometheus_client.core import GaugeMetricFamily

        with self.lock:
            values = {
                "bytes_done": ("Bytes done in the current phase.", self.bytes_done),
                "bytes_left": ("Bytes left in the current phase.",
                               max(0, self.bytes_total - self.bytes_done)),
                "files_done": ("Files done in the current phase.", self.files_done),
                "running": ("1 while the command runs, 0 once it has ended.", int(self.running)),
                "updated_timestamp_seconds": ("When this progress was written (Unix time).",
                                              time.time()),
            }
            if self.files_total is not None:
                values["files_left"] = ("Files left in the current phase.",
                                        max(0, self.files_total - self.files_done))
            labels = list(self.labels)
        for name, (help_, value) in values.items():
            family = GaugeMetricFamily(f"hotcache_progress_{name}",
                                       f"hotcache copy/warm progress: {help_}", labels=LABELS)
            family.add_metric(labels, value)
            yield family

    def _write(self, force: bool = False) -> None:
        # start-up: prometheus_client only where metrics are written (see collect)
        from prometheus_client import generate_latest
        from prometheus_client.registry import CollectorRegistry

        now = self.clock()
        with self.lock:
            if not force and self.written_at is not None and now - self.written_at < self.interval:
                return
            self.written_at = now
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        write_atomic(self.file, generate_latest(registry).decode())
        self.writes += 1


def wrap(inner: NullMeter, folder: Path | None, operation: str, path: Path) -> NullMeter:
    """`inner`, publishing its progress under `folder` when there is one."""
    if folder is None:
        return inner
    path = Path(os.path.abspath(path))
    return TextfileMeter(inner, progress_file(folder, operation, path), operation, path)

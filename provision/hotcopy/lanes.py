"""Where a copy's batches of files run: threads, and worker processes for many small files.

A thread copies a large file as well as a process would: hashing and each 1 MiB read or
write release the interpreter's lock for a long time. A file of a few KiB is a dozen
short system calls and some Python, and the lock changes hands at every call: with many
threads each hand-off wakes another thread, and the copy spends more CPU passing the lock
around than copying (BENCHMARKS.md has the figures). So when a copy holds many small
files, they go in batches to worker processes forked for it, one interpreter each, and
the copy's CPU work spreads over the cores. The processes inherit the copier and its
folder descriptors; what they copied (path, size, mtime, sha256, bytes moved) comes back
to this process, which alone journals and shows progress; the rate limit's clock is
shared memory. Large files stay with the
threads, whose progress shows within a file.

The processes are forked while the copy has no other thread, ignore Ctrl-C and SIGTERM
(this process stops the copy, and the shared stop flag stops them at the next file), and die
with this process: a copy killed outright leaves no worker writing into its staging
folder.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from hotcache.provision.errors import HotcacheError
from hotcache.provision.hotcopy.filecopy import Done, FileCopier
from hotcache.provision.hotcopy.selection import Entry
from hotcache.provision.system.chunks import CHUNK
from hotcache.provision.system.meter import NullMeter

SMALL = CHUNK     # a file read in one read is small: it may go to a worker process
MANY = 2048       # ... when the copy has at least this many small files (a fork each
                  # costs milliseconds; a few hundred small files are done by then)
_PR_SET_PDEATHSIG = 1
# What stops a copy: a terminal's Ctrl-C and systemd's SIGTERM reach every process of the
# group or unit; this process alone stops the copy.
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

# One file of a batch: its index in the selection, what the copy does with it (copier's
# COPY, LINK or CHECK), the file, and its known sha256 (hex) or "".
Item = tuple[int, int, Entry, str]
# What a batch returns: the (index, journal line) of each file, the bytes it moved (for
# the meter) and how many files --checksum found changed.
Finished = tuple[list[tuple[int, Done]], int, int]
RunBatch = Callable[[FileCopier, list[Item]], list[tuple[int, Done]]]


def processes(small_files: int, jobs: int) -> int:
    """How many worker processes a copy with this many small files gets: as many as
    --jobs allows threads (more than one a core keeps reads in flight while others wait
    on a cold disk, and costs no more CPU), none for a few small files."""
    return jobs if small_files >= MANY else 0


class Tally(NullMeter):
    """A worker process's meter: counts the bytes, which travel back with the batch."""

    moved = 0

    def advance(self, nbytes: int) -> None:
        self.moved += nbytes


class Lanes:
    """`submit(batch, small)`: a batch of small files to a worker process when there are
    any, anything else to a thread. Each future's result is a `Finished`."""

    def __init__(self, worker: FileCopier, run: RunBatch, threads: int, procs: int):
        self.worker, self.run = worker, run
        self.procs = _fork(worker, run, procs) if procs and _alone() else None
        self.threads = ThreadPoolExecutor(max_workers=threads,
                                          thread_name_prefix="hotcache-copy")

    def submit(self, batch: list[Item], small: bool) -> Future[Finished]:
        if small and self.procs is not None:
            return self.procs.submit(_in_child, batch)
        return self.threads.submit(self._in_thread, batch)

    def _in_thread(self, batch: list[Item]) -> Finished:
        return self.run(self.worker, batch), 0, 0   # the thread advanced the meter itself

    def shutdown(self, cancel: bool = False) -> None:
        self.threads.shutdown(wait=True, cancel_futures=cancel)
        if self.procs is not None:
            self.procs.shutdown(wait=True, cancel_futures=cancel)

    def __enter__(self) -> Lanes:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(cancel=exc[0] is not None)


def worker_died(exc: BaseException) -> HotcacheError | None:
    """A worker process killed from outside (the OOM killer, `kill -9`) as an error to
    report; None for anything else."""
    if not isinstance(exc, BrokenProcessPool):
        return None
    return HotcacheError("a worker process of the copy was killed from outside (the "
                         "kernel's out-of-memory killer, or a signal); nothing was published",
                         hint="check dmesg, then run the same command again: finished "
                              "files are not copied again")


def _alone(wait: float = 5.0) -> bool:
    """Whether this thread is, or soon becomes, the process's only one: a fork copies
    only the forking thread, and another thread holding a lock at that moment (stderr's,
    an import's) would leave it held in every worker. Short-lived threads (the CLI's
    preload) are waited for; where others stay (an application that embeds the copy),
    the copy keeps to threads."""
    deadline = time.monotonic() + wait
    for thread in threading.enumerate():
        # A thread Python did not start (one of TensorFlow's, calling back into Python)
        # is a "dummy" one, which cannot be joined; it still counts below.
        if thread is not threading.current_thread() and \
                not isinstance(thread, threading._DummyThread):
            thread.join(max(0.0, deadline - time.monotonic()))
    return threading.active_count() == 1


def _fork(worker: FileCopier, run: RunBatch, procs: int) -> ProcessPoolExecutor | None:
    """The worker processes, all forked now (with fork the executor starts every one at
    its first task), before this copy starts a thread. Ctrl-C and SIGTERM are held back
    meanwhile, so they find every worker ignoring them. A fork that fails (a container's process limit)
    kills those already forked and leaves the copy to threads."""
    pool = ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("fork"),
                               initializer=_start_child, initargs=(worker, run, os.getpid()))
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pool.submit(int).result()
        return pool
    except (OSError, BrokenProcessPool) as exc:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
            proc.join()
        pool.shutdown(wait=True, cancel_futures=True)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        worker.meter.note(f"warning: worker processes could not start ({why}); copying "
                          "with threads")
        return None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------- in a worker process

_child: tuple[FileCopier, RunBatch] | None = None


def _start_child(worker: FileCopier, run: RunBatch, parent: int) -> None:
    """Runs first in each worker process (arguments inherited through fork, not pickled)."""
    global _child
    for sig in _STOP_SIGNALS:       # the copy's to handle
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)   # blocked by _fork
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:   # the copy died before the line above
        os._exit(1)
    worker.meter = Tally()
    _child = (worker, run)


def _in_child(batch: list[Item]) -> Finished:
    if _child is None:
        raise RuntimeError("not a copy's worker process")
    worker, run = _child
    tally, recopied = worker.meter, worker.recopied
    assert isinstance(tally, Tally)
    tally.moved = 0
    done = run(worker, batch)
    return done, tally.moved, worker.recopied - recopied

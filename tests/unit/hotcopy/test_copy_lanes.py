"""Many small files go to worker processes (hotcopy/lanes.py), large ones to threads: the
copy is the same byte for byte; progress, the rate limit and --checksum's count travel
back from the processes; their errors arrive whole; a worker killed from outside is
reported and the next run finishes; a copy killed outright takes its workers with it
and resumes. MANY is lowered so that a few dozen files take the process lane."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hotcache.provision.errors import HotcacheError
from hotcache.provision.hotcopy import copier, filecopy, lanes
from hotcache.provision.system.meter import NullMeter
from tests.helpers import hotcache_json
from tests.unit.hotcopy.test_copy import make_dataset, sha256sum_check, tree

BIG = 2 << 20   # over lanes.SMALL: a thread's


@pytest.fixture(autouse=True)
def forking(monkeypatch):
    """Fork even though the test session has threads of its own (CI boots its guests
    from threads meanwhile): copies in this process would otherwise keep to threads.
    The test of that rule runs a copy in a fresh interpreter."""
    monkeypatch.setattr(lanes, "_alone", lambda wait=5.0: True)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTCACHE_STATE", str(tmp_path / "mappings.yaml"))
    monkeypatch.setattr(lanes, "MANY", 8)
    src = make_dataset(tmp_path / "src", n=20, size=3000)
    (src / "big.bin").write_bytes(os.urandom(BIG))
    return src, tmp_path / "dest"


real_alone = lanes._alone


def pid_log(monkeypatch, log: Path) -> None:
    """Each file copied writes 'pid path' to `log` (O_APPEND: whole lines from every
    process)."""
    real = filecopy.FileCopier.copy

    def logged(self, e):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{os.getpid()} {e.rel}\n".encode())
        finally:
            os.close(fd)
        return real(self, e)

    monkeypatch.setattr(filecopy.FileCopier, "copy", logged)


def copied_by(log: Path) -> dict[str, int]:
    return {rel: int(pid) for pid, rel in
            (line.split(" ", 1) for line in log.read_text().splitlines())}


def test_small_files_go_to_worker_processes_large_ones_to_threads(env, tmp_path,
                                                                  monkeypatch):
    src, dest = env
    pid_log(monkeypatch, tmp_path / "pids")
    summary = copier.copy(src, dest, copier.CopyOptions(jobs=3))
    by = copied_by(tmp_path / "pids")
    assert by.pop("big.bin") == os.getpid()
    assert len(by) == 41 and os.getpid() not in by.values()   # labels.csv and 40 images
    assert 1 <= len(set(by.values())) <= 3            # --jobs bounds the processes
    assert summary["copied_files"] == 42
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0


def test_a_few_small_files_stay_in_threads(env, tmp_path, monkeypatch):
    src, dest = env
    monkeypatch.setattr(lanes, "MANY", 42)            # 41 small files: too few
    pid_log(monkeypatch, tmp_path / "pids")
    copier.copy(src, dest, copier.CopyOptions())
    assert set(copied_by(tmp_path / "pids").values()) == {os.getpid()}
    assert tree(dest) == tree(src)


class Recording(NullMeter):
    def __init__(self):
        self.moved = self.files = 0

    def advance(self, nbytes: int) -> None:
        self.moved += nbytes

    def file_done(self, n: int = 1) -> None:
        self.files += n


def test_progress_counts_the_processes_bytes(env):
    src, dest = env
    meter = Recording()
    copier.copy(src, dest, copier.CopyOptions(), meter=meter)
    assert meter.moved == sum(map(len, tree(src).values())) and meter.files == 42


def test_one_rate_limit_holds_across_the_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(lanes, "MANY", 8)
    src = make_dataset(tmp_path / "src", classes=("a", "b"), n=40, size=1000)
    log = tmp_path / "taken"
    real = filecopy.Limiter.take

    def logged(self, n):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{os.getpid()} {n}\n".encode())
        os.close(fd)
        real(self, n)

    monkeypatch.setattr(filecopy.Limiter, "take", logged)
    made = []
    real_init = filecopy.Limiter.__init__

    def init(self, rate):
        real_init(self, rate)
        made.append((self, self.next.value))

    monkeypatch.setattr(filecopy.Limiter, "__init__", init)
    rate = 1 << 30
    copier.copy(src, tmp_path / "dest", copier.CopyOptions(bwlimit=rate, jobs=4))
    taken = [line.split() for line in log.read_text().splitlines()]
    assert {int(pid) for pid, _n in taken} - {os.getpid()}        # the processes took
    total = sum(map(len, tree(src).values()))
    assert sum(int(n) for _pid, n in taken) == total
    # One clock for all: every process's take moved the limit this process holds.
    limiter, first = made[0]
    assert limiter.next.value - first >= total / rate


def test_refresh_links_and_checksum_recopies_in_the_processes(env, tmp_path):
    src, dest = env
    copier.copy(src, dest, copier.CopyOptions())
    inodes = {p: (dest / p).stat().st_ino for p in tree(dest)}
    changed = src / "cat" / "003.jpg"
    st = changed.stat()
    changed.write_bytes(b"X" * st.st_size)            # same size and mtime: only
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns))   # --checksum sees it
    summary = copier.copy(src, dest, copier.CopyOptions(checksum=True))
    assert summary["changed"] and summary["checked_files"] == 42
    assert summary["copied_files"] == 1               # counted in a worker process
    assert tree(dest) == tree(src)
    (src / "dog" / "004.jpg").write_bytes(b"new")
    summary = copier.copy(src, dest, copier.CopyOptions())
    assert summary["reused_files"] == 41 and summary["copied_files"] == 1
    relinked = {p for p in tree(dest) if (dest / p).stat().st_ino == inodes.get(p)}
    assert relinked == set(tree(dest)) - {"cat/003.jpg", "dog/004.jpg"}


def test_an_error_in_a_process_names_the_file_and_publishes_nothing(env, monkeypatch):
    src, dest = env
    real = os.readv

    def fails(fd, buffers):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("dog/007.jpg"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, buffers)

    monkeypatch.setattr(filecopy.os, "readv", fails)
    with pytest.raises(HotcacheError, match=rf"dog/007\.jpg: {os.strerror(errno.EIO)}"):
        copier.copy(src, dest, copier.CopyOptions())
    assert not dest.exists()


def test_a_process_s_error_keeps_its_hint(env, monkeypatch):
    src, dest = env
    real = os.readv
    target = src / "cat" / "011.jpg"

    def always_writing(fd, buffers):
        if os.readlink(f"/proc/self/fd/{fd}") == str(target):
            with open(target, "ab") as f:
                f.write(b"x")
        return real(fd, buffers)

    monkeypatch.setattr(filecopy.os, "readv", always_writing)
    with pytest.raises(HotcacheError, match="kept changing") as err:
        copier.copy(src, dest, copier.CopyOptions())
    assert err.value.hint and "exclude that file" in err.value.hint
    assert not dest.exists()


def test_a_worker_killed_from_outside_is_reported_and_the_next_run_finishes(env,
                                                                           monkeypatch):
    src, dest = env
    real, parent = filecopy.FileCopier.copy, os.getpid()

    def oom_killed(self, e):
        if e.rel == "dog/005.jpg" and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, e)

    monkeypatch.setattr(filecopy.FileCopier, "copy", oom_killed)
    with pytest.raises(HotcacheError, match="worker process of the copy was killed"):
        copier.copy(src, dest, copier.CopyOptions())
    assert not dest.exists()
    monkeypatch.setattr(filecopy.FileCopier, "copy", real)
    copier.copy(src, dest, copier.CopyOptions())
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0


RUN_CLI = """
import sys
from hotcache.provision.hotcopy import lanes
lanes.MANY = 8
sys.argv = ["hotcache", *sys.argv[1:]]
from hotcache.provision.cli.app import main
main()
"""


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_copy_killed_outright_takes_its_workers_with_it_and_resumes(tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("HOTCACHE_STATE", str(tmp_path / "mappings.yaml"))
    src = make_dataset(tmp_path / "src", classes=("a", "b", "c", "d"), n=100, size=16 << 10)
    dest = tmp_path / "ds"
    journal = tmp_path / ".ds.hotcache-staging" / ".hotcache-journal"
    # --bwlimit 1M: a second for each batch of 64 files, so the kill lands mid-copy
    proc = subprocess.Popen([sys.executable, "-c", RUN_CLI, "copy", str(src), str(dest),
                             "--bwlimit", "1M", "--jobs", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_text().count("\n") >= 64:
            break
        time.sleep(0.02)
    workers = _children(proc.pid)
    assert proc.poll() is None, "the copy finished before it could be killed"
    assert len(workers) >= 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(map(_alive, workers)):
        time.sleep(0.05)
    assert not any(map(_alive, workers)), "worker processes outlived the copy"
    assert not dest.exists()

    done = [json.loads(line)[0] for line in journal.read_text().split("\n")[:-1]]
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0, out
    assert 0 < out["resumed_files"] == len(done) < 400
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0


FORKS_SEEN = """
import json, os, sys, threading
from hotcache.provision.hotcopy import lanes
from hotcache.provision.system import meter
lanes.MANY = 8
seen, fork = [], os.fork
def recording():
    seen.append(sorted(t.name for t in threading.enumerate()))
    return fork()
os.fork = recording
meter.for_terminal = lambda quiet=False: meter.RichMeter()   # the bar a terminal gets
sys.argv = ["hotcache", "copy", *sys.argv[1:]]
from hotcache.provision.cli.app import main
try:
    main()
finally:
    print(json.dumps(seen))
"""


def test_the_workers_are_forked_while_no_other_thread_runs(env):
    """A fork copies only the forking thread: another thread holding a lock then (the
    progress bar's, writing to stderr; the CLI's preload, importing) would leave that
    lock held in every worker. The CLI in a fresh interpreter, with a terminal's bar."""
    src, dest = env
    done = subprocess.run([sys.executable, "-c", FORKS_SEEN, str(src), str(dest), "--jobs",
                           "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [["MainThread"]] * 2
    assert tree(dest) == tree(src)


def test_a_copy_beside_other_threads_keeps_to_threads(env, tmp_path, monkeypatch):
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="an application's own").start()
    copies_in_this_process(env, tmp_path, monkeypatch, stop)


def copies_in_this_process(env, tmp_path, monkeypatch, stop: threading.Event) -> None:
    """Copy beside the other thread that waits on `stop`: every file is copied by this
    process (its threads), none by a forked worker."""
    src, dest = env
    monkeypatch.setattr(lanes, "_alone", lambda wait=5.0: real_alone(0.0))  # no 5 s wait
    pid_log(monkeypatch, tmp_path / "pids")
    try:
        copier.copy(src, dest, copier.CopyOptions())
    finally:
        stop.set()
    assert set(copied_by(tmp_path / "pids").values()) == {os.getpid()}
    assert tree(dest) == tree(src)


def test_a_thread_python_did_not_start_keeps_the_copy_to_threads(env, tmp_path, monkeypatch):
    """A thread started outside Python that called into it (TensorFlow's, a C library's)
    shows as a dummy thread, which cannot be joined: the copy still runs, in threads."""
    import _thread

    seen, stop = threading.Event(), threading.Event()

    def foreign() -> None:
        threading.current_thread()      # registers it as a dummy thread
        seen.set()
        stop.wait()
    _thread.start_new_thread(foreign, ())
    seen.wait(10)
    copies_in_this_process(env, tmp_path, monkeypatch, stop)


def test_a_fork_that_fails_leaves_no_worker_and_the_copy_to_threads(env, tmp_path,
                                                                     monkeypatch):
    src, dest = env
    real_fork, forks = os.fork, []

    def third_fails():
        forks.append(1)
        if len(forks) == 3:                # a container's process limit
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real_fork()

    monkeypatch.setattr(os, "fork", third_fails)
    pid_log(monkeypatch, tmp_path / "pids")
    meter = Recording()
    notes = []
    meter.note = notes.append
    copier.copy(src, dest, copier.CopyOptions(jobs=4), meter=meter)
    assert len(forks) == 3
    assert set(copied_by(tmp_path / "pids").values()) == {os.getpid()}
    assert tree(dest) == tree(src) and sha256sum_check(dest).returncode == 0
    assert multiprocessing.active_children() == []
    assert any("worker processes could not start" in n for n in notes)


def test_a_failed_file_stops_the_other_workers_at_their_next_file(tmp_path, monkeypatch):
    monkeypatch.setattr(lanes, "MANY", 8)
    src = make_dataset(tmp_path / "src", classes=("a",), n=400, size=100)
    log = tmp_path / "pids"
    real = filecopy.FileCopier.copy

    def slow_or_failing(self, e):
        if e.rel == "a/000.jpg":
            raise OSError(errno.EIO, os.strerror(errno.EIO), e.rel)
        time.sleep(0.05)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{os.getpid()} {e.rel}\n".encode())
        os.close(fd)
        return real(self, e)

    monkeypatch.setattr(filecopy.FileCopier, "copy", slow_or_failing)
    with pytest.raises(HotcacheError, match="a/000.jpg"):
        copier.copy(src, tmp_path / "dest", copier.CopyOptions(jobs=2))
    # Without a stop the other worker would finish its batch of 64 files and the ones
    # queued behind it. On a loaded machine it may not have started one (no log at all).
    assert len(log.read_text().splitlines() if log.exists() else []) < 32
    assert multiprocessing.active_children() == []


def test_a_worker_killed_while_it_holds_the_rate_limit_stalls_nobody(tmp_path):
    limiter = filecopy.Limiter(1 << 30)
    pid = os.fork()
    if pid == 0:                           # a worker killed inside take()
        with limiter._locked():
            os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    taker = threading.Thread(target=limiter.take, args=(1,), daemon=True)
    taker.start()
    taker.join(30)
    assert not taker.is_alive(), "take() waits on a lock a dead process held"

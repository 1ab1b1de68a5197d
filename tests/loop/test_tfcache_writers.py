"""Two writers of one tf.data cache folder never delete each other's files: the writer's
flock is the only proof of life, across processes and PID namespaces (containers that
share a hostname and number their own processes). The writers are real processes doing
what a caching iterator leaves on disk (TensorFlow's lockfile and partial shard); the
lock and clean-up are hotcache's real code. Root: `unshare --pid` makes the namespace."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hotcache.adapters import tfcache
from hotcache.adapters.errors import CacheLockedError, DataRootError

pytestmark = pytest.mark.root

KEY = "ds-1-0123456789abcdef"
WRITER = textwrap.dedent("""
    import sys, time
    from hotcache.adapters import tfcache
    prefix = tfcache.prepare(sys.argv[1], sys.argv[2])
    open(f"{prefix}_0.lockfile", "w").write("Created at: 0")      # TensorFlow's, mid-pass
    open(f"{prefix}_0.data-00000-of-00001", "wb").write(b"partial shard")
    print("writing", flush=True)
    time.sleep(600)
""")


def start_writer(cache, *wrap: str) -> subprocess.Popen:
    proc = subprocess.Popen([*wrap, sys.executable, "-c", WRITER, str(cache), KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    assert line == "writing\n", proc.stderr.read()
    return proc


def released(lock, seconds: float = 60) -> None:
    """Wait until the kernel has dropped a killed writer's flock (a process killed in
    another PID namespace is reaped a moment later)."""
    fd = os.open(lock, os.O_RDONLY)
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{lock} still held"
                time.sleep(0.1)
    finally:
        os.close(fd)


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("wrap", [(), ("unshare", "--pid", "--fork", "--mount-proc")],
                         ids=["same-namespace", "other-pid-namespace"])
def test_a_live_writer_keeps_its_files_and_a_dead_ones_are_cleared(tmp_path, wrap):
    cache = tmp_path / "cache"
    writer = start_writer(cache, *wrap)
    folder = cache / KEY
    try:
        before = files(folder)
        second = subprocess.run([sys.executable, "-c", WRITER, str(cache), KEY],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode != 0 and "holds its lock" in second.stderr
        with pytest.raises(CacheLockedError, match="PID namespace pid:"):
            tfcache.prepare(cache, KEY)              # this process, a restarted rank
        assert files(folder) == before               # nothing of the live writer deleted
    finally:
        os.killpg(writer.pid, signal.SIGKILL)        # the writer (and its namespace) dies
        writer.wait()
    released(folder / "writer.lock")
    tfcache.prepare(cache, KEY)                      # its writer is gone: cleared
    assert sorted(p.name for p in folder.iterdir()) == ["owner.json", "writer.lock"]


def test_cache_names_and_version_labels_never_leave_the_cache_folder(tmp_path):
    for bad in ("x/../../..", "..", "a/b"):
        with pytest.raises(DataRootError):
            tfcache.prepare(tmp_path / "cache", bad)
    assert not tfcache.label_ok("x/../..") and not tfcache.label_ok("..")
    assert tfcache.label_ok("2025-06.1+rc")
    assert [p.name for p in tmp_path.iterdir()] == []

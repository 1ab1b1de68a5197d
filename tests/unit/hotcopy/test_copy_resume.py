"""A copy killed with SIGKILL half-way resumes without copying finished files again, and
ends identical to a copy that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.helpers import HOTCACHE, hotcache, hotcache_json
from tests.unit.hotcopy.test_copy import make_dataset, sha256sum_check, tree


def test_sigkill_half_way_then_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTCACHE_STATE", str(tmp_path / "mappings.yaml"))
    src = make_dataset(tmp_path / "src", classes=("a", "b", "c", "d"), n=50, size=64 << 10)
    dest = tmp_path / "ds"
    staging = tmp_path / ".ds.hotcache-staging"
    journal = staging / ".hotcache-journal"
    # --bwlimit makes the copy take ~13 s, so that it is killed in the middle (once the
    # journal holds more than folder a's 50 files, ~4 s in) even on a loaded machine
    proc = subprocess.Popen([*HOTCACHE, "copy", str(src), str(dest), "--bwlimit", "1M",
                             "--jobs", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and journal.read_text().count("\n") > 50:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the copy finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    assert not dest.exists(), "a killed copy must not publish anything"
    # only whole lines count: the kill may cut the last one short, and the copier treats
    # such a line as not done (that file is copied again)
    lines = journal.read_text().split("\n")[:-1]
    done = [json.loads(line)[0] for line in lines]
    total = len(tree(src))
    assert 0 < len(done) < total
    before = {rel: os.stat(staging / rel) for rel in done}

    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0, out
    assert out["resumed_files"] == len(done)
    assert out["copied_files"] == total - len(done)
    for rel, st in before.items():     # finished files were not written again
        now = os.stat(dest / rel)
        assert (now.st_ino, now.st_ctime_ns) == (st.st_ino, st.st_ctime_ns), rel
    assert not staging.exists()
    # folder a, whose files were all copied before the kill, gets its mode too
    assert {(dest / c).stat().st_mode & 0o7777 for c in "abcd"} == {0o755}

    reference = tmp_path / "reference"
    hotcache("copy", src, reference, check=True)
    assert tree(dest) == tree(src) == tree(reference)
    assert (dest / "SHA256SUMS").read_bytes() == (reference / "SHA256SUMS").read_bytes()
    assert sha256sum_check(dest).returncode == 0
    assert hotcache("verify", dest, "--full").returncode == 0


def test_a_second_copy_to_the_same_dest_is_refused_while_one_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTCACHE_STATE", str(tmp_path / "mappings.yaml"))
    src = make_dataset(tmp_path / "src", classes=("a",), n=20, size=64 << 10)
    dest = tmp_path / "ds"
    # 1 KiB/s: the first copy is still running however long the second takes to start
    # on a loaded machine (it is killed below, never waited for)
    first = subprocess.Popen([*HOTCACHE, "copy", str(src), str(dest), "--bwlimit", "1K"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / ".ds.hotcache-staging" / ".hotcache-staging.json").exists():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.02)
        second = hotcache("copy", src, dest)
        assert first.poll() is None, "the first copy ended: nothing was tested"
        assert second.returncode == 3 and "another hotcache copy" in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    rc, out = hotcache_json("copy", src, dest)
    assert rc == 0 and tree(dest) == tree(src)

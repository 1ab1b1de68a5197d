"""`hotcache warm` on a real XFS: the page cache is primed (checked with util-linux
`fincore`), and the block-cache pass logic repeats until the cache settles, every read
reaching the device (the real dm-cache/bcache runs are in the guest-kernel tier)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

import hotcache.provision.tend.warm as w
from hotcache.provision.tend.warm import warm
from hotcache.provision.errors import ExitCode
from tests.helpers import hotcache, hotcache_json
from tests.loop.test_copy_xfs import small_xfs
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


def resident(files: list[Path]) -> int:
    out = subprocess.run(["fincore", "--json", "--bytes", *map(str, files)], check=True,
                         capture_output=True, text=True).stdout
    return sum(int(row["res"]) for row in json.loads(out)["fincore"])


def evict(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_warm_fills_the_page_cache(sandbox):
    mp = small_xfs(sandbox, "ssd")
    data = make_dataset(mp / "ds", classes=("a", "b", "c"), n=20, size=128 << 10)
    files = sorted(p for p in data.rglob("*") if p.is_file())
    total = sum(f.stat().st_size for f in files)
    os.sync()
    evict(files)
    assert resident(files) < total // 10
    rc, report = hotcache_json("warm", data, "--jobs", "4")
    assert rc == 0, report
    assert (report["files"], report["bytes"], report["backend"]) == (len(files), total, "none")
    assert report["passes"][0]["bytes"] == total and not report["evicted_before_reading"]
    assert resident(files) >= total - len(files) * 4096


class FakeTime:
    """Stands in for the `time` module inside warm: monotonic() reads a clock that only
    sleep() moves."""

    def __init__(self):
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_block_cache_reads_reach_the_device_and_stop_when_promotion_stops(sandbox,
                                                                         monkeypatch):
    """The backend's statistics cannot exist on this kernel, so they are scripted here
    (the guest tier checks warm against real dm-cache and bcache counters); the reads,
    the eviction before each read, the pass loop and the origin's read counter (the loop
    device's) are real, and the one-second spacing of re-reads is read off an injected
    clock."""
    mp = small_xfs(sandbox, "ssd")
    data = make_dataset(mp / "ds", classes=("a",), n=10, size=256 << 10)
    files = sorted(p for p in data.rglob("*") if p.is_file())
    total = sum(f.stat().st_size for f in files)
    os.sync()
    dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(mp)], check=True,
                         capture_output=True, text=True).stdout.strip()
    sectors_read = Path(f"/sys/class/block/{os.path.basename(dev)}/stat")
    monkeypatch.setattr(w, "slow_files", lambda files, seconds: [])  # timing: unit tests
    # the sweep's one window: +40, +30, +10, +0, +0 (done); full passes: +10, +0 (no hit
    # and miss counters to go by, so one quiet pass settles it)
    promotions = iter([0, 40, 70, 80, 80, 80, 90, 90])
    seen = []

    def stats():
        seen.append(int(sectors_read.read_text().split()[2]))
        p = next(promotions)
        return {"promotions": p, "cache_used_bytes": p * 4096, "hit_ratio": p / 100}

    # smq counts a block once per 1-s tick: re-reads must be a tick apart. The clock is
    # injected (reads take no time on it, so every gap is warm's own sleep).
    clock = FakeTime()
    starts = []
    real_pass = w.read_pass
    monkeypatch.setattr(w, "time", clock)
    monkeypatch.setattr(w, "read_pass", lambda *a: starts.append(clock.now) or real_pass(*a))
    report = warm(data, backend="dm-cache", stats=stats, max_passes=6, jobs=2)
    assert len(starts) == 7                          # 5 reads of the window, 2 passes
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(g >= w.TICK - 1e-9 for g in gaps[:4]), gaps   # the window's re-reads
    assert gaps[5] >= w.TICK - 1e-9, gaps            # one full pass to the next
    assert [(s["reads"], s["promoted"]) for s in report["sweep"]] == [(5, 80)]
    assert [p["stats"]["promotions"] for p in report["passes"]] == [90, 90]
    assert report["stopped"] == "promotions and cache use stopped rising"
    assert (report["hit_ratio_before"], report["hit_ratio_after"]) == (0.0, 0.9)
    assert report["evicted_before_reading"] and report["metadata_reread"]   # root: allowed
    # every read (5 of the window, 2 full passes) took the whole data set from the block
    # device, not from the page cache
    assert len(seen) == 8
    assert all(b - a >= total // 512 for a, b in zip(seen, seen[1:]))

    promotions = itertools.count(0, 10)
    capped = warm(data, backend="lvmcache", stats=stats, max_passes=3)
    assert capped["sweep"][0]["reads"] == w.WINDOW_READS
    assert len(capped["passes"]) == 3 and "max-passes 3" in capped["stopped"]

    # bcache: no sweep; the loop device stands for the origin, and as every pass reads
    # all of it from there, warm reads on until 3 passes in a row changed nothing
    promotions = itertools.repeat(0)

    def origin() -> int:
        return int(sectors_read.read_text().split()[2]) * 512

    still = warm(data, backend="bcache", stats=stats, origin=origin, max_passes=8)
    assert still["sweep"] == [] and len(still["passes"]) == 3
    assert all(p["from_origin"] >= total for p in still["passes"])
    assert still["stopped"].startswith("promotions and cache use stopped rising; ")
    assert still["stopped"].endswith(" of 2.5 MiB in the last pass came from the origin")


class Opens:
    """The files opened under some folders, in the order the kernel saw the opens
    (inotify IN_OPEN: real events, no guess from timings). O_PATH handles are not opens
    and make no event."""

    def __init__(self, root: Path, folders: list[Path]):
        from inotify_simple import INotify, flags

        self.root, self.inotify = root, INotify()
        self.where = {self.inotify.add_watch(f, flags.OPEN): f for f in folders}

    def read(self) -> list[str]:
        from inotify_simple import flags

        events = self.inotify.read(timeout=0)
        return [(self.where[e.wd] / e.name).relative_to(self.root).as_posix() for e in events
                if e.name and not e.mask & flags.ISDIR]


def test_warm_order_reads_the_listed_files_once_in_that_order(sandbox):
    import random

    mp = small_xfs(sandbox, "ssd")
    data = make_dataset(mp / "ds", classes=("a", "b"), n=15, size=64 << 10)
    files = sorted(p.relative_to(data).as_posix() for p in data.rglob("*.jpg"))
    listed = random.Random(3).sample(files, 20)       # the next epoch's cold part, shuffled
    order = sandbox / "next-epoch.txt"
    order.write_text("".join(f"{r}\n" for r in listed) + "\n")   # a blank line is skipped
    os.sync()
    evict([data / r for r in files])
    opens = Opens(data, [data / "a", data / "b"])
    rc, report = hotcache_json("warm", data, "--order", order, "--jobs", "1")
    assert rc == 0, report
    assert opens.read() == listed                      # in the file's order, each once
    assert report["files"] == 20 and report["order"] == str(order)
    assert report["passes"][0]["bytes"] == sum((data / r).stat().st_size for r in listed)
    assert resident([data / r for r in listed]) >= sum(
        (data / r).stat().st_size for r in listed) - 20 * 4096
    unlisted = [data / r for r in files if r not in listed]
    assert resident(unlisted) < 4096 * len(unlisted)


@pytest.mark.parametrize("bad, why", [
    ("../outside.bin", "is not a path inside"),
    ("/etc/hostname", "is not a path inside"),
    ("a/link.jpg", "a symlink on the way"),
    ("a/nope.jpg", "no such file"),
    ("a", "is not a regular file"),
])
def test_warm_order_refuses_paths_outside_the_dataset(sandbox, bad, why):
    """Every line is checked before a byte is read: a path leading out of the dataset
    (`..`, absolute, a symlink to a file outside) or naming no file is refused, and
    neither the outside file nor the good lines before it are opened."""
    mp = small_xfs(sandbox, "ssd")
    data = make_dataset(mp / "ds", classes=("a",), n=3, size=4096)
    victim = mp / "outside.bin"
    victim.write_bytes(b"secret")
    (data / "a" / "link.jpg").symlink_to(victim)
    order = sandbox / "order.txt"
    order.write_text(f"a/000.jpg\n{bad}\na/001.jpg\n")
    opens = Opens(mp, [mp, data / "a"])
    proc = hotcache("warm", data, "--order", order)
    assert proc.returncode == ExitCode.BAD_INPUT, proc
    assert f"--order {order}, line 2: {bad!r} " in proc.stderr and why in proc.stderr
    assert "Traceback" not in proc.stderr
    assert opens.read() == []                          # nothing opened, outside or in


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\xff\xfe not text\n"])
def test_warm_order_bad_file_is_a_clear_error(sandbox, content):
    mp = small_xfs(sandbox, "ssd")
    data = make_dataset(mp / "ds", classes=("a",), n=2, size=4096)
    order = sandbox / "order.txt"
    order.write_bytes(content)
    for given in (order, sandbox / "missing.txt"):
        proc = hotcache("warm", data, "--order", given)
        assert proc.returncode == ExitCode.BAD_INPUT, proc
        assert f"--order {given}: " in proc.stderr and "one path per line" in proc.stderr
        assert "Traceback" not in proc.stderr

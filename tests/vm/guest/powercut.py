"""Run by boot 1 after its pytest (not a test module): cut the guest's power while one
hot copy runs and right after another returned, with no sync and no unmount. Boot 2
(guest_reboot.py::test_hot_copies_survive_the_power_cut) checks what reached the disks.

Copy A (HDD part 5) returns, then the power goes: a copy that was published must be on
disk whole. Copy B (HDD part 6, rate-limited) is cut mid-way: every file its staging
journal names must be on disk with the journal's sha256. The files are small (no
write-behind), so without syncfs their data would still be in the page cache, which the
power cut loses. What happened is written to PERSIST/powercut.json (on the host, fsync'd)
before the cut. Never `sync` here: that would make the test prove nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vmlib import HDD, PERSIST, partition_disks, sh

from cases import POWERCUT_PARTITIONS

BIN = Path(sys.executable).parent / "hotcache"
MNT = Path("/tmp/hcvm-powercut")
COPIES = {"a": (32, 512 * 1024, []), "b": (128, 512 * 1024, ["--bwlimit", "1M", "--jobs", "2"])}


def mountpoint(copy: str) -> Path:
    return MNT / copy


def partition(copy: str) -> str:
    return f"{HDD}-part{POWERCUT_PARTITIONS['ab'.index(copy)]}"


def make_source(folder: Path, count: int, size: int) -> dict[str, str]:
    """Source files on a tmpfs (written without any sync)."""
    folder.mkdir(parents=True)
    sums = {}
    for i in range(count):
        data = os.urandom(size)
        (folder / f"p{i:04d}.bin").write_bytes(data)
        sums[f"p{i:04d}.bin"] = hashlib.sha256(data).hexdigest()
    return sums


def journal_lines(copy: str) -> int:
    journal = mountpoint(copy) / ".hot.hotcache-staging" / ".hotcache-journal"
    try:
        return journal.read_text().count("\n")
    except FileNotFoundError:
        return 0


def record(facts: dict) -> None:
    fd = os.open(PERSIST / "powercut.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps(facts, indent=1).encode())
        os.fsync(fd)            # this one file only (it lives on the host, over 9p)
    finally:
        os.close(fd)


def main(cut=None) -> None:
    cut = cut or power_cut
    PERSIST.mkdir(parents=True, exist_ok=True)
    sh("modprobe", "-a", "xfs")
    partition_disks()
    env = {**os.environ, "HOTCACHE_STATE": str(PERSIST / "powercut-mappings.yaml"),
           "HOTCACHE_METRICS_DIR": ""}
    src = MNT / "src"
    MNT.mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", MNT)
    facts: dict = {"sums": {}}
    for copy, (count, size, _) in COPIES.items():
        facts["sums"][copy] = make_source(src / copy, count, size)
        sh("wipefs", "--all", "--quiet", partition(copy))
        sh("mkfs.xfs", "-q", "-f", partition(copy))
        mountpoint(copy).mkdir()
        sh("mount", partition(copy), mountpoint(copy))
    argv = lambda c: [BIN, "copy", src / c, mountpoint(c) / "hot", *COPIES[c][2]]  # noqa: E731
    b = subprocess.Popen(argv("b"), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    a = subprocess.run(argv("a"), env=env, capture_output=True, text=True)
    facts["a"] = {"code": a.returncode, "out": (a.stdout + a.stderr)[-2000:]}
    # B: wait for a checkpoint after the first one seen, whose syncfs made that first
    # journal line durable too
    first = 0
    deadline = time.monotonic() + 120
    while b.poll() is None and time.monotonic() < deadline:
        lines = journal_lines("b")
        if first and lines > first:
            break
        first = first or lines
        time.sleep(0.2)
    facts["b"] = {"running": b.poll() is None, "journal_lines_before": first,
                  "journal_lines_at_cut": journal_lines("b")}
    record(facts)
    print(json.dumps({k: facts[k] for k in ("a", "b")}), flush=True)
    cut(b)


def power_cut(_running) -> None:
    Path("/proc/sys/kernel/sysrq").write_text("1\n")
    Path("/proc/sysrq-trigger").write_text("b\n")       # reset now: no sync, no unmount
    time.sleep(60)
    raise SystemExit("the guest is still running after the power cut")


if __name__ == "__main__":
    main()

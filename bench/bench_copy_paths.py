"""Benchmark: the two ways `hotcache copy` moves one large file, in the same run on the
same files, to show what the kernel copy saves per byte.

  buffered   1 MiB reads into a buffer, hash the buffer, write it (files under 16 MiB,
             and any file where sendfile cannot copy)
  kernel     sendfile, 8 MiB at a time, hashed from the staging file's pages through a
             read-only mapping (files of 16 MiB and up)

Both are hotcache's own code (hotcopy/filecopy.FileCopier), each file checked against
sha256 of its source; two files at a time, as `copy` runs large files. The source is
read once first, so the page cache holds it and the figures are the CPU cost of the copy,
not the disk's speed. Rounds alternate which path goes first.

Run:  .venv/bin/python bench/bench_copy_paths.py [--quick] [--rounds N] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hotcache.provision.hotcopy import filecopy
from hotcache.provision.hotcopy.selection import Entry


def make_files(src: Path, count: int, size: int) -> list[Entry]:
    src.mkdir(parents=True)
    block = os.urandom(1 << 20)
    entries = []
    for i in range(count):
        path = src / f"{i:03}.bin"
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                f.write(block + i.to_bytes(8, "little"))   # no two MiB alike
        st = path.stat()
        entries.append(Entry(path.name, st.st_size, st.st_mtime_ns, 0o644, dev=st.st_dev,
                             ino=st.st_ino))
    return entries


def copy_all(path: str, src: Path, dst: Path, entries: list[Entry]) -> tuple[float, float]:
    """Wall and CPU seconds (this process, all threads) to copy `entries` one way."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir()
    os.sync()
    # buffered: no file is large enough for the kernel path
    kernel_copy = filecopy.KERNEL_COPY if path == "kernel" else 1 << 62
    saved, filecopy.KERNEL_COPY = filecopy.KERNEL_COPY, kernel_copy
    src_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    dst_fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        copier = filecopy.FileCopier(src, src_fd, dst_fd)
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with ThreadPoolExecutor(filecopy.large_streams()) as pool:
            done = list(pool.map(copier.copy, entries))
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        filecopy.KERNEL_COPY = saved
        os.close(src_fd)
        os.close(dst_fd)
    for rel, _, _, digest in done:
        with open(src / rel, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != digest:
                sys.exit(f"{path}: wrong hash for {rel}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 x 64 MiB instead of 8 x 256 MiB")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp"),
                    help="where the files go (a disk file system, not tmpfs)")
    args = ap.parse_args()
    count, size = (4, 64 << 20) if args.quick else (8, 256 << 20)
    work = Path(tempfile.mkdtemp(prefix="hotcache-bench-paths-", dir=args.workdir))
    try:
        src, dst = work / "src", work / "dst"
        entries = make_files(src, count, size)
        for e in entries:                 # the source in the page cache from here on
            with open(src / e.rel, "rb") as f:
                while f.read(8 << 20):
                    pass
        runs: dict[str, list[tuple[float, float]]] = {"buffered": [], "kernel": []}
        for r in range(args.rounds):
            for path in (("buffered", "kernel") if r % 2 == 0 else ("kernel", "buffered")):
                runs[path].append(copy_all(path, src, dst, entries))
        print(f"{count} files x {size >> 20} MiB in {work}, source in the page cache, "
              f"{filecopy.large_streams()} at a time, {args.rounds} rounds; cpus "
              f"{os.cpu_count()}")
        med = {}
        for path, xs in runs.items():
            med[path] = (statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs))
            print(f"  {path:<9} {med[path][0]:6.2f} s  {med[path][1]:6.2f} CPU-s   "
                  f"(runs: {', '.join(f'{w:.2f}' for w, _ in xs)})")
        print(f"  kernel vs buffered: {med['kernel'][0] / med['buffered'][0]:.2f}x the time, "
              f"{med['kernel'][1] / med['buffered'][1]:.2f}x the CPU")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

"""Benchmark: `hotcache copy` at many small files. Time against `cp -a SRC DST && sync` in
the same run, peak memory (RSS) of `hotcache copy` and of `hotcache verify --full`, and
the time make_loader takes to its first batch over the copy.

    .venv/bin/python bench/bench_scale.py [--files 20000] [--workdir /var/tmp] [--keep]
        [--rounds 1|2]

N files of 2 KiB (--size) in 1,000 class folders (named .jpg so that the image-folder
listing takes them; their bytes are random, so the loader is asked for raw bytes, not
decoded images). The source is built once; then cp+sync and hotcache copy run in turn
(cp, hotcache, hotcache, cp: load from other work falls on both alike), each into a
fresh DST on the same filesystem, the best of each counted; the copies are removed only
after the last one is timed (a copy right after a mass deletion is slowed by ext4's
inode allocator, not by what it does), and the source is synced before the first.

Warm (the default): the page cache is not dropped, so the copies read a source that is
in memory, and the figure is each tool's own CPU and file-creation cost. Up to a few
hundred thousand files that holds for every copy; at millions the source and the copies
no longer fit in memory, and a copy that runs later reads a source the earlier copies
pushed out of the cache. --cold (root) syncs and drops the page cache, dentries and
inodes before each copy, so every copy starts alike and reads the source from its disk,
as a first copy off an HDD array does; on a VM it also pauses free page reporting for
the run (bench_copy.steady_memory: memory freed by the drop would otherwise be handed to
the host, and each copy's first touch of it would cost a host page fault). Peak RSS is
ru_maxrss of that one child process (os.wait4): the copy's own, threads included, or its
largest worker process's, whichever is larger. Goals: hotcache <= 1.5x cp+sync, peak RSS
far below 1 KiB a file (at 2,000,000 files at most twice that at 200,000), first batch
<= 10 s at 200,000 files.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_copy import steady_memory

HOTCACHE = [sys.executable, "-m", "hotcache.provision"]
FOLDERS = 1000


def make_dataset(root: Path, files: int, size: int) -> None:
    per = max(1, files // FOLDERS)
    for i in range(files):
        folder = root / f"c{i // per:04d}"
        if i % per == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:08d}.jpg").write_bytes(os.urandom(size))


def measured(argv: list) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of one command, which must succeed."""
    start = time.perf_counter()
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv[0]} ... failed with exit code {proc.returncode}")
    return seconds, usage.ru_maxrss * 1024


def drop_caches() -> None:
    """Every copy starts from a cold source: written back, then dropped."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cp_sync(src: Path, dst: Path) -> tuple[float, int]:
    start = time.perf_counter()
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - start, 0


def hotcache_copy(src: Path, dst: Path) -> tuple[float, int]:
    return measured([*HOTCACHE, "copy", src, dst])


def _size(sample: bytes) -> int:
    return len(sample)


def first_batch(dest: Path) -> float:
    """Seconds from make_loader over the copy to its first batch (the listing is most of
    it at many files)."""
    from hotcache.adapters.pytorch import make_loader

    start = time.perf_counter()
    loader = make_loader(dest, decode=False, transform=_size, batch_size=32)
    next(iter(loader))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--size", type=int, default=2048, help="bytes per file")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--no-loader", action="store_true", help="skip the first-batch time")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip verify --full (the copy's time and memory only)")
    ap.add_argument("--keep", action="store_true", help="keep the source and the copy")
    ap.add_argument("--rounds", type=int, choices=(1, 2), default=2,
                    help="2: cp, hotcache, hotcache, cp (the best of each); 1: cp, hotcache "
                         "(for the largest sizes, where each copy takes many minutes)")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache before each copy (root): the source is read "
                         "from its disk, as in a first copy off an HDD array")
    ap.add_argument("--xfs", action="store_true",
                    help="the source and each copy on a fresh XFS filesystem of its own "
                         "(loop devices under --workdir; root)")
    args = ap.parse_args()
    if (args.cold or args.xfs) and os.geteuid() != 0:
        ap.error("--cold and --xfs need root")
    with steady_memory(keep=not args.cold) as memory:
        if memory:
            print(memory)
        run(args)


class Filesystems:
    """Where the source and each copy live: folders on --workdir's filesystem, or with
    --xfs a fresh XFS filesystem each (a sparse image on a loop device, mounted
    noatime), as on a hot tier. A fresh filesystem per copy has no history: no copy pays
    for files deleted before it, and removing one is an unmount, not millions of
    unlinks."""

    def __init__(self, work: Path, xfs: bool, image_bytes: int):
        self.work, self.xfs, self.image_bytes = work, xfs, image_bytes
        self.mounted: list[Path] = []

    def folder(self, name: str) -> Path:
        """A new place for a tree called `name` (which does not exist yet)."""
        if not self.xfs:
            return self.work / name
        mnt = self.work / f"{name}.mnt"
        mnt.mkdir()
        image = self.work / f"{name}.img"
        with open(image, "wb") as f:
            f.truncate(self.image_bytes)
        subprocess.run(["mkfs.xfs", "-q", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop,noatime", str(image), str(mnt)], check=True)
        self.mounted.append(mnt)
        return mnt / name

    def remove(self, tree: Path) -> None:
        if not self.xfs:
            shutil.rmtree(tree)
            return
        mnt = tree.parent
        subprocess.run(["umount", str(mnt)], check=True)
        self.mounted.remove(mnt)
        (self.work / mnt.name.replace(".mnt", ".img")).unlink()

    def close(self) -> None:
        for mnt in reversed(self.mounted):
            subprocess.run(["umount", str(mnt)], check=False)


def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="hotcache-scale-", dir=args.workdir))
    os.environ["HOTCACHE_STATE"] = str(work / "state" / "mappings.yaml")
    # an XFS image: a 4 KiB block and an inode a file, with room to spare
    fs = Filesystems(work, args.xfs, args.files * (args.size + 8192) * 3 // 2 + (1 << 30))
    try:
        src = fs.folder("src")
        t0 = time.perf_counter()
        make_dataset(src, args.files, args.size)
        subprocess.run(["sync"], check=True)   # the first copy's sync must not write it
        print(f"{args.files} files of {args.size} B in {FOLDERS} folders, built in "
              f"{time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} CPUs")
        times: dict[str, list[float]] = {"cp+sync": [], "hotcache": []}
        rss = 0
        order = ("cp+sync", "hotcache", "hotcache", "cp+sync")[:2 * args.rounds]
        dsts = []
        for n, name in enumerate(order):
            dst = fs.folder(f"dst{n}")
            dsts.append(dst)
            if args.cold:
                drop_caches()
            seconds, peak = (cp_sync if name == "cp+sync" else hotcache_copy)(src, dst)
            times[name].append(seconds)
            rss = max(rss, peak)
            print(f"  {name:9} {seconds:7.1f} s" + (f"  peak RSS {peak / 2**20:.0f} MiB"
                                                    if peak else ""))
        # Every copy stays until all are timed: on ext4, creating files soon after many
        # were deleted is several times slower (the inode allocator skips inodes deleted
        # in the last minute: perf shows recently_deleted() at the top), so a copy timed
        # right after the previous one was removed would pay for that removal.
        keep = dsts[max(n for n, name in enumerate(order) if name == "hotcache")]
        for dst in dsts:
            if dst != keep:
                fs.remove(dst)
        verify_s, verify_rss = (None, 0) if args.no_verify else \
            measured([*HOTCACHE, "verify", "--full", keep])
        batch_s = None if args.no_loader else first_batch(keep)
        cp_best, hc_best = min(times["cp+sync"]), min(times["hotcache"])
        print(f"files={args.files} {'xfs' if args.xfs else 'workdir'} "
              f"{'cold' if args.cold else 'warm'} cp+sync={cp_best:.1f}s "
              f"hotcache={hc_best:.1f}s ratio={hc_best / cp_best:.2f}x "
              f"copy_peak_rss={rss / 2**20:.0f}MiB "
              + (f"verify_full={verify_s:.1f}s verify_peak_rss={verify_rss / 2**20:.0f}MiB "
                 if verify_s is not None else "")
              + (f"first_batch={batch_s:.2f}s " if batch_s is not None else "")
              + f"load={os.getloadavg()[0]:.1f} "
              f"self_peak_rss={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}MiB")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            fs.close()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark (b): the same loader settings on a cold DATA_ROOT and on a hot copy, AU and
wait percentiles side by side, measured in one run (root: loop device, mount, and
/proc/sys/vm/drop_caches before every run so neither side is served from RAM).

cold = the source folder on this host's disk; hot = a hot copy (files, SHA256SUMS,
metadata) on XFS on a loop device. On this machine both end on the same virtual disk,
so this shows the method and the provenance line more than an SSD's advantage; on a
host with bcache/dm-cache in front of an HDD the same command compares the real tiers.

    sudo .venv/bin/python bench/bench_adapters_coldhot.py [--images 512] [--step-ms 20]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from bench_adapters_data import make_dataset_on_disk

from hotcache.adapters.compare import run_root, table
from hotcache.provision.system.runner import Runner
from tests.unit.adapters.helpers import write_hot_copy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run = Runner()
    with tempfile.TemporaryDirectory(prefix="bench-coldhot-", dir="/var/tmp") as tmp:
        tmp = Path(tmp)
        src = make_dataset_on_disk(tmp / "hdd" / "toy", args.images)
        image, mnt = tmp / "ssd.img", tmp / "ssd"
        run.run(["truncate", "-s", "512M", image])
        loop = run.run(["losetup", "--find", "--show", image]).stdout.strip()
        try:
            run.run(["mkfs.xfs", "-q", loop])
            mnt.mkdir()
            run.run(["mount", "-o", "noatime", loop, mnt])
            try:
                hot = write_hot_copy(src, mnt / "toy", name="toy", version="1")
                settings = dict(batch_size=args.batch_size, image_size=args.image_size,
                                workers=args.workers, step_s=args.step_ms / 1e3, drop_caches=True)
                for loader in ("torch", "tf"):
                    runs = [run_root(label, root, loader=loader, **settings)
                            for label, root in (("cold", src), ("hot", hot))]
                    print(f"\n== {loader}: {args.images} JPEGs, batch {args.batch_size}, "
                          f"step {args.step_ms} ms, page cache dropped before each run")
                    print(table(runs))
            finally:
                run.run(["umount", mnt])
        finally:
            run.run(["losetup", "--detach", loop])


if __name__ == "__main__":
    main()

"""One epoch of a training job, written the way hotcache expects one.

    DATA_ROOT=/mnt/hotcache-demo/images python examples/train.py --step-ms 40

The data folder comes from DATA_ROOT through `data_root()`, which logs one line saying
whether it is a verified hot copy (`hot=yes`) and what device and cache it is on. Every
batch fetch is timed, and the epoch ends with the timer's verdict (input-bound or not).
A sleep per batch stands in for the GPU's step, as MLPerf Storage does. Without torch
(the `hotcache[torch]` extra), a plain Python loop reads the same files in batches.
"""

from __future__ import annotations

import argparse
import logging
import os
import time


def plain_batches(root, batch_size: int):
    """Without torch: read the files of the class folders in batches, one after another."""
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names
                   if not f.startswith(".") and d != str(root))
    for i in range(0, len(files), batch_size):
        batch = []
        for path in files[i:i + batch_size]:
            with open(path, "rb") as f:
                batch.append(f.read())
        yield batch, [0] * len(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=40.0, help="simulated GPU step per batch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=96, help="resize to N×N pixels")
    parser.add_argument("--workers", type=int, default=None, help="loader workers [CPUs]")
    parser.add_argument("--name", default="train", help="the timer's name in its log lines")
    parser.add_argument("--log-every", type=int, default=8,
                        help="a timing line every N batches (0: only at the epoch's end)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="  %(message)s")

    from hotcache.adapters import data_root, timed

    root = data_root()                 # DATA_ROOT; logs path, hot=yes|no, device, cache
    try:
        from hotcache.adapters import make_loader

        loader = make_loader(root, batch_size=args.batch_size, num_workers=args.workers,
                             image_size=(args.image_size, args.image_size),
                             log_every=args.log_every, name=args.name)
    except ImportError:
        logging.info("torch is not installed: reading the files with a plain Python loop")
        loader = timed(plain_batches(root, args.batch_size), name=args.name,
                       log_every=args.log_every)
    for images, labels in loader:       # the timer logs its summary when the epoch ends
        time.sleep(args.step_ms / 1e3)


if __name__ == "__main__":
    main()

"""Benchmark (a): accelerator utilisation (AU) of make_loader and make_dataset against a
serial baseline, on the same JPEGs, measured in one run.

AU = time in simulated steps / wall time (MLPerf Storage's DLIO stands in for the
accelerator with a sleep per batch). The step is set, in this run, to the serial
baseline's own time to read and decode one batch: decoding then fits inside the step
for a parallel pipeline on 2 cores, and the serial loop can reach only about 50 %.
Each loader runs 2 epochs; the figures are the second (steady) epoch's, the first
epoch (worker start-up) is printed too. Also: raw samples/s with no step.

    .venv/bin/python bench/bench_adapters_au.py [--images 768] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from time import perf_counter

from bench_adapters_data import cpus, make_dataset_on_disk, serial_batches

from hotcache.adapters.compare import simulate


def epochs(make, *, step_s: float, n: int = 2) -> list[dict]:
    """Run `n` epochs over the same loader object; one record per epoch."""
    loader = make()
    out = []
    for _ in range(n):
        t0 = perf_counter()
        batches, samples, wall, summary = simulate(loader() if callable(loader) else loader,
                                                   step_s=step_s)
        wall = perf_counter() - t0
        out.append({"batches": batches, "samples": samples, "wall_s": round(wall, 3),
                    "au": round(batches * step_s / wall, 3) if step_s else None,
                    "samples_per_s": round(samples / wall, 1),
                    "wait_share": summary.wait_share, "first_batch_s": summary.first_batch_s})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=768)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from hotcache.adapters.pytorch import make_loader
    from hotcache.adapters.tfdata import make_dataset

    bs, size = args.batch_size, args.image_size
    with tempfile.TemporaryDirectory(prefix="bench-au-") as tmp:
        root = make_dataset_on_disk(Path(tmp) / "jpegs", args.images)
        serial = lambda: lambda: serial_batches(root, bs, size)  # noqa: E731
        torch_loader = lambda: make_loader(root, batch_size=bs, image_size=(size, size),  # noqa: E731
                                           num_workers=args.workers, log_every=0)
        tf_dataset = lambda: make_dataset(root, batch_size=bs, image_size=(size, size))  # noqa: E731
        for name, make in (("serial", serial), ("make_loader", torch_loader), ("make_dataset", tf_dataset)):
            epochs(make, step_s=0.0, n=1)                      # warm the page cache, load code
        raw = {name: epochs(make, step_s=0.0) for name, make in
               (("serial", serial), ("make_loader", torch_loader), ("make_dataset", tf_dataset))}
        # The step: the serial baseline's own read+decode time per batch.
        step = raw["serial"][-1]["wall_s"] / raw["serial"][-1]["batches"]
        au = {name: epochs(make, step_s=step) for name, make in
              (("serial", serial), ("make_loader", torch_loader), ("make_dataset", tf_dataset))}
    base = raw["serial"][-1]["samples_per_s"]
    print(f"cores={cpus()} images={args.images} batch={bs} size={size} step={step * 1e3:.1f} ms "
          f"(= serial read+decode per batch)")
    print(f"{'loader':<14}{'AU epoch2':>10}{'AU epoch1':>10}{'wait%':>8}{'samples/s':>11}{'vs serial':>11}")
    for name in au:
        a2, a1 = au[name][-1], au[name][0]
        r = raw[name][-1]["samples_per_s"]
        print(f"{name:<14}{a2['au']:>10.1%}{a1['au']:>10.1%}{(a2['wait_share'] or 0):>8.1%}"
              f"{r:>11.0f}{r / base:>10.2f}x")
    print(json.dumps({"step_s": step, "au": au, "raw": raw}))


if __name__ == "__main__":
    main()

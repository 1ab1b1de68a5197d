"""Benchmark (a): accelerator utilisation (AU) of make_loader and make_dataset against a
serial baseline, on the same JPEGs, measured in one run.

AU = time in simulated steps / wall time (MLPerf Storage's DLIO stands in for the
accelerator with a sleep per batch). The step is set, in this run, to the serial
baseline's own time to read and decode one batch (the median of its rounds): decoding
then fits inside the step for a parallel pipeline on 2 cores, and the serial loop can
reach only about 50 %. The loaders take turns, one epoch each per round, so that load
from other work on the machine falls on all of them alike; the figures are medians over
the rounds (min-max beside them). Also raw samples/s with no step.

    .venv/bin/python bench/bench_adapters_au.py [--images 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path

from bench_adapters_data import cpus, make_dataset_on_disk, serial_batches

from hotcache.adapters.compare import simulate


def epoch(loader, step_s: float) -> dict:
    batches, samples, wall, stepping, summary = simulate(
        loader() if callable(loader) else loader, step_s=step_s)
    return {"batches": batches, "wall_s": wall, "samples_per_s": samples / wall,
            "au": stepping / wall if step_s else None, "wait_share": summary.wait_share,
            "first_batch_s": summary.first_batch_s}


def rounds(loaders: dict, step_s: float, n: int) -> dict:
    out = {name: [] for name in loaders}
    for _ in range(n):
        for name, loader in loaders.items():
            out[name].append(epoch(loader, step_s))
    return out


def spread(runs: list[dict], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in runs]
    return statistics.median(values), min(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from hotcache.adapters import make_dataset, make_loader

    bs, size = args.batch_size, (args.image_size, args.image_size)
    with tempfile.TemporaryDirectory(prefix="bench-au-") as tmp:
        root = make_dataset_on_disk(Path(tmp) / "jpegs", args.images)
        loaders = {
            "serial": lambda: serial_batches(root, bs, args.image_size),
            "make_loader": make_loader(root, batch_size=bs, image_size=size,
                                       num_workers=args.workers, log_every=0),
            "make_dataset": make_dataset(root, batch_size=bs, image_size=size),
        }
        rounds(loaders, 0.0, 1)                      # warm up: page cache, workers, tracing
        raw = rounds(loaders, 0.0, args.rounds)
        serial = raw["serial"]
        step = statistics.median(r["wall_s"] / r["batches"] for r in serial)
        au = rounds(loaders, step, args.rounds)
    base = spread(raw["serial"], "samples_per_s")[0]
    print(f"cores={cpus()} images={args.images} batch={bs} size={args.image_size} "
          f"rounds={args.rounds} step={step * 1e3:.1f} ms (= serial read+decode per batch)")
    print(f"{'loader':<14}{'AU median (min-max)':>24}{'samples/s no step':>26}{'vs serial':>11}")
    for name in loaders:
        a, a_lo, a_hi = spread(au[name], "au")
        r, r_lo, r_hi = spread(raw[name], "samples_per_s")
        print(f"{name:<14}{a:>10.1%} ({a_lo:.0%}-{a_hi:.0%}){'':>3}"
              f"{r:>11.0f} ({r_lo:.0f}-{r_hi:.0f}){'':>3}{r / base:>9.2f}x")
    print(json.dumps({"step_s": step, "au": au, "raw": raw}))


if __name__ == "__main__":
    main()

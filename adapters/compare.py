"""Run the same loader settings on two data roots (cold source, hot copy) and print both
timing summaries side by side.

    python -m hotcache.adapters.compare --cold /mnt/hdd/imagenet --hot /mnt/ssd/imagenet \\
        --loader torch --batch-size 64 --image-size 224 --step-ms 50 --batches 200

A step is simulated with a sleep per batch, as MLPerf Storage's DLIO stands in for the
accelerator; accelerator utilisation (AU) = time in steps / wall time. With
--drop-caches (root) the page cache is dropped before each run, so "cold" is not
secretly served from RAM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from collections.abc import Iterable
from pathlib import Path
from time import perf_counter, sleep
from typing import Any

from hotcache.provision.errors import ExitCode, HotcacheError

from .dataroot import describe
from .errors import DataRootError
from .timing import BatchTimer, Summary

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


@dataclass(frozen=True)
class Run:
    label: str
    root: str
    hot: bool
    cache: str
    device: str | None
    fs: str | None
    batches: int
    samples: int
    wall_s: float
    step_s: float
    au: float | None              # accelerator utilisation, None without a simulated step
    samples_per_s: float
    timing: Summary

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "timing": self.timing.to_dict()}


def drop_page_cache() -> None:
    """Write back dirty pages, then drop clean ones (root only): the next read hits the disk."""
    os.sync()
    DROP_CACHES.write_text("3\n")


def simulate(batches: Iterable[Any], *, step_s: float = 0.0, limit: int | None = None,
             label: str = "run") -> tuple[int, int, float, float, Summary]:
    """Iterate `batches` (each `(samples, labels, ...)`), sleeping `step_s` per batch;
    returns (batches, samples, wall seconds, seconds spent in steps, timing summary).
    AU = seconds in steps / wall seconds."""
    timer = batches if isinstance(batches, BatchTimer) else BatchTimer(batches, log_every=0)
    timer.name = label
    n = samples = 0
    stepping = 0.0
    t0 = perf_counter()
    for batch in timer:
        samples += len(batch[1])
        if step_s:
            t = perf_counter()
            sleep(step_s)
            stepping += perf_counter() - t      # a sleep that overruns still counts as work
        n += 1
        if limit and n >= limit:
            break
    wall = perf_counter() - t0
    summary = timer.summaries[-1] if timer.summaries else timer.summary()
    return n, samples, wall, stepping, summary


def build(loader: str, root: Path, *, batch_size: int, image_size: int, workers: int | None,
          seed: int = 0) -> Iterable[Any]:
    """The adapter's loader over `root`, with the same settings whichever root it is."""
    size = (image_size, image_size)
    # only the framework asked for: importing torch or TensorFlow takes seconds
    if loader == "torch":
        from .pytorch import make_loader

        return make_loader(root, batch_size=batch_size, image_size=size, num_workers=workers,
                           seed=seed, log_every=0)
    from .tfdata import make_dataset    # TensorFlow, only where asked for

    dataset: Iterable[Any] = make_dataset(root, batch_size=batch_size, image_size=size,
                                          seed=seed)    # a tf.data.Dataset: Any to mypy
    return dataset


def run_root(label: str, root: str | Path, *, loader: str = "torch", batch_size: int = 32,
             image_size: int = 64, workers: int | None = None, step_s: float = 0.0,
             limit: int | None = None, drop_caches: bool = False) -> Run:
    info = describe(root, label)
    if not info.path.is_dir():
        raise DataRootError(f"--{label} {root}: no such directory",
                            hint="give the dataset folder (class folders or TFRecord files)")
    batches = build(loader, info.path, batch_size=batch_size, image_size=image_size, workers=workers)
    if drop_caches:
        drop_page_cache()
    n, samples, wall, stepping, summary = simulate(batches, step_s=step_s, limit=limit, label=label)
    return Run(label, str(info.path), info.copy.is_hot, info.backing.cache,
               info.backing.device, info.backing.fstype, n, samples, wall, step_s,
               (stepping / wall) if step_s and wall else None,
               samples / wall if wall else 0.0, summary)


def table(runs: list[Run]) -> str:
    def ms(s: float | None) -> str:
        return "n/a" if s is None else f"{s * 1e3:.2f} ms"

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

    rows = [("", *(r.label for r in runs)),
            ("root", *(r.root for r in runs)),
            ("hot copy", *("yes" if r.hot else "no" for r in runs)),
            ("device / fs / cache", *(f"{r.device} / {r.fs} / {r.cache}" for r in runs)),
            ("batches / samples", *(f"{r.batches} / {r.samples}" for r in runs)),
            ("wall", *(f"{r.wall_s:.2f} s" for r in runs)),
            ("samples/s", *(f"{r.samples_per_s:.0f}" for r in runs)),
            ("AU (step time / wall)", *(pct(r.au) for r in runs)),
            ("first batch", *(ms(r.timing.first_batch_s) for r in runs)),
            ("wait p50", *(ms(r.timing.p50_wait_s) for r in runs)),
            ("wait p95", *(ms(r.timing.p95_wait_s) for r in runs)),
            ("wait p99", *(ms(r.timing.p99_wait_s) for r in runs)),
            ("wait max", *(ms(r.timing.max_wait_s) for r in runs)),
            ("waiting share", *(pct(r.timing.wait_share) for r in runs)),
            ("verdict", *(r.timing.verdict for r in runs))]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotcache.adapters.compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", required=True, help="the source folder (e.g. on the HDD)")
    parser.add_argument("--hot", required=True, help="the hot copy (on the SSD cache)")
    parser.add_argument("--loader", choices=("torch", "tf"), default="torch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64, help="resize to N×N pixels")
    parser.add_argument("--workers", type=int, default=None, help="PyTorch workers (default: CPUs)")
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated step per batch")
    parser.add_argument("--batches", type=int, default=None, help="stop after N batches")
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the page cache before each run (needs root)")
    parser.add_argument("--json", action="store_true", help="print both runs as JSON")
    args = parser.parse_args(argv)
    try:
        runs = [run_root(label, root, loader=args.loader, batch_size=args.batch_size,
                         image_size=args.image_size, workers=args.workers,
                         step_s=args.step_ms / 1e3, limit=args.batches,
                         drop_caches=args.drop_caches)
                for label, root in (("cold", args.cold), ("hot", args.hot))]
    except HotcacheError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except PermissionError as err:
        print(f"error: {err} (--drop-caches needs root)", file=sys.stderr)
        return ExitCode.NOT_ROOT
    print(json.dumps([r.to_dict() for r in runs], indent=2) if args.json else table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

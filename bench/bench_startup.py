"""Start-up time of the CLI: `hotcache --help` and `hotcache status --json` against the
baseline `python -c pass`, all measured in this run (median of N runs each).

    .venv/bin/python bench/bench_startup.py [--runs 20]

Goal: each hotcache command under 0.3 s wall (heavy imports kept out of start-up).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def median_wall(argv: list[str], runs: int, env: dict) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HOTCACHE_STATE": f"{tmp}/m.yaml", "HOTCACHE_FSTAB": f"{tmp}/fstab"}
        py = sys.executable
        base = median_wall([py, "-c", "pass"], args.runs, env)
        cases = {
            "hotcache --help": [py, "-m", "hotcache.provision", "--help"],
            "hotcache status --json": [py, "-m", "hotcache.provision", "status", "--json"],
        }
        print(f"baseline `python -c pass`: {base * 1000:.0f} ms (median of {args.runs})")
        worst = 0.0
        for name, argv in cases.items():
            t = median_wall(argv, args.runs, env)
            worst = max(worst, t)
            print(f"{name:<24} {t * 1000:6.0f} ms  = {t / base:4.1f}x the baseline, "
                  f"{(t - base) * 1000:.0f} ms of hotcache's own start-up")
        print(f"goal < 300 ms: {'met' if worst < 0.3 else 'NOT met'} (slowest {worst * 1000:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

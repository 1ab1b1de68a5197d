"""Time per task of the Slurm TaskProlog: `hotcache slurm task-prolog` for a job naming
its dataset, against a real verified hot copy and index, beside the baseline `python -c
pass` and a full command-line start (`hotcache copies --json`), all measured in this run
(median of N runs each).

    .venv/bin/python bench/bench_prolog.py [--runs 20]

Goal: under 100 ms a task (Slurm runs it before every task of every job).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hotcache.provision.observe import verified_index
from hotcache.provision.system import mountinfo


def median_wall(argv: list, runs: int, env: dict) -> tuple[float, str]:
    samples, out = [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        samples.append(time.perf_counter() - t0)
        out = proc.stdout
    return statistics.median(samples), out


def index_copy(state: Path, dest: Path) -> None:
    """The index as root writes it for the copy at `dest` (one entry)."""
    st = os.lstat(dest)
    meta = json.loads((dest / ".hotcache-copy.json").read_text())
    mount = mountinfo.holding(mountinfo.read(), str(dest))
    entry = {"name": "ds", "version": "1", "path": str(dest), "cache": "hot",
             "mountpoint": mount.mountpoint if mount else "/",
             "mount_dev": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", "dev": st.st_dev,
             "inode": st.st_ino, "uid": st.st_uid, "verified_at": meta["verified_at"],
             "partial": False, "source": None}
    verified_index.path_for(state).write_text(json.dumps(
        {"kind": verified_index.KIND, "format": verified_index.FORMAT, "copies": [entry]}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    hotcache = shutil.which("hotcache", path=str(Path(sys.executable).parent)) or "hotcache"
    with tempfile.TemporaryDirectory() as tmp:
        src, dest = Path(tmp) / "src", Path(tmp) / "ds"
        (src / "cat").mkdir(parents=True)
        for i in range(100):
            (src / "cat" / f"{i:03}.jpg").write_bytes(os.urandom(4096))
        env = {**os.environ, "HOTCACHE_STATE": f"{tmp}/mappings.yaml",
               "HOTCACHE_FSTAB": f"{tmp}/fstab", "HOTCACHE_METRICS_DIR": ""}
        subprocess.run([hotcache, "copy", src, dest, "--name", "ds", "--version", "1",
                        "--verify"], env=env, check=True, capture_output=True)
        index_copy(Path(tmp) / "mappings.yaml", dest)
        base, _ = median_wall([sys.executable, "-c", "pass"], args.runs, env)
        cli, _ = median_wall([hotcache, "copies", "--json"], args.runs, env)
        prolog, out = median_wall([hotcache, "slurm", "task-prolog"], args.runs,
                                  {**env, "HOTCACHE_DATASET": "ds"})
        assert out.startswith(f"export DATA_ROOT={dest}\n"), out
        print(f"baseline `python -c pass`:     {base * 1000:5.0f} ms (median of {args.runs})")
        print(f"`hotcache copies --json`:      {cli * 1000:5.0f} ms = {cli / base:4.1f}x the baseline")
        print(f"`hotcache slurm task-prolog`:  {prolog * 1000:5.0f} ms = {prolog / base:4.1f}x "
              f"the baseline, {prolog / cli:.2f}x a full command-line start")
        print(f"goal < 100 ms: {'met' if prolog < 0.1 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

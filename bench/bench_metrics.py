"""What the metrics timer costs each interval: `hotcache status --prometheus FILE`
against the baseline `hotcache status --json` (same host, same run), on a real
loop-backed XFS cache holding N hot copies (the textfile also scans for them).

    sudo .venv/bin/python bench/bench_metrics.py [--runs 10] [--copies 50]

Goal: the refresh costs at most 1.5x a plain `status` (it runs every minute on
every host; it must stay in the noise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_startup import median_wall   # beside this file
from hotcache.provision.hotcopy import format as hotcopy_format

HOTCACHE = str(Path(sys.executable).with_name("hotcache"))


def make_copies(root: Path, n: int) -> None:
    for i in range(n):
        dest = root / f"set{i:03d}"
        dest.mkdir()
        for j in range(20):
            (dest / f"part-{j}.bin").write_bytes(b"x")
        (dest / hotcopy_format.MANIFEST).write_text("")
        (dest / hotcopy_format.METADATA).write_text(json.dumps({
            "format": hotcopy_format.FORMAT, "complete": True, "name": f"set{i}", "files": 20, "bytes": 20,
            "verified_at": "2027-01-01T00:00:00+00:00", "verify_ok": True}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--copies", type=int, default=50)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_metrics needs root (it builds a loop-backed cache)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, "HOTCACHE_STATE": f"{tmp}/m.yaml", "HOTCACHE_FSTAB": f"{tmp}/fstab"}
        spec = root / "spec.yaml"
        spec.write_text(f"version: 1\ncaches:\n  - name: benchm{os.getpid() % 10000}\n"
                        f"    backend: none\n    origin: {{loop: {{file: {tmp}/ssd.img, size: 320M}}}}\n"
                        f"    filesystem: {{mountpoint: {tmp}/mnt}}\n")
        subprocess.run([HOTCACHE, "apply", str(spec), "--yes", "--json"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        name = f"benchm{os.getpid() % 10000}"
        try:
            make_copies(root / "mnt", args.copies)
            base = median_wall([HOTCACHE, "status", "--json"], args.runs, env)
            prom = median_wall([HOTCACHE, "status", "--prometheus", f"{tmp}/out.prom"],
                               args.runs, env)
        finally:
            subprocess.run([HOTCACHE, "teardown", name, "--yes", "--json"], env=env,
                           stdout=subprocess.DEVNULL, check=False)
    print(f"baseline `hotcache status --json`:            {base * 1000:7.1f} ms (median of {args.runs})")
    print(f"`hotcache status --prometheus` ({args.copies} hot copies): {prom * 1000:7.1f} ms")
    print(f"ratio prometheus / baseline: {prom / base:.2f}x (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

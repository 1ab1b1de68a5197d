"""The host side of a VM benchmark: fresh sparse images, one boot through the guest-kernel
tier's boot helper (tests/vm/vmboot.py) against a throttled origin, and the entry point
that runs the host or the guest side. Standard library only."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.vm import vmboot  # noqa: E402

REPO, VENV = vmboot.REPO, vmboot.VENV
# An HDD-like origin: no host page cache, 150 IOPS and 150 MiB/s.
THROTTLE = "cache=none,throttling.iops-total=150,throttling.bps-total=157286400"


def run_benchmark(script: str, guest_args: str, ssd_mib: int, hdd_mib: int, *,
                  prefix: str, timeout: int) -> int:
    """The host side of a VM benchmark: fresh sparse images, one boot that runs
    `bench/SCRIPT --guest OUT GUEST_ARGS` against a throttled origin, its log printed;
    0 when the guest wrote OUT/results.json."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    for name, mib in (("ssd", ssd_mib), ("hdd", hdd_mib)):
        with open(work / f"{name}.img", "wb") as f:
            f.truncate(mib * 2**20)
    out = work / "out"
    out.mkdir()
    command = (f"cd {REPO} && PYTHONDONTWRITEBYTECODE=1 {VENV}/bin/python "
               f"bench/{script} --guest {out} {guest_args} > {out}/guest.log 2>&1")
    load0 = os.getloadavg()
    t0 = time.monotonic()
    # two vCPUs, as when BENCHMARKS.md's figures were measured
    proc = vmboot.boot(command, out, vmboot.drives(work, hdd=THROTTLE), timeout, cpus=2)
    log = out / "guest.log"
    sys.stdout.write(log.read_text() if log.exists() else proc.stdout[-5000:])
    # Under emulation the guest's speed follows the host's load: quote it with the figures.
    load = lambda la: "/".join(f"{v:.2f}" for v in la)  # noqa: E731
    print(f"(boot and benchmark: {time.monotonic() - t0:.0f} s wall; host load average "
          f"(1/5/15 min) {load(load0)} before, {load(os.getloadavg())} after, on "
          f"{os.cpu_count()} CPUs; files in {work})")
    for image in ("ssd.img", "hdd.img"):
        (work / image).unlink()
    return 0 if (out / "results.json").exists() else 1


def main(doc: str, arguments, host, guest) -> int:
    """A VM benchmark's entry point: its options (`arguments(parser)`), then the host side,
    or with --guest (set by the host side) the guest side."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    arguments(ap)
    ap.add_argument("--guest", help=argparse.SUPPRESS)  # set when running inside the guest
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (it boots a QEMU guest and builds caches in it)")
    return guest(args) if args.guest else host(args)

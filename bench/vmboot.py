"""One boot of this host's kernel under QEMU (TCG) through virtme-ng, with two raw disk
images (`ssd.img`, `hdd.img`) as virtio disks whose serials are `ssd` and `hdd`. The
guest-kernel tests (tests/vm, `import bench.vmboot`) and the VM benchmarks (`import
vmboot` beside them) boot the same way. Standard library only."""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"
# An HDD-like origin: no host page cache, 150 IOPS and 150 MiB/s (benchmarks only).
THROTTLE = "cache=none,throttling.iops-total=150,throttling.bps-total=157286400"


# Guests booting now (boots may run in threads, side by side).
RUNNING: set[subprocess.Popen] = set()


def kernel() -> str | None:
    """The newest /boot/vmlinuz-*-amd64 (Debian's linux-image-amd64), or None."""
    found = sorted(glob.glob("/boot/vmlinuz-*-amd64"))
    return found[-1] if found else None


def drives(workdir: Path, hdd: str = "cache=unsafe") -> str:
    """QEMU options for workdir/ssd.img and workdir/hdd.img (`hdd`: the origin's cache
    and throttling options)."""
    opts = {"ssd": "cache=unsafe", "hdd": hdd}
    return " ".join(f"-drive if=none,id={d},file={workdir / (d + '.img')},format=raw,{o} "
                    f"-device virtio-blk-pci,drive={d},serial={d}" for d, o in opts.items())


def boot(command: str, rwdir: Path, qemu_drives: str, timeout: int) -> subprocess.CompletedProcess:
    """Boot, run `command` (a shell line) in the guest with `rwdir` writable, power off.
    stdout is the console (QEMU reopens stdout with truncation: a pipe, never a file)."""
    argv = ["timeout", "--kill-after=30", str(timeout), str(VENV / "bin" / "vng"),
            "--disable-kvm", "--run", str(kernel()), "--cpus", "2", "--memory", "1G",
            "--rwdir", str(rwdir), f"--qemu-opts={qemu_drives}",  # one word: starts with -
            "--exec", command]
    env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}"}
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace",
                          env=env) as proc:
        RUNNING.add(proc)
        try:
            console, _ = proc.communicate()
        finally:
            RUNNING.discard(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, console)


def stop_all() -> None:
    """Power off every guest still booting (`timeout` passes SIGTERM on to QEMU): a test
    session that ends early does not leave them running."""
    for proc in list(RUNNING):
        proc.terminate()


def run_benchmark(script: str, guest_args: str, ssd_mib: int, hdd_mib: int, *,
                  prefix: str, timeout: int) -> int:
    """The host side of a VM benchmark: fresh sparse images, one boot that runs
    `bench/SCRIPT --guest OUT GUEST_ARGS` against a throttled origin, its log printed;
    0 when the guest wrote OUT/results.json."""
    import sys
    import tempfile
    import time

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
    proc = boot(command, out, drives(work, hdd=THROTTLE), timeout)
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
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    arguments(ap)
    ap.add_argument("--guest", help=argparse.SUPPRESS)  # set when running inside the guest
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (it boots a QEMU guest and builds caches in it)")
    return guest(args) if args.guest else host(args)

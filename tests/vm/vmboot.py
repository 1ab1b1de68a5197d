"""One boot of this host's kernel under QEMU (TCG) through virtme-ng, with raw disk
images as virtio disks whose serials are their names (`ssd`, `hdd`). The guest-kernel
tier boots with it, and the VM benchmarks (bench/vmbench.py) boot the same way.
Standard library only."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV = REPO / ".venv"
# QEMU 7.2's C virtiofsd, which bin/virtiofsd adapts to virtme-ng's options.
QEMU_VIRTIOFSD = Path("/usr/lib/qemu/virtiofsd")


# Guests booting now (boots may run in threads, side by side); once stopped, no new one.
RUNNING: set[subprocess.Popen] = set()
STOPPED = False


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


_COMPILED = threading.Lock()
_compiled = False


def precompile() -> None:
    """Byte-compile the repository's Python, and pytest's rewrite of the guest's test
    modules, here on the host, once per session. The guest sees the checkout read-only:
    a module without its .pyc there is compiled again by every guest Python that
    imports it, under emulation, where that costs about twenty times what it does here."""
    global _compiled
    with _COMPILED:
        if _compiled:
            return
        _compiled = True
        python = str(VENV / "bin" / "python")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        for argv in ([python, "-m", "compileall", "-q", "provision", "adapters", "tests"],
                     [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                      *sorted(str(p.relative_to(REPO)) for p in HERE.glob("guest/guest_*.py"))]):
            subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def virtiofsd_shim() -> list[str]:
    """[tests/vm/bin] when virtme-ng would otherwise fall back to 9p: no virtiofsd of
    its own kind is installed, and QEMU's C daemon is. The root shared through
    virtiofs with cache=always answers a stat from the guest's cache; through 9p each
    is a round trip, which made a guest's boot and Python imports about twice as slow
    under TCG."""
    if shutil.which("virtiofsd") or Path("/usr/libexec/virtiofsd").exists():
        return []
    try:
        usage = subprocess.run([str(QEMU_VIRTIOFSD), "--help"], capture_output=True,
                               text=True, check=False).stdout
    except OSError:
        return []
    return [str(HERE / "bin")] if "-o source=" in usage else []


def boot(command: str, rwdir: Path, qemu_drives: str, timeout: int,
         cpus: int = 1) -> subprocess.CompletedProcess:
    """Boot, run `command` (a shell line) in the guest with `rwdir` writable, power off.
    stdout is the console (QEMU reopens stdout with truncation: a pipe, never a file).
    One vCPU by default: under TCG a second one turns every TLB flush and interrupt
    between the guest's CPUs into a rendezvous of host threads, and the guest tier did
    the same work in about two thirds of the time and CPU with one (docs/testing.md)."""
    argv = ["timeout", "--kill-after=30", str(timeout), str(VENV / "bin" / "vng"),
            "--disable-kvm", "--run", str(kernel()), "--cpus", str(cpus), "--memory", "1G",
            "--rwdir", str(rwdir), f"--qemu-opts={qemu_drives}",  # one word: starts with -
            "--exec", command]
    if STOPPED:
        return subprocess.CompletedProcess(argv, 1, "not booted: the session is stopping\n")
    precompile()
    path = [*virtiofsd_shim(), str(VENV / "bin"), os.environ.get("PATH", "")]
    env = {**os.environ, "PATH": ":".join(path)}
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
    session that ends early does not leave them running, nor boots the next one."""
    global STOPPED
    STOPPED = True
    for proc in list(RUNNING):
        proc.terminate()

"""The README's first command (`bash examples/demo.sh` runs this after installing).

It shows the whole product on two loop-backed images, as root, in about a minute:

1. a slow origin (its reads throttled like one hard disk's, with a cgroup I/O limit on
   its loop device) and a fast tier: the best block cache this kernel runs in front of
   the origin, and a plain XFS fast tier (backend none) for the hot copy;
2. a small JPEG dataset in class folders on the slow origin;
3. a cold baseline: one epoch of examples/train.py (make_loader, batch timing) there;
4. `hotcache copy --verify` onto the fast tier, checked again with `sha256sum -c`;
5. the same epoch with DATA_ROOT at the hot copy (`hot=yes`);
6. cold against hot: batch wait p50/p95, waiting share, samples/s;
7. how to take it all down (`--cleanup` does it).

Running it again reuses what is there. HOTCACHE_STATE and HOTCACHE_FSTAB move the mapping
and fstab as for every hotcache command; --workdir and --mounts move the images and
mountpoints (the tests put all of them in a temporary folder).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOTCACHE = [sys.executable, "-m", "hotcache.provision"]
ORIGIN, FAST = "demo-hdd", "demo"      # the two caches the demo builds
CLASSES = 8
# One loader worker: each batch then waits for exactly the reads behind it (two workers
# deliver in pairs, one long wait and one none, and the median says nothing), and the
# demo leaves the second core to the host. 64×64 keeps decoding cheap.
TRAIN_OPTIONS = ["--workers", "1", "--batch-size", "32", "--image-size", "64"]


class DemoError(Exception):
    """A step failed; the message says what and what to do."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def say(text: str = "") -> None:
    print(text, flush=True)


def step(n: int, title: str) -> None:
    say(f"\n[{n}/7] {title}")


def hotcache(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    """Run a hotcache command as the user would type it; its output goes to ours."""
    if not capture:
        say(f"  $ hotcache {' '.join(args)}")
    proc = subprocess.run([*HOTCACHE, *args], text=True,
                          stdout=subprocess.PIPE if capture else None)
    if proc.returncode != 0:
        raise DemoError(f"`hotcache {' '.join(args)}` failed (exit {proc.returncode}); its "
                        "message is above", proc.returncode)
    return proc


# --- the slow origin: a cgroup I/O limit on its loop device -------------------------

def loop_device(image: Path) -> str:
    """The loop device (e.g. loop3) whose backing file is `image`."""
    for f in Path("/sys/class/block").glob("loop*/loop/backing_file"):
        if f.read_text().strip() == os.path.realpath(image):
            return f.parent.parent.name
    raise DemoError(f"{image} is not attached to a loop device; run the demo again")


class Throttle:
    """Limit this process's (and its children's) reads from one block device to `iops`
    operations and `bps` bytes a second: cgroup v2 `io.max` where the io controller is
    enabled, else cgroup v1's blkio throttle (this project's 2-core host has only v1)."""

    def __init__(self, name: str, iops: int, bps: int):
        self.name, self.iops, self.bps = name, iops, bps
        self.kind, self.root = self._find()
        self.path = self.root / name

    @staticmethod
    def _find() -> tuple[str, Path]:
        mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
        for _, mp, fstype, opts, *_ in mounts:
            if fstype == "cgroup2" and "io" in (Path(mp) / "cgroup.controllers").read_text().split():
                return "v2", Path(mp)
        for _, mp, fstype, opts, *_ in mounts:
            if fstype == "cgroup" and "blkio" in opts.split(","):
                return "v1", Path(mp)
        raise DemoError("this host has no cgroup I/O controller (neither cgroup v2 `io` nor "
                        "v1 `blkio`), so the demo cannot make its origin slow", 7)

    def limit(self, devnum: str) -> str:
        """Create the cgroup, set the limit on `devnum` (MAJ:MIN), join it; a description."""
        self.path.mkdir(exist_ok=True)
        if self.kind == "v2":
            (self.root / "cgroup.subtree_control").write_text("+io")
            (self.path / "io.max").write_text(f"{devnum} riops={self.iops} rbps={self.bps}")
            what = f"cgroup v2 io.max in {self.path}"
        else:
            (self.path / "blkio.throttle.read_iops_device").write_text(f"{devnum} {self.iops}")
            (self.path / "blkio.throttle.read_bps_device").write_text(f"{devnum} {self.bps}")
            what = f"cgroup v1 blkio throttle in {self.path} (this kernel has no cgroup v2 io)"
        (self.path / "cgroup.procs").write_text(str(os.getpid()))
        return what

    def release(self) -> None:
        """Leave the cgroup and remove it (children that still run keep it a while)."""
        if not self.path.exists():
            return
        if str(os.getpid()) in (self.path / "cgroup.procs").read_text().split():
            (self.root / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:            # EBUSY while exiting workers are still counted
                time.sleep(0.1)


def evict(root: Path) -> None:
    """Write back, then drop `root`'s files from the page cache: the next read hits the
    device (a dataset this small would otherwise be served from RAM)."""
    os.sync()
    for folder, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --- the story ----------------------------------------------------------------------

def block_cache() -> tuple[str | None, str]:
    """The best block cache backend this kernel runs, and why the others cannot."""
    out = hotcache("devices", "--backends", "--json", capture=True).stdout
    rows = {r["backend"]: r for r in json.loads(out)["backends"]}
    for name in ("bcache", "dm-cache"):
        if rows.get(name, {}).get("available"):
            return name, ""
    return None, "; ".join(f"{n}: {rows[n]['why']}" for n in ("bcache", "dm-cache") if n in rows)


def write_spec(path: Path, work: Path, mounts: Path, backend: str | None) -> None:
    cache = ""
    if backend:
        cache = (f"    cache: {{loop: {{file: {work}/hdd-cache.img, size: 512M}}}}\n"
                 + ("    tunables: {sequential_cutoff: 0}\n" if backend == "bcache" else ""))
    path.write_text(f"""\
# Written by examples/demo.py. Two caches on loop-backed images (sparse files):
# {ORIGIN}: the slow origin holding the dataset ({backend or 'no block cache'} in front of it),
# {FAST}: the fast tier, plain XFS, holding the hot copy. Mounted only, not in fstab.
version: 1
caches:
  - name: {ORIGIN}
    backend: {backend or 'none'}
    origin: {{loop: {{file: {work}/hdd.img, size: 1G}}}}
{cache}    filesystem: {{label: demo-hdd, mountpoint: {mounts}/hdd, persist: none}}
  - name: {FAST}
    backend: none
    origin: {{loop: {{file: {work}/ssd.img, size: 1G}}}}
    filesystem: {{label: demo-ssd, mountpoint: {mounts}/ssd, persist: none}}
""")


def make_dataset(root: Path, count: int) -> int:
    """`count` JPEGs (128×128) in CLASSES class folders; files already there are kept.
    Returns how many were written."""
    import numpy as np
    from PIL import Image

    written = 0
    for i in range(count):
        path = root / f"class{i % CLASSES}" / f"img{i:04d}.jpg"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(i)
        base = np.linspace(0, 255, 128, dtype=np.float32)
        img = (np.stack([np.add.outer(base, base) / 2] * 3, axis=-1) * (i % CLASSES + 1) / CLASSES
               + rng.normal(0, 40, (128, 128, 3)))
        tmp = path.with_suffix(".tmp")
        Image.fromarray(img.clip(0, 255).astype("uint8")).save(tmp, "JPEG", quality=90)
        tmp.rename(path)
        written += 1
    return written


def epoch(label: str, root: Path, work: Path, step_ms: float) -> dict:
    """One epoch of examples/train.py with DATA_ROOT=root; its final timing summary."""
    log = work / f"{label}.jsonl"
    log.unlink(missing_ok=True)
    evict(root)
    options = ["--step-ms", f"{step_ms:g}", *TRAIN_OPTIONS]
    say(f"  $ DATA_ROOT={root} python examples/train.py {' '.join(options)}")
    env = {**os.environ, "DATA_ROOT": str(root), "HOTCACHE_TIMING_LOG": str(log)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "train.py"), *options, "--name", label],
                          env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise DemoError(f"the {label} epoch failed (exit {proc.returncode}); see above")
    final = [json.loads(line) for line in log.read_text().splitlines()]
    return {**[r for r in final if r.get("final")][-1], "process_s": seconds}


def table(cold: dict, hot: dict, samples: int, step_ms: float) -> list[str]:
    def rate(r):
        return samples / ((r["first_batch_s"] or 0) + r["wall_s"])

    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    rows = [("", "cold (slow origin)", "hot (hot copy)"),
            ("batch wait p50", ms(cold["p50_wait_s"]), ms(hot["p50_wait_s"])),
            ("batch wait p95", ms(cold["p95_wait_s"]), ms(hot["p95_wait_s"])),
            ("waiting share", f"{cold['wait_share']:.0%}", f"{hot['wait_share']:.0%}"),
            ("samples/s", f"{rate(cold):.0f}", f"{rate(hot):.0f}"),
            ("verdict", cold["verdict"], hot["verdict"])]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(f"  samples/s: {rate(hot) / rate(cold):.1f}x with the hot copy "
                 f"({samples} samples an epoch, a {step_ms:g} ms step per batch)")
    return lines


def run(args) -> None:
    work, mounts = args.workdir, args.mounts
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "demo.yaml"
    say("hotcache demo: a slow origin, a fast tier, a hot copy, and the same training epoch "
        "before and after")

    step(1, "A slow origin and a fast tier, on loop images")
    backend, why = block_cache()
    if backend:
        say(f"  block cache: {backend} runs on this kernel, so {ORIGIN} gets {backend} in "
            "front of the slow image")
    else:
        say(f"  block cache: this kernel has neither bcache nor dm-cache ({why}); the slow "
            f"origin has no cache in front, and the fast tier {FAST} is plain XFS (backend none)")
    write_spec(spec, work, mounts, backend)
    say(f"  spec: {spec}")
    hotcache("apply", str(spec), "--yes")
    throttle = Throttle(args.cgroup, args.iops, args.mbps * 10**6)
    dev = loop_device(work / "hdd.img")
    devnum = (Path("/sys/class/block") / dev / "dev").read_text().strip()
    how = throttle.limit(devnum)
    say(f"  the slow origin: reads from /dev/{dev} ({devnum}, {work}/hdd.img) limited to "
        f"{args.iops} IOPS and {args.mbps} MB/s for the demo's processes, like one hard "
        f"disk's random reads: {how}")
    try:
        story(args, work, mounts)
    finally:
        throttle.release()


def story(args, work: Path, mounts: Path) -> None:
    src, dest = mounts / "hdd" / "images", mounts / "ssd" / "images"
    step(2, "A small image dataset on the slow origin")
    say(f"  writing {args.files} JPEGs (files already there are kept) ...")
    written = make_dataset(src, args.files)
    size = sum(p.stat().st_size for p in src.rglob("*.jpg"))
    say(f"  {src}: {args.files} JPEGs in {CLASSES} class folders, {size / 2**20:.1f} MiB "
        f"({written} written now, {args.files - written} already there)")

    step(3, "Cold baseline: one epoch read from the slow origin")
    cold = epoch("cold", src, work, args.step_ms)

    step(4, "The hot copy: copied, read back and checked, then published")
    evict(src)
    hotcache("copy", str(src), str(dest), "--name", "demo-images", "--verify")
    sums = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=dest, capture_output=True,
                          text=True)
    ok = sum(line.endswith(": OK") for line in sums.stdout.splitlines())
    total = len((dest / "SHA256SUMS").read_text().splitlines())
    say(f"  $ cd {dest} && sha256sum -c SHA256SUMS")
    say(f"  sha256sum -c: {ok} of {total} files OK (exit {sums.returncode})")
    if sums.returncode != 0:
        raise DemoError(f"sha256sum -c found mismatches in {dest}:\n{sums.stdout}{sums.stderr}", 5)

    step(5, "The same epoch with DATA_ROOT at the hot copy")
    hot = epoch("hot", dest, work, args.step_ms)

    step(6, "Cold against hot")
    for line in table(cold, hot, args.files, args.step_ms):
        say(line)
    say(f"  (2 epochs of examples/train.py; batch timing from hotcache.adapters; "
        f"load average {os.getloadavg()[0]:.1f})")

    step(7, "Take it all down again")
    say("  bash examples/demo.sh --cleanup     # does all of this at once")
    say(f"  hotcache teardown {FAST} --yes --remove-images")
    say(f"  hotcache teardown {ORIGIN} --yes --remove-images")
    say("  (without --remove-images the images stay, with their data, and the next run "
        "mounts them again)")


def cleanup(args) -> None:
    from hotcache.provision import mapping

    state = mapping.load(mapping.state_path())
    say("hotcache demo: taking it all down")
    for name in (FAST, ORIGIN):
        if name in state["caches"]:
            hotcache("teardown", name, "--yes", "--remove-images")
    for image in ("ssd.img", "hdd.img", "hdd-cache.img"):
        path = args.workdir / image
        # Kept by an earlier teardown without --remove-images: hotcache's, so ours to delete.
        if path.exists() and os.path.realpath(path) in (state.get("kept_images") or {}):
            path.unlink()
            say(f"  deleted {path} (kept by an earlier teardown)")
    Throttle(args.cgroup, 0, 0).release()
    for leftover in ("demo.yaml", "cold.jsonl", "hot.jsonl"):
        (args.workdir / leftover).unlink(missing_ok=True)
    for folder in (args.workdir, args.mounts / "hdd", args.mounts / "ssd", args.mounts):
        try:
            folder.rmdir()
        except OSError:           # not there, or holding something the demo did not make
            pass
    say("  done: no demo cache, mount, loop device or image is left")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="examples/demo.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cleanup", action="store_true", help="take everything down")
    parser.add_argument("--workdir", type=Path, default=Path("/var/lib/hotcache/demo"),
                        help="where the images and the spec go [%(default)s]")
    parser.add_argument("--mounts", type=Path, default=Path("/mnt/hotcache-demo"),
                        help="where the two filesystems are mounted [%(default)s]")
    parser.add_argument("--files", type=int, default=512, help="JPEGs in the dataset")
    parser.add_argument("--iops", type=int, default=100, help="the slow origin's read IOPS")
    parser.add_argument("--mbps", type=int, default=40, help="the slow origin's read MB/s")
    parser.add_argument("--step-ms", type=float, default=40.0,
                        help="simulated GPU step per batch")
    args = parser.parse_args(argv)
    args.workdir, args.mounts = args.workdir.absolute(), args.mounts.absolute()
    # One cgroup per work folder, so a test's demo never shares one with the real demo.
    digest = hashlib.sha256(str(args.workdir).encode()).hexdigest()[:8]
    args.cgroup = f"hotcache-demo-{digest}"
    if os.geteuid() != 0:
        print("demo: needs root (loop devices, mounts, cgroups); run `sudo bash "
              "examples/demo.sh`", file=sys.stderr)
        return 6
    try:
        cleanup(args) if args.cleanup else run(args)
    except DemoError as err:
        print(f"demo: {err}\n  `bash examples/demo.sh --cleanup` takes down what it built",
              file=sys.stderr)
        return err.code
    except KeyboardInterrupt:
        print("demo: interrupted; run it again to finish, or --cleanup", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Guest-side helpers: run only inside the QEMU guest that tests/vm/test_guest_kernel.py
boots (real bcache and device-mapper). Everything persistent (mapping, fstab, units,
recorded checksums) lives in HOTCACHE_VM_PERSIST, a folder on the host that survives the
simulated reboot like /etc would."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import HDD_PARTS_MIB, PARTITION, SSD2_PARTS_MIB, SSD_PARTS_MIB  # noqa: E402

PERSIST = Path(os.environ.get("HOTCACHE_VM_PERSIST", "/tmp/hcvm-persist"))
MOUNTS = Path("/tmp/hcvm")
SSD, HDD = "/dev/disk/by-id/virtio-ssd", "/dev/disk/by-id/virtio-hdd"
SSD2 = "/dev/disk/by-id/virtio-ssd2"     # the storage-safety boots' second SSD


def sh(*argv, check=True, input=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], check=check, capture_output=True,
                          text=True, input=input)


class Result:
    """A command's exit code and what a user would see (`out`, stdout and stderr
    interleaved); `json` parses stdout alone, as a script piping `--json` would (progress
    lines go to stderr)."""

    def __init__(self, code: int, out: str, stdout: str | None = None):
        self.code, self.out = code, out
        self.stdout = out if stdout is None else stdout

    @property
    def json(self):
        return json.loads(self.stdout)


@functools.cache
def cli():
    """The CLI's click command, built from the typer app once: typer builds it again at
    every CliRunner call (signatures, type hints and parameters of every command), which
    costs about 0.4 s a call under emulation."""
    import typer.main

    from hotcache.provision.cli.app import app

    return typer.main.get_command(app)


def hotcache(*args: str) -> Result:
    """The CLI, in this process (a new Python costs ~3 s under emulation)."""
    from click.testing import CliRunner

    from hotcache.provision.errors import HotcacheError

    res = CliRunner().invoke(cli(), [str(a) for a in args])
    if isinstance(res.exception, HotcacheError):
        return Result(res.exception.exit_code, res.output + str(res.exception), res.stdout)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return Result(res.exit_code, res.output, res.stdout)


def spec_for(backend: str, *, mode: str | None = None, tunables: dict | None = None) -> Path:
    n = PARTITION[backend]
    cache = {"name": backend.replace("-", ""), "backend": backend,
             "origin": f"{HDD}-part{n}", "cache": f"{SSD}-part{n}",
             "filesystem": {"mountpoint": str(MOUNTS / backend)}}
    if mode:
        cache["mode"] = mode
    if tunables:
        cache["tunables"] = tunables
    path = PERSIST / f"spec-{backend}.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "caches": [cache]}))
    return path


def name_of(backend: str) -> str:
    return backend.replace("-", "")


def status(backend: str) -> dict:
    res = hotcache("status", name_of(backend), "--json")
    return res.json["caches"][0]


def drop_caches() -> None:
    sh("sync")
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def write_files(folder: Path, count: int, size: int, prefix: str) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    sums = {}
    for i in range(count):
        data = os.urandom(size)
        (folder / f"{prefix}{i:04d}.bin").write_bytes(data)
        sums[f"{prefix}{i:04d}.bin"] = hashlib.sha256(data).hexdigest()
    sh("sync")
    return sums


def checksums(folder: Path, prefix: str = "") -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.glob(f"{prefix}*.bin"))}


def partition_disks() -> None:
    """The partition pairs of cases.py on fresh images; nothing on later boots."""
    for disk, parts in ((SSD, SSD_PARTS_MIB), (HDD, HDD_PARTS_MIB)):
        if not os.path.exists(f"{disk}-part1"):
            layout = "label: gpt\n" + "".join(f",{m}M\n" for m in parts) + ",\n"
            sh("sfdisk", "--quiet", disk, input=layout)
    sh("udevadm", "settle")
    poll("partition links", lambda: all(
        os.path.exists(f"{d}-part{len(p) + 1}")
        for d, p in ((SSD, SSD_PARTS_MIB), (HDD, HDD_PARTS_MIB))))


def partition_ssd2() -> None:
    """ssd2's partitions (cases.py), made on its fresh image by the first case of a
    chain that uses it; nothing when they are there."""
    if not os.path.exists(f"{SSD2}-part1"):
        sh("sfdisk", "--quiet", SSD2,
           input="label: gpt\n" + "".join(f",{m}M\n" for m in SSD2_PARTS_MIB))
        sh("udevadm", "settle")
    poll("ssd2 partitions", lambda: os.path.exists(f"{SSD2}-part{len(SSD2_PARTS_MIB)}"))


def poll(what: str, fn, timeout: float = 30.0, interval: float = 1.0):
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def behind_header(origin) -> str | None:
    """A read-only loop device of the filesystem behind hotcache's header on a raw
    dm-cache origin (the header says where it starts, as an administrator reads it),
    None when the origin starts with no header (detach it with `losetup --detach`)."""
    with open(origin, "rb") as f:
        head = f.read(4096)
    if not head.startswith(b"HOTCACHE-HEADER\n"):
        return None
    fields = json.loads(head.split(b"\n")[1])
    assert fields["role"] == "origin", fields
    return sh("losetup", "--find", "--show", "--read-only", "--offset",
              fields["filesystem_offset_bytes"], origin).stdout.strip()


def dm_ssd(part: str, dm: str) -> int:
    """A test SSD: partition `part` zeroed at its start, under a dm-linear device `dm`
    with a dm UUID (a stable identity, which a partition's table can also give, and a
    table the case can switch to the error target to fail it). Its size in sectors."""
    sh("dd", "if=/dev/zero", f"of={part}", "bs=1M", "count=2", "oflag=direct")
    sectors = int(sh("blockdev", "--getsz", part).stdout)
    sh("dmsetup", "create", dm, "--uuid", f"HOTCACHE-TEST-{dm}", "--table",
       f"0 {sectors} linear {os.path.realpath(part)} 0")
    sh("udevadm", "settle")
    return sectors


def one_cache_spec(name: str, **cache) -> Path:
    """PERSIST/spec-NAME.yaml: a spec of the one cache `name` with the fields `cache`,
    mounted at MOUNTS/NAME."""
    spec = PERSIST / f"spec-{name}.yaml"
    spec.write_text(yaml.safe_dump({"version": 1, "caches": [{
        "name": name, **cache, "filesystem": {"mountpoint": str(MOUNTS / name)}}]}))
    return spec

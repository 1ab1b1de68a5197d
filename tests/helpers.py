"""Helpers the test tiers share: run the real `hotcache` entry point, build specs, and
clean up loop devices and mounts that a test made."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hotcache.provision.system import mountinfo

HOTCACHE = [sys.executable, "-m", "hotcache.provision"]


def hotcache(*args: str, env: dict | None = None, input: str | None = None,
             check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([*HOTCACHE, *map(str, args)], env={**os.environ, **(env or {})},
                          input=input if input is not None else "", capture_output=True,
                          text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"hotcache {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def hotcache_json(*args: str, env: dict | None = None) -> tuple[int, dict]:
    proc = hotcache(*args, "--json", env=env)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"not JSON: {proc.stdout!r}\nstderr: {proc.stderr}") from exc


def recorded_entry(name: str, **fields) -> dict:
    """A mapping entry with the fields every entry has (provision/records.CacheEntry),
    `fields` on top (`filesystem` merged into the recorded one)."""
    fs = {"uuid": f"uuid-{name}", "mountpoint": f"/mnt/{name}", **fields.pop("filesystem", {})}
    return {"backend": "none", "state": "ready", "devices": {}, "filesystem": fs,
            "spec": {"name": name}, **fields}


def entry_record(name: str = "c1", **fields):
    """recorded_entry() as the typed record mapping.load gives (records.CacheEntry)."""
    from hotcache.provision.records import CacheEntry

    return CacheEntry.model_validate(recorded_entry(name, **fields))


def write_spec(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def loop_spec(tmp: Path, name: str = "hot", size: str = "512M", **fs) -> str:
    """A spec for one cache of backend none on a loop image under tmp."""
    opts = "".join(f"\n      {k}: {v}" for k, v in fs.items())
    return textwrap.dedent(f"""\
        version: 1
        caches:
          - name: {name}
            backend: none
            origin:
              loop: {{file: {tmp}/{name}.img, size: {size}}}
            filesystem:
              mountpoint: {tmp}/mnt/{name}""") + opts + "\n"


def mounts_under(root: Path) -> list[str]:
    out = []
    prefix = str(root).rstrip("/") + "/"
    for m in mountinfo.read():    # "my data" is listed as my\040data: read() decodes it
        if m.mountpoint.startswith(prefix):
            out.append(m.mountpoint)
    return out


def loops_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    found = []
    for f in Path("/sys/class/block").glob("loop*/loop/backing_file"):
        if f.read_text().strip().startswith(prefix):
            found.append(f"/dev/{f.parent.parent.name}")
    return found


def cleanup(root: Path) -> None:
    """Unmount and detach everything a test left under root (deepest mounts first)."""
    for mp in sorted(mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mp], check=False, capture_output=True)
    for dev in loops_under(root):
        subprocess.run(["losetup", "--detach", dev], check=False, capture_output=True)


def sha256_file(path) -> str:
    """sha256 of a file or a whole block device, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

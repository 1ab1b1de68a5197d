"""Hot copies onto real XFS filesystems on loop devices: a filesystem that fills up
mid-copy, the capacity check, and a copy onto a mount that hotcache built and manages."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import hotcache, hotcache_json, loop_spec
from tests.unit.hotcopy.test_copy import make_dataset, sha256sum_check, tree

pytestmark = pytest.mark.root


def small_xfs(root: Path, name: str, size_mib: int = 300) -> Path:
    """An XFS of `size_mib` MiB on a loop device, mounted under root (the sandbox fixture
    unmounts and detaches it afterwards)."""
    image, mp = root / f"{name}.img", root / "mnt" / name
    subprocess.run(["truncate", "-s", f"{size_mib}M", image], check=True)
    dev = subprocess.run(["losetup", "--find", "--show", image], check=True,
                         capture_output=True, text=True).stdout.strip()
    subprocess.run(["mkfs.xfs", "-q", dev], check=True)
    mp.mkdir(parents=True)
    subprocess.run(["mount", "-o", "noatime", dev, mp], check=True)
    return mp


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill_until(mp: Path, leave: int) -> None:
    filler = mp / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, free_bytes(mp) - leave)


def test_filesystem_fills_up_mid_copy(sandbox):
    mp = small_xfs(sandbox, "tiny")
    fill_until(mp, 24 << 20)
    free_before = free_bytes(mp)
    src = make_dataset(sandbox / "src", classes=("a", "b"), n=12, size=2 << 20)  # ~48 MiB
    dest = mp / "ds"
    # skip the up-front check, as if another writer had taken the space meanwhile
    proc = hotcache("copy", src, dest, "--no-space-check")
    assert proc.returncode == 1, proc.stderr
    assert "filled up during the copy" in proc.stderr and "nothing was published" in proc.stderr
    assert not dest.exists()
    assert sorted(p.name for p in mp.iterdir()) == ["filler"]   # staging cleaned up
    assert free_bytes(mp) >= free_before - (1 << 20)


def test_capacity_check_refuses_on_a_small_xfs(sandbox):
    mp = small_xfs(sandbox, "tiny")
    fill_until(mp, 24 << 20)
    src = make_dataset(sandbox / "src", classes=("a",), n=10, size=2 << 20)   # ~20 MiB
    proc = hotcache("copy", src, mp / "ds")
    assert proc.returncode == 3
    free = free_bytes(mp)
    # 20 MiB fit in 24 MiB, but not with the 20% margin: both numbers are in the message
    assert "to copy + 20% margin" in proc.stderr and f"free ({free} bytes)" in proc.stderr
    assert sorted(p.name for p in mp.iterdir()) == ["filler"]
    assert hotcache("copy", src, mp / "ds", "--margin", "0.1").returncode == 0


def test_copy_refresh_and_list_on_a_managed_mount(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox, name="hot", size="320M"))
    hotcache("apply", spec, "--yes", check=True)
    mp = sandbox / "mnt" / "hot"
    src = make_dataset(sandbox / "src", classes=("x", "y"), n=30, size=64 << 10)
    for f in src.rglob("*.jpg"):
        f.chmod(0o600)      # only --owner/--mode make the copy readable for the job
    dest = mp / "pets"
    rc, out = hotcache_json("copy", src, dest, "--name", "pets", "--owner", "nobody:nogroup",
                            "--mode", "0444")
    assert rc == 0 and out["cache"] == "hot", out
    assert sha256sum_check(dest).returncode == 0 and tree(dest) == tree(src)
    st = (dest / "x" / "000.jpg").stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (65534, 0o444)
    # the training user can read it (through a folder fd: pytest's tmp root is 0700)
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               "cat", f"/proc/self/fd/{fd}/y/003.jpg"], capture_output=True,
                              pass_fds=[fd])
    finally:
        os.close(fd)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (src / "y" / "003.jpg").read_bytes()

    # a reader holding the old version open keeps reading it across the swap
    (src / "x" / "001.jpg").write_bytes(b"v2")
    held = open(dest / "x" / "001.jpg", "rb")
    rc, out = hotcache_json("copy", src, dest, "--owner", "nobody:nogroup", "--mode", "0444")
    assert rc == 0 and out["version"] == "2" and out["copied_files"] == 1
    assert len(held.read()) == (64 << 10) + 1
    held.close()
    assert (dest / "x" / "001.jpg").read_bytes() == b"v2"
    assert sorted(p.name for p in mp.iterdir()) == ["pets"]     # old tree removed

    state = yaml.safe_load(Path(os.environ["HOTCACHE_STATE"]).read_text())
    assert state["caches"]["hot"]["hot_copies"][str(dest)]["version"] == "2"
    hotcache("verify", dest, "--full", check=True)
    rc, listing = hotcache_json("copies")
    assert rc == 0
    (row,) = listing["copies"]
    assert (row["name"], row["version"], row["cache"], row["state"]) == \
        ("pets", "2", "hot", "verified")
    meta = json.loads((dest / ".hotcache-copy.json").read_text())
    assert meta["verify_ok"] is True and row["verified_at"] == meta["verified_at"]
    hotcache("teardown", "hot", "--yes", check=True)

"""`hotcache devices` and `plan --json` against real loop devices."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import hotcache, hotcache_json, loop_spec

pytestmark = pytest.mark.root


def test_devices_sees_a_loop_device_and_its_signature(sandbox):
    img = sandbox / "disk.img"
    subprocess.run(["truncate", "-s", "400M", img], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
    dev = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True,
                         check=True).stdout.strip()
    rc, doc = hotcache_json("devices")
    assert rc == 0
    row = next(d for d in doc["devices"] if d["node"] == dev)
    assert row["size"] == 400 * 2**20 and row["loop_file"] == str(img)
    assert [s["type"] for s in row["signatures"]] == ["ext4"]
    assert row["safe"] is False and any("ext4" in p for p in row["problems"])
    root = [d for d in doc["devices"] if d["holds_root"]]
    assert root and all(not d["safe"] for d in root)

    subprocess.run(["wipefs", "--all", "--quiet", dev], check=True)
    rc, doc = hotcache_json("devices")
    row = next(d for d in doc["devices"] if d["node"] == dev)
    assert row["safe"] is True and row["signatures"] == []


def kernel_facts() -> dict[str, bool]:
    """What the running kernel offers, read from the kernel itself, independently of
    hotcache's own probe: the device-mapper control device is a misc device, and bcache
    registers /sys/fs/bcache."""
    misc = Path("/proc/misc").read_text().split()
    return {"device-mapper": "device-mapper" in misc, "bcache": Path("/sys/fs/bcache").is_dir()}


NEEDS = {"none": None, "bcache": "bcache", "dm-cache": "device-mapper",
         "lvmcache": "device-mapper"}


def test_backends_view_says_what_this_kernel_can_run():
    rc, doc = hotcache_json("devices", "--backends")
    assert rc == 0
    rows = {r["backend"]: r for r in doc["backends"]}
    assert set(rows) == set(NEEDS)
    facts = kernel_facts()
    for backend, feature in NEEDS.items():
        has = feature is None or facts[feature]
        assert rows[backend]["available"] is has, (backend, rows[backend], facts)
        if not has:
            assert feature in rows[backend]["why"], rows[backend]


def two_loop_images(sandbox) -> tuple[str, str]:
    devs = []
    for name in ("hdd", "ssd"):
        img = sandbox / f"{name}.img"
        subprocess.run(["truncate", "-s", "400M", img], check=True)
        devs.append(subprocess.run(["losetup", "--find", "--show", img], capture_output=True,
                                   text=True, check=True).stdout.strip())
    return devs[0], devs[1]


@pytest.mark.parametrize("backend", ["dm-cache", "lvmcache", "bcache"])
def test_a_kernel_without_the_feature_gets_exit_7_naming_it(sandbox, backend):
    """docs/provisioning-and-specs.md: a kernel without bcache or device-mapper gets an
    error naming what is missing and the backends this host can use (exit 7), and nothing changes. Where this
    kernel does have the feature, the same spec plans (the guest tier builds it)."""
    hdd, ssd = two_loop_images(sandbox)
    spec = sandbox / "spec.yaml"
    spec.write_text(f"""version: 1
caches:
  - name: c1
    backend: {backend}
    origin: {hdd}
    cache: {ssd}
    filesystem: {{mountpoint: {sandbox}/mnt/c1}}
""")
    feature = NEEDS[backend]
    for command in (["plan", spec], ["apply", spec, "--yes"]):
        proc = hotcache(*command)
        if kernel_facts()[feature]:
            assert proc.returncode == 0 or command[0] == "apply", proc.stderr
            continue
        assert proc.returncode == 7, proc.stderr
        assert f"backend {backend} cannot run here" in proc.stderr and feature in proc.stderr
        assert "this host can use backend none" in proc.stderr
        assert not Path(os.environ["HOTCACHE_STATE"]).exists()   # (its lock file may)
        assert not (sandbox / "mnt" / "c1").exists()
    for dev in (hdd, ssd):
        assert subprocess.run(["blkid", "-p", dev], capture_output=True).returncode == 2


def test_plan_json_shows_every_argv_and_changes_nothing(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    rc, doc = hotcache_json("plan", spec)
    assert rc == 0
    argvs = [s["argv"] for s in doc["steps"] if s["argv"]]
    assert argvs[0] == ["truncate", "--size", str(512 * 2**20), str(sandbox / "hot.img")]
    assert ["losetup", "--find", "--show", str(sandbox / "hot.img")] in argvs
    mkfs = next(a for a in argvs if a[0] == "mkfs.xfs")
    assert mkfs[-1] == f"<loop device of {sandbox / 'hot.img'}>"
    assert not (sandbox / "hot.img").exists() and not (sandbox / "state").exists()


def test_mountpoints_with_spaces_and_non_ascii_names_are_found(sandbox):
    """mountinfo escapes a space as \\040 but leaves UTF-8 as it is; both readers agree."""
    from hotcache.adapters.blockinfo import backing_of
    from hotcache.provision.block.blockdev import mount_at
    from hotcache.provision.block.host import Host

    mp = sandbox / "my dätä"
    mp.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", mp], check=True)
    assert mount_at(Host(), str(mp)).mountpoint == str(mp)
    assert backing_of(mp).mountpoint == str(mp) and backing_of(mp).fstype == "tmpfs"

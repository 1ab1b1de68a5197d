"""`hotcache devices` and `plan --json` against real loop devices."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import hotcache_json, loop_spec

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


def test_backends_view_says_what_this_kernel_can_run():
    rc, doc = hotcache_json("devices", "--backends")
    rows = {r["backend"]: r for r in doc["backends"]}
    assert rows["none"]["available"] is True
    assert set(rows) == {"none", "bcache", "dm-cache", "lvmcache"}
    for row in rows.values():
        assert row["available"] or row["why"]


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

    mp = sandbox / "my dätä"
    mp.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", mp], check=True)
    assert mount_at(str(mp)).mountpoint == str(mp)
    assert backing_of(mp).mountpoint == str(mp) and backing_of(mp).fstype == "tmpfs"

"""Boot 1: each backend through apply, idempotence, I/O, statistics, a mode change in
place, a writeback teardown checked file by file on the bare origin, then a fresh cache
left for the simulated reboot (guest_reboot.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from vmlib import (HDD, MOUNTS, PERSIST, SSD, checksums, drop_caches, hotcache,
                   name_of, poll, sh, spec_for, status, write_files)

from cases import BACKENDS, EXISTING_LV_PARTITION, PARTITION

STATS_KEYS = {"hits", "misses", "hit_ratio", "dirty_bytes", "cache_used_bytes",
              "cache_total_bytes", "promotions", "policy", "state", "mode"}
REBOOT_TUNABLES = {"bcache": {"writeback_percent": 20},
                   "dm-cache": {"migration_threshold": 4096},
                   "lvmcache": {"migration_threshold": 4096}}


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


def data_dir(backend: str) -> Path:
    return MOUNTS / backend / "data"


def test_apply(backend):
    res = hotcache("apply", spec_for(backend), "--yes")
    assert res.code == 0, res.out
    st = status(backend)
    assert st["ok"], st["problems"]
    assert st["mounted"] and st["noatime"] and st["fs_uuid_matches"]
    assert st["mode"] == "writethrough"
    cache = st["cache"]
    assert STATS_KEYS <= set(cache), cache
    assert cache["mode"] == "writethrough"
    assert cache["cache_total_bytes"] > 0
    if backend == "bcache":
        from hotcache.provision.backends import bcache_sysfs as sb
        from hotcache.provision.block.host import Host

        host = Host()
        assert st["cached_device"].startswith("/dev/bcache/by-uuid/")
        assert cache["sequential_cutoff"] == 0 and cache["bypassed"] >= 0
        cset = sb.set_dir(sb.attached_set(host, st["devices"]["origin"]["node"]))
        for key in ("congested_read_threshold_us", "congested_write_threshold_us"):
            assert host.read(f"{cset}/{key}") == "0", key   # the kernel's defaults: 2000, 20000
    unit = PERSIST / "units" / f"hotcache-restore-{name_of(backend)}.service"
    assert f"restore {name_of(backend)} --yes" in unit.read_text()


def test_second_apply_changes_nothing(backend):
    res = hotcache("apply", spec_for(backend), "--yes", "--json")
    assert res.code == 0, res.out
    assert res.json["changed"] is False, res.json["steps"]
    assert res.json["unchanged"] == [name_of(backend)]


def test_write_and_read_back(backend):
    sums = write_files(data_dir(backend), 40, 256 * 1024, "a")
    (PERSIST / f"sums-a-{backend}.json").write_text(json.dumps(sums))
    drop_caches()
    assert checksums(data_dir(backend)) == sums


def test_data_root_names_the_cache(backend, monkeypatch):
    """The training adapters tell, unprivileged-style from sysfs, which cache is behind
    DATA_ROOT: here checked against the real bcache, dm-cache and lvmcache devices."""
    from hotcache.adapters import data_root

    monkeypatch.setenv("DATA_ROOT", str(data_dir(backend)))
    root = data_root()
    assert root.backing.fstype == "xfs"
    assert root.backing.cache == backend, root.backing
    assert root.backing.mountpoint == str(MOUNTS / backend)


def test_status_shows_hits(backend):
    for _ in range(4):          # dm-cache's smq promotes only blocks read again and again
        drop_caches()
        checksums(data_dir(backend))
    cache = poll("cache hits in status",  # bcache folds counters in every ~5 s
                 lambda: (c := status(backend)["cache"])["hits"] > 0 and c)
    assert cache["hit_ratio"] is not None and 0 < cache["hit_ratio"] <= 1
    assert cache["cache_used_bytes"] > 0


COLD_MODE = {"bcache": "none", "dm-cache": "passthrough", "lvmcache": "passthrough"}


def origin_bytes_read(backend: str) -> int:
    name = Path(f"{HDD}-part{PARTITION[backend]}").resolve().name
    return int(Path(f"/sys/class/block/{name}/stat").read_text().split()[2]) * 512


def test_warm_fills_the_cache(backend):
    """Data written past the cache (a mode that does not cache) is on the origin only;
    `hotcache warm` reads it until the origin device serves (almost) none of it, and what
    it reports about the origin is what a cold read after it finds: bcache holds it all;
    smq (dm-cache, lvmcache) promotes most of it, and may decline some blocks for good."""
    assert hotcache("apply", spec_for(backend, mode=COLD_MODE[backend]), "--yes").code == 0
    folder = MOUNTS / backend / "warm"
    count, size = 48, 256 * 1024
    sums = write_files(folder, count, size, "w")
    res = hotcache("apply", spec_for(backend), "--yes")       # writethrough again, in place
    assert res.code == 0, res.out
    res = hotcache("warm", folder, "--json")
    assert res.code == 0, res.out
    report = res.json
    assert report["backend"] == backend and report["evicted_before_reading"]
    assert report["hit_ratio_after"] is not None
    passes = report["passes"]
    if backend == "bcache":     # it started on the origin, and one pass moved it
        assert report["sweep"] == [] and passes[0]["from_origin"] >= count * size // 2
    else:                       # the windows of the sweep read it from the origin first
        assert report["sweep"], report
    drop_caches()
    before = origin_bytes_read(backend)
    assert checksums(folder) == sums
    from_origin = origin_bytes_read(backend) - before
    why = (from_origin, report["stopped"], [(p["from_origin"], p["promoted"]) for p in passes],
           report["focus"])
    assert abs(from_origin - passes[-1]["from_origin"]) <= 0.1 * count * size, why
    limit = 0.05 if backend == "bcache" else 0.5
    assert from_origin <= limit * count * size, why


def test_mode_change_in_place(backend):
    fs_uuid = status(backend)
    plan = hotcache("plan", spec_for(backend, mode="writeback"), "--json")
    assert plan.code == 0, plan.out
    steps = plan.json["steps"]
    assert steps and not any(s["destructive"] for s in steps), steps
    assert not any((s["argv"] or [""])[0] in ("mkfs.xfs", "make-bcache", "wipefs")
                   for s in steps), steps
    res = hotcache("apply", spec_for(backend, mode="writeback"), "--yes")
    assert res.code == 0, res.out
    st = status(backend)
    assert st["cache"]["mode"] == "writeback" and st["mode"] == "writeback"
    assert st["mounted"] and st["fs_uuid_matches"] and fs_uuid["cached_device"] == st["cached_device"]
    sums = json.loads((PERSIST / f"sums-a-{backend}.json").read_text())
    assert checksums(data_dir(backend)) == sums


def test_teardown_writeback_loses_nothing(backend):
    folder = data_dir(backend)
    dm = None
    if backend != "bcache":
        # dm-cache writes dirty blocks back within a second of idling. A migration
        # threshold below one cache block (128 sectors) holds them until just before
        # the teardown, which then really has dirty blocks to flush.
        kname = os.path.basename(os.path.realpath(status(backend)["cached_device"]))
        dm = Path(f"/sys/class/block/{kname}/dm/name").read_text().strip()
        sh("dmsetup", "message", dm, "0", "migration_threshold", "64")
    # Overwrite in place (same disk blocks) files the cache already holds: writeback hits
    # stay dirty on the SSD. Add new files too; checksum everything the filesystem holds.
    for i in range(40):
        with open(folder / f"a{i:04d}.bin", "r+b") as f:
            f.write(os.urandom(256 * 1024))
    write_files(folder, 20, 256 * 1024, "b")
    sh("sync")
    want = checksums(folder)
    dirty = poll("dirty data in the writeback cache",
                 lambda: status(backend)["cache"]["dirty_bytes"], timeout=15)
    assert dirty > 0
    if dm:
        sh("dmsetup", "message", dm, "0", "migration_threshold", "2048")  # the default
    res = hotcache("teardown", name_of(backend), "--yes")
    assert res.code == 0, res.out
    assert hotcache("status", "--json").json["caches"] == [] or \
        name_of(backend) not in [c["name"] for c in hotcache("status", "--json").json["caches"]]
    assert checksums_on_bare_origin(backend) == want
    free_origin(backend)


def checksums_on_bare_origin(backend: str) -> dict[str, str]:
    """Mount what is left on the origin, read-only, without any cache in front."""
    n = PARTITION[backend]
    origin = f"/dev/disk/by-id/virtio-hdd-part{n}"
    mp = Path(f"/tmp/hcvm-bare-{backend}")
    mp.mkdir(exist_ok=True)
    loop = None
    if backend == "bcache":
        show = sh("bcache-super-show", origin).stdout
        first = int(next(l.split()[1] for l in show.splitlines()
                         if l.startswith("dev.data.first_sector")))
        loop = sh("losetup", "--find", "--show", "--read-only", "--offset", first * 512,
                  origin).stdout.strip()
        device = loop
    elif backend == "dm-cache":
        device = origin
    else:
        device = "/dev/hc_lvmcache/data"
    sh("mount", "-o", "ro", device, mp)
    try:
        return checksums(mp / "data")
    finally:
        sh("umount", mp)
        if loop:
            sh("losetup", "--detach", loop)


def free_origin(backend: str) -> None:
    """What an administrator does after checking the data: release the devices."""
    n = PARTITION[backend]
    if backend == "lvmcache":
        cfg = ["--config", "devices { use_devicesfile=0 }"]
        sh("vgremove", *cfg, "--yes", "--force", "hc_lvmcache")
        sh("pvremove", *cfg, "--yes", f"/dev/disk/by-id/virtio-hdd-part{n}", check=False)
    for disk in ("ssd", "hdd"):
        sh("wipefs", "--all", f"/dev/disk/by-id/virtio-{disk}-part{n}")
    sh("udevadm", "settle")


def test_prepare_reboot(backend):
    spec = spec_for(backend, mode="writeback", tunables=REBOOT_TUNABLES[backend])
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    sums = write_files(data_dir(backend), 30, 128 * 1024, "r")
    (PERSIST / f"sums-r-{backend}.json").write_text(json.dumps(sums))
    assert status(backend)["ok"]
    sh("umount", MOUNTS / backend)  # what shutdown does; the cache device stays as it is


def test_lvmcache_attaches_to_existing_lv():
    """An LV that already holds a filesystem and data gets an SSD cache without being
    reformatted; teardown leaves the LV holding every file."""
    n = EXISTING_LV_PARTITION
    cfg = ["--config", "devices { use_devicesfile=0 }"]
    sh("pvcreate", *cfg, "--yes", f"{HDD}-part{n}")
    sh("vgcreate", *cfg, "--yes", "userdata", f"{HDD}-part{n}")
    sh("lvcreate", *cfg, "--yes", "--name", "data", "--extents", "100%PVS", "userdata",
       f"{HDD}-part{n}")
    sh("mkfs.xfs", "-q", "/dev/userdata/data")
    fs_uuid = sh("blkid", "--probe", "--match-tag", "UUID", "--output", "value",
                 "/dev/userdata/data").stdout.strip()
    mp = MOUNTS / "existing"
    mp.mkdir(parents=True, exist_ok=True)
    sh("mount", "/dev/userdata/data", mp)
    want = write_files(mp / "data", 20, 256 * 1024, "e")
    sh("umount", mp)
    spec = PERSIST / "spec-existing.yaml"
    spec.write_text(yaml.safe_dump({"version": 1, "caches": [{
        "name": "existing", "backend": "lvmcache", "origin": "/dev/userdata/data",
        "cache": f"{SSD}-part{n}", "filesystem": {"mountpoint": str(mp)}}]}))
    plan = hotcache("plan", spec, "--json")
    assert plan.code == 0, plan.out
    assert not any((s["argv"] or [""])[0] == "mkfs.xfs" for s in plan.json["steps"])
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    st = status("existing")
    assert st["ok"], st["problems"]
    assert st["cache"]["mode"] == "writethrough" and st["cache"]["cache_total_bytes"] > 0
    assert sh("blkid", "--probe", "--match-tag", "UUID", "--output", "value",
              "/dev/userdata/data").stdout.strip() == fs_uuid
    assert checksums(mp / "data") == want
    assert hotcache("apply", spec, "--yes", "--json").json["changed"] is False
    res = hotcache("teardown", "existing", "--yes")
    assert res.code == 0, res.out
    assert "cache" not in sh("lvs", *cfg, "--noheadings", "-o", "segtype",
                             "userdata/data").stdout
    sh("mount", "-o", "ro", "/dev/userdata/data", mp)
    try:
        assert checksums(mp / "data") == want
    finally:
        sh("umount", mp)

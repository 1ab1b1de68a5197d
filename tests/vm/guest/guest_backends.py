"""Boot 1: each backend through apply, idempotence, I/O, statistics, a mode change in
place, a writeback teardown checked file by file on the bare origin, then a fresh cache
left for the simulated reboot (guest_reboot.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from vmlib import (HDD, MOUNTS, PERSIST, SSD, behind_header, checksums, drop_caches,
                   hotcache, name_of, poll, sh, spec_for, status, write_files)

from cases import BACKENDS, EXISTING_LV_PARTITION, PARTITION

STATS_KEYS = {"hits", "misses", "hit_ratio", "dirty_bytes", "cache_used_bytes",
              "cache_total_bytes", "promotions", "policy", "state", "mode"}
# dm-cache's threshold below one cache block (128 sectors) holds its dirty blocks across
# the reboot, so boot 2 can see that restore kept the metadata (dirty and used blocks).
REBOOT_TUNABLES = {"bcache": {"writeback_percent": 20},
                   "dm-cache": {"migration_threshold": 64},
                   "lvmcache": {"migration_threshold": 4096}}
PROMOTING = {"migration_threshold": 4096}   # dm-cache, while the reboot data is promoted


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


def data_dir(backend: str) -> Path:
    return MOUNTS / backend / "data"


@pytest.fixture(scope="module")
def built(backend):
    """This backend's cache, built and holding the `a` files: its own state, so a case
    that only needs a working cache runs alone (`-k test_warm_fills_the_cache`) and does
    not fail because another case did. On the full run it finds what test_apply and
    test_write_and_read_back made (an apply that changes nothing). The chain stays only
    where the order is the behaviour: write, teardown, check the bare origin; prepare
    the reboot, boot again, restore."""
    res = hotcache("apply", spec_for(backend), "--yes")
    assert res.code == 0, f"could not build the {backend} cache: {res.out}"
    sums = PERSIST / f"sums-a-{backend}.json"
    if not sums.exists():
        sums.write_text(json.dumps(write_files(data_dir(backend), 40, 256 * 1024, "a")))
    return backend


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
        from hotcache.provision.backends.parts import bcache_sysfs as sb
        from hotcache.provision.block.host import Host

        host = Host()
        assert st["cached_device"].startswith("/dev/bcache/by-uuid/")
        assert cache["sequential_cutoff"] == 0 and cache["bypassed"] >= 0
        cset = sb.set_dir(sb.attached_set(host, st["devices"]["origin"]["node"]))
        for key in ("congested_read_threshold_us", "congested_write_threshold_us"):
            assert host.read(f"{cset}/{key}") == "0", key   # the kernel's defaults: 2000, 20000
    # the boot-time restore unit, as a real apply left it: enabled for local-fs.target
    # (the link systemctl enable would make) and ordered before the cache's mount unit
    from hotcache.provision.engine.bootunit import mount_unit

    unit = PERSIST / "units" / f"hotcache-restore-{name_of(backend)}.service"
    text = unit.read_text()
    assert f"restore {name_of(backend)} --yes" in text
    wants = PERSIST / "units" / "local-fs.target.wants" / unit.name
    assert wants.is_symlink() and wants.resolve() == unit.resolve()
    before = [l.split("=", 1)[1].split() for l in text.splitlines() if l.startswith("Before=")]
    assert [mount_unit(str(MOUNTS / backend)), "local-fs.target"] in before, text
    assert "WantedBy=local-fs.target" in text and "DefaultDependencies=no" in text
    # it waits for the spec's own devices, through the device units udev's links make
    # (systemd-escape reads each name back to the link), not for udev-settle
    n = PARTITION[backend]
    (wants,) = [l.split("=", 1)[1].split() for l in text.splitlines() if l.startswith("Wants=")]
    paths = [sh("systemd-escape", "--unescape", "--path", w.removesuffix(".device")).stdout.strip()
             for w in wants]
    assert sorted(paths) == sorted([f"{HDD}-part{n}", f"{SSD}-part{n}"]), wants
    assert all(os.path.exists(p) for p in paths) and "udev-settle" not in text
    # udev's own properties (libudev, through pyudev) named the devices in the mapping
    from hotcache.provision.block.host import Host

    recorded = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name_of(backend)]
    origin = recorded["devices"]["origin"]
    props = Host().udev_properties(os.path.basename(os.path.realpath(f"{HDD}-part{n}")))
    assert props["ID_SERIAL"] == "hdd" and props["ID_PART_ENTRY_UUID"]
    assert origin["identity"]["partuuid"] == props["ID_PART_ENTRY_UUID"], origin


def test_held_device_is_refused_even_with_wipe(built):
    """The origin now has a holder (bcache0, the dm-cache target, or the LV on the PV):
    a spec that names it, even with wipe: true, is refused, and nothing changes."""
    backend = built
    origin = f"{HDD}-part{PARTITION[backend]}"
    kname = Path(origin).resolve().name
    assert os.listdir(f"/sys/class/block/{kname}/holders"), "no holder to test against"
    probe = lambda: sh("blkid", "--probe", "--output", "export", origin, check=False).stdout  # noqa: E731
    before = (probe(), (PERSIST / "mappings.yaml").read_text(), (PERSIST / "fstab").read_text())
    spec = PERSIST / f"spec-victim-{backend}.yaml"
    spec.write_text(yaml.safe_dump({"version": 1, "caches": [{
        "name": "victim", "backend": "none", "origin": {"path": origin, "wipe": True},
        "filesystem": {"mountpoint": str(MOUNTS / "victim")}}]}))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 3, res.out
    assert "holder" in res.out and "wipe: true" in res.out, res.out
    assert (probe(), (PERSIST / "mappings.yaml").read_text(),
            (PERSIST / "fstab").read_text()) == before
    assert not (MOUNTS / "victim").exists() and status(backend)["ok"]


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


def test_data_root_names_the_cache(built, monkeypatch):
    """The training adapters tell, unprivileged-style from sysfs, which cache is behind
    DATA_ROOT: here checked against the real bcache, dm-cache and lvmcache devices."""
    backend = built
    from hotcache.adapters import data_root

    monkeypatch.setenv("DATA_ROOT", str(data_dir(backend)))
    root = data_root()
    assert root.backing.fstype == "xfs"
    assert root.backing.cache == backend, root.backing
    assert root.backing.mountpoint == str(MOUNTS / backend)


def test_status_shows_hits(built):
    backend = built
    for _ in range(4):          # dm-cache's smq promotes only blocks read again and again
        drop_caches()
        checksums(data_dir(backend))
    cache = poll("cache hits in status",  # bcache folds counters in every ~5 s
                 lambda: (c := status(backend)["cache"])["hits"] > 0 and c)
    assert cache["hit_ratio"] is not None and 0 < cache["hit_ratio"] <= 1
    assert cache["cache_used_bytes"] > 0
    if backend == "bcache":
        assert_bypass_is_counted(backend, cache["bypassed"])


def assert_bypass_is_counted(backend: str, before: int) -> None:
    """A sequential read longer than sequential_cutoff goes around bcache, and status's
    `bypassed` counts it (the key alone proves nothing)."""
    from hotcache.provision.backends.parts import bcache_sysfs as sb
    from hotcache.provision.block.host import Host

    node = status(backend)["devices"]["origin"]["node"]
    cutoff = Path(sb.bdev_dir(Host(), node)) / "sequential_cutoff"
    big = write_files(MOUNTS / backend / "seq", 1, 8 << 20, "s")
    drop_caches()
    cutoff.write_text(f"{1 << 20}\n")    # bytes (6.1 takes no suffix here); hotcache set 0
    try:
        sh("dd", f"if={MOUNTS / backend / 'seq' / 's0000.bin'}", "of=/dev/null", "bs=1M",
           "iflag=direct")
    finally:
        cutoff.write_text("0\n")
    after = poll("bypassed I/Os in status",     # bcache folds counters in every ~5 s
                 lambda: (b := status(backend)["cache"]["bypassed"]) > before and b)
    assert after > before
    assert checksums(MOUNTS / backend / "seq", "s") == big


COLD_MODE = {"bcache": "none", "dm-cache": "passthrough", "lvmcache": "passthrough"}


def origin_bytes_read(backend: str) -> int:
    name = Path(f"{HDD}-part{PARTITION[backend]}").resolve().name
    return int(Path(f"/sys/class/block/{name}/stat").read_text().split()[2]) * 512


def test_warm_fills_the_cache(built):
    """Data written past the cache (a mode that does not cache) is on the origin only;
    `hotcache warm` reads it until the origin device serves (almost) none of it, and what
    it reports about the origin is what a cold read after it finds: bcache holds it all;
    smq (dm-cache, lvmcache) promotes most of it, and may decline some blocks for good."""
    backend = built
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
    # docs/hot-copies.md: warm stops when at most 0.5% of the bytes came from the origin,
    # or says why it stopped short (the cache is full, three quiet passes, --max-passes).
    named = ("the cache is full", "promotions and cache use stopped rising",
             "reached --max-passes")
    if passes[-1]["from_origin"] > 0.005 * passes[-1]["bytes"]:
        assert report["stopped"].startswith(named), why
    else:
        assert report["stopped"].startswith("reads hit the cache"), why
    if backend == "bcache":     # bcache caches every miss: a cold read finds it all there
        assert from_origin <= 0.05 * count * size, why


CHANGED_TUNABLES = {"bcache": {"sequential_cutoff": 1 << 20},
                    "dm-cache": {"migration_threshold": 8192},
                    "lvmcache": {"migration_threshold": 8192}}


def live_tunables(backend: str) -> str:
    """What the kernel runs now: bcache's sysfs value, or the dm table of the cache."""
    st = status(backend)
    if backend == "bcache":
        from hotcache.provision.backends.parts import bcache_sysfs as sb
        from hotcache.provision.block.host import Host
        host = Host()
        bdev = sb.bdev_dir(host, st["devices"]["origin"]["node"])
        return str(sb.parse_human(host.read(f"{bdev}/sequential_cutoff")))
    if backend == "dm-cache":   # the cache target, under the top device
        return sh("dmsetup", "table", f"hc-{name_of(backend)}-cache").stdout
    rdev = os.stat(st["cached_device"]).st_rdev
    return sh("dmsetup", "table", "-j", os.major(rdev), "-m", os.minor(rdev)).stdout


def test_mode_change_in_place(built):
    backend = built
    fs_uuid = status(backend)
    tunables = CHANGED_TUNABLES[backend]
    (key, value), = tunables.items()
    if backend == "bcache":
        assert live_tunables(backend) == "0"
    else:
        assert f"{key} {value}" not in live_tunables(backend)
    plan = hotcache("plan", spec_for(backend, mode="writeback", tunables=tunables), "--json")
    assert plan.code == 0, plan.out
    steps = plan.json["steps"]
    assert steps and not any(s["destructive"] for s in steps), steps
    assert not any((s["argv"] or [""])[0] in ("mkfs.xfs", "make-bcache", "wipefs")
                   for s in steps), steps
    res = hotcache("apply", spec_for(backend, mode="writeback", tunables=tunables), "--yes")
    assert res.code == 0, res.out
    st = status(backend)
    assert st["cache"]["mode"] == "writeback" and st["mode"] == "writeback"
    live = live_tunables(backend)
    if backend == "bcache":
        assert live == str(value), live
    else:
        assert f"{key} {value}" in live and " writeback " in live, live
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
        if backend == "dm-cache":   # the cached device maps the filesystem on the cache
            dm = f"{dm}-cache"
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
        # The bare origin shows hotcache's header, never the filesystem (no stale mount
        # by `mount -a` or a rescue system); the header says where the filesystem starts.
        probe = sh("blkid", "--probe", "--output", "export", origin, check=False).stdout
        assert "TYPE=xfs" not in probe, probe
        assert sh("mount", "-o", "ro", origin, mp, check=False).returncode != 0
        loop = device = behind_header(origin)
        assert loop, "no hotcache header on the origin"
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
    if backend == "dm-cache":   # hotcache's header, which wipefs does not know, and the
        #                         filesystem's superblock behind it (as `teardown --wipe`)
        sh("dd", "if=/dev/zero", f"of=/dev/disk/by-id/virtio-hdd-part{n}", "bs=1M",
           "count=2", "oflag=direct")
    sh("udevadm", "settle")


def test_prepare_reboot(backend):
    """A writeback cache holding data, some of it dirty, left for the reboot: boot 2
    checks that restore kept it (never zeroing dm-cache's metadata)."""
    first = PROMOTING if backend == "dm-cache" else REBOOT_TUNABLES[backend]
    res = hotcache("apply", spec_for(backend, mode="writeback", tunables=first), "--yes")
    assert res.code == 0, res.out
    folder = data_dir(backend)
    sums = write_files(folder, 30, 128 * 1024, "r")
    (PERSIST / f"sums-r-{backend}.json").write_text(json.dumps(sums))
    for _ in range(4):          # smq promotes blocks read again and again
        drop_caches()
        assert checksums(folder, "r") == sums
    spec = spec_for(backend, mode="writeback", tunables=REBOOT_TUNABLES[backend])
    res = hotcache("apply", spec, "--yes")          # dm-cache: hold dirty blocks from now on
    assert res.code == 0, res.out
    for path in sorted(folder.glob("r*.bin")):      # rewrite cached blocks: dirty, same bytes
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.write(data)
    sh("sync")
    cache = poll("cache use before the reboot", lambda: (c := status(backend)["cache"])
                 ["cache_used_bytes"] and (backend != "dm-cache" or c["dirty_bytes"]) and c,
                 timeout=20)
    (PERSIST / f"cache-before-reboot-{backend}.json").write_text(json.dumps(
        {k: cache[k] for k in ("dirty_bytes", "cache_used_bytes")}))
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


def test_flush_timeout_leaves_the_dirty_cache(monkeypatch):
    """docs/provisioning-and-specs.md: a flush stops at HOTCACHE_FLUSH_TIMEOUT with exit 8,
    and the cache is left in place, never removed while dirty. The origin is a dm-delay
    device whose writes take 4 s, so dm-cache's cleaner cannot write a block back within a 2 s timeout;
    made fast again, the next teardown flushes everything and the origin holds every
    file. Runs on pair 4 once the existing-LV case is done with it."""
    n = EXISTING_LV_PARTITION
    cfg = ["--config", "devices { use_devicesfile=0 }"]
    if sh("vgs", *cfg, "userdata", check=False).returncode == 0:
        sh("vgremove", *cfg, "--yes", "--force", "userdata")
    sh("pvremove", *cfg, "--yes", "--force", "--force", f"{HDD}-part{n}", check=False)
    for disk in (SSD, HDD):
        sh("wipefs", "--all", f"{disk}-part{n}")
    hdd = str(Path(f"{HDD}-part{n}").resolve())
    sectors = int(sh("blockdev", "--getsz", hdd).stdout)
    linear = f"0 {sectors} linear {hdd} 0"
    slow = f"0 {sectors} delay {hdd} 0 0 {hdd} 0 4000"
    sh("dmsetup", "create", "slowhdd", "--uuid", "HOTCACHE-TEST-slowhdd", "--table", linear)
    sh("udevadm", "settle")
    spec = PERSIST / "spec-flush.yaml"
    mp = MOUNTS / "flush"
    # wipe: true: the existing-LV case's XFS is still on the HDD partition 1 MiB in (the
    # LV's first extent), where wipefs of the partition does not look and hotcache does
    spec.write_text(yaml.safe_dump({"version": 1, "caches": [{
        "name": "flush", "backend": "dm-cache",
        "origin": {"path": "/dev/mapper/slowhdd", "wipe": True},
        "cache": f"{SSD}-part{n}", "mode": "writeback",
        "filesystem": {"mountpoint": str(mp)}}]}))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    try:
        kname = os.path.basename(os.path.realpath(status("flush")["cached_device"]))
        dm = Path(f"/sys/class/block/{kname}/dm/name").read_text().strip() + "-cache"
        write_files(mp / "data", 20, 256 * 1024, "f")
        for _ in range(3):                  # promote, so that rewrites land on the SSD
            drop_caches()
            checksums(mp / "data")
        sh("dmsetup", "message", dm, "0", "migration_threshold", "64")   # hold them dirty
        for path in sorted((mp / "data").glob("f*.bin")):
            with open(path, "r+b") as f:
                f.write(os.urandom(256 * 1024))
        sh("sync")
        want = checksums(mp / "data")
        poll("dirty blocks", lambda: status("flush")["cache"]["dirty_bytes"], timeout=15)
        # The origin's writes now take 4 s each (dm-delay flushes queued I/O on reload).
        sh("dmsetup", "suspend", "slowhdd")
        sh("dmsetup", "load", "slowhdd", "--table", slow)
        sh("dmsetup", "resume", "slowhdd")
        monkeypatch.setenv("HOTCACHE_FLUSH_TIMEOUT", "2")
        res = hotcache("teardown", "flush", "--yes")
        assert res.code == 8, res.out
        assert "dirty blocks" in res.out and "NOT removed" in res.out, res.out
        # still there, still dirty, still in the mapping
        st = sh("dmsetup", "status", dm).stdout
        from hotcache.provision.backends.parts.dmtable import parse_status
        assert parse_status(st)["dirty_blocks"] > 0, st
        names = [c["name"] for c in hotcache("status", "--json").json["caches"]]
        assert "flush" in names
        monkeypatch.setenv("HOTCACHE_FLUSH_TIMEOUT", "300")
        sh("dmsetup", "suspend", "slowhdd")
        sh("dmsetup", "load", "slowhdd", "--table", linear)
        sh("dmsetup", "resume", "slowhdd")
        res = hotcache("teardown", "flush", "--yes")
        assert res.code == 0, res.out
        assert sh("dmsetup", "info", dm, check=False).returncode != 0
        bare = Path("/tmp/hcvm-bare-flush")
        bare.mkdir(exist_ok=True)
        loop = behind_header("/dev/mapper/slowhdd")
        assert loop, "no hotcache header on the origin"
        sh("mount", "-o", "ro", loop, bare)
        try:
            assert checksums(bare / "data") == want
        finally:
            sh("umount", bare)
            sh("losetup", "--detach", loop)
    finally:
        sh("umount", mp, check=False)
        if "flush" in [c["name"] for c in hotcache("status", "--json").json["caches"]]:
            sh("dmsetup", "load", "slowhdd", "--table", linear, check=False)
            sh("dmsetup", "resume", "slowhdd", check=False)
            hotcache("teardown", "flush", "--yes")
        sh("dmsetup", "remove", "--retry", "slowhdd", check=False)

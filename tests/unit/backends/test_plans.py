"""Each block-cache backend planned against a fake host (tests/unit/fakehost.py) in four
states: blank disks (a first apply), built and loaded (a second apply finds nothing to
do), built but not loaded (after a reboot: what `hotcache restore` sees), and partially
built (an apply interrupted between steps). The exact plan is asserted: every command's
argv, and the summary of each of hotcache's own steps. The guest-kernel tier (tests/vm)
runs the same backends for real."""

from __future__ import annotations

import uuid

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.engine import bootunit, failoverunit
from hotcache.provision.engine.apply import fstab_options, plan_apply, recorded_spec
from hotcache.provision.engine.restore import plan_restore
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.engine.spec import HostSpec
from hotcache.provision.errors import RefusedError
from hotcache.provision.system import fstab

from tests.unit.fakehost import FakeHost

FS = "11111111-1111-4111-8111-111111111111"      # the filesystem hotcache makes
CSET = "22222222-2222-4222-8222-222222222222"    # the bcache cache set
CACHE_UUID = "33333333-3333-4333-8333-333333333333"
BACKING = "44444444-4444-4444-8444-444444444444"
MP = "/mnt/c1"
HDD_MIB, SSD_MIB = 1024, 256


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTCACHE_UNIT_DIR", str(tmp_path / "units"))
    ids = iter([uuid.UUID(FS), uuid.UUID(CSET)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(ids))
    f = FakeHost(tmp_path / "host")
    f.disk("vdb", "hdd1", HDD_MIB)
    f.disk("vdc", "ssd1", SSD_MIB)
    f.env_ = f.env(tmp_path)
    return f


def spec(backend: str, mode: str = "writethrough") -> HostSpec:
    return HostSpec.model_validate({"caches": [{
        "name": "c1", "backend": backend, "mode": mode,
        "origin": {"path": "/dev/vdb", "wipe": True}, "cache": {"path": "/dev/vdc", "wipe": True},
        "filesystem": {"mountpoint": MP}}]})


def plan(fake, backend: str, mode: str = "writethrough") -> list:
    """The plan of an apply: each step's argv, or the summary of hotcache's own step."""
    return steps(plan_apply(spec(backend, mode), fake.env_))


def steps(p) -> list:
    return [[str(a) for a in s.argv] if s.argv else s.summary for s in p.steps]


def recorded(fake, backend: str, backend_state: dict, target: str, *, state: str = "ready",
             mounted: bool) -> None:
    """The mapping entry (and, once ready, the fstab line and the restore unit) an apply of
    spec(backend) writes; with `mounted`, the filesystem mounted on `target`."""
    env = fake.env_
    s = spec(backend).caches[0]
    devices = {role: {"node": f"/dev/{name}", "path": f"/dev/{name}", "size": mib * 2**20,
                      "by_id": [f"/dev/disk/by-id/virtio-{serial}"],
                      "identity": {"serial": serial}}
               for role, name, serial, mib in (("origin", "vdb", "hdd1", HDD_MIB),
                                               ("cache", "vdc", "ssd1", SSD_MIB))}
    entry = {"backend": backend, "state": state, "mode": "writethrough", "tunables": {},
             "devices": devices, "cached_device": target,
             "filesystem": {"type": "xfs", "uuid": FS, "label": "c1", "mountpoint": MP,
                            "options": ["noatime", "nosuid", "nodev"]},
             "persist": {"fstab": str(env.fstab)}, "backend_state": backend_state,
             "spec": recorded_spec(s)}
    # keys sorted, as yaml.safe_dump writes them (plans follow the devices' order)
    mapping.save(env.state, yaml.safe_load(yaml.safe_dump({"caches": {"c1": entry}})))
    if state != "ready":
        return
    fstab.set_entry(env.fstab, "c1", fstab.entry(FS, MP, "xfs", fstab_options(s)), FS, [MP])
    units = bootunit.unit_dir()
    (units / "local-fs.target.wants").mkdir(parents=True)
    unit = units / bootunit.unit_name("c1")
    unit.write_text(bootunit.unit_text("c1", MP, env.state.absolute(), env.fstab.absolute(),
                                       devices=bootunit.device_paths(s)))
    (units / "local-fs.target.wants" / unit.name).symlink_to(unit)
    if backend in ("dm-cache", "lvmcache"):     # and the fail-over watcher's service
        watcher = units / failoverunit.UNIT
        watcher.write_text(failoverunit.unit_text(env.state.absolute()))
        (units / "multi-user.target.wants").mkdir()
        (units / "multi-user.target.wants" / watcher.name).symlink_to(watcher)
    if mounted:
        fake.mount(target, MP, "noatime", "nosuid", "nodev")


def cached_device(fake, name: str, link: str, *, formatted: bool = True) -> None:
    """The device the backend made (dm-0, bcache0), its /dev link, the filesystem on it."""
    fake.disk(name, None, HDD_MIB, **({"type": "xfs", "uuid": FS} if formatted else {}))
    fake.link(link, f"/dev/{name}")


UNIT = "install and enable {units}/hotcache-restore-c1.service (restores the cache at boot, " \
       "before its mount)"
MKFS = ["mkfs.xfs", "-L", "c1", "-m", f"uuid={FS}", "-s", "size=4096"]
BUILDING = f"record c1 in the mapping as building (filesystem UUID {FS})"
READY = "record c1 in the mapping as ready"
MKDIR = ["mkdir", "--parents", MP]


def mount(target: str) -> list[str]:
    return ["mount", "-t", "xfs", "-o", "noatime,nosuid,nodev", target, MP]


def checked(target: str) -> str:
    return f"check that {target} shows the filesystem {FS} before mounting it"


def fstab_write(fake) -> str:
    return (f"write the entry `UUID={FS} {MP} xfs noatime,nosuid,nodev,nofail,"
            "x-systemd.requires=hotcache-restore-c1.service,"
            f"x-systemd.device-timeout=30s 0 0` to {fake.env_.fstab} (tagged # hotcache:c1)")


WATCHER = "install, enable and start {units}/hotcache-failover.service (switches a cache " \
          "whose SSD failed to its origin, under the mounted filesystem)"


def watcher() -> str:
    return WATCHER.format(units=bootunit.unit_dir())


def first_build_tail(fake, target: str, *, fails_over: bool = False) -> list:
    return [UNIT.format(units=bootunit.unit_dir()), *([watcher()] if fails_over else []),
            [*MKFS, target], MKDIR, mount(target), fstab_write(fake), READY]


# --- bcache ----------------------------------------------------------------------------

BY_UUID = f"/dev/bcache/by-uuid/{BACKING}"
BCACHE_STATE = {"cset_uuid": CSET, "cache_uuid": CACHE_UUID, "backing_uuid": BACKING}
BDEV = "/sys/class/block/vdb/bcache"


def bcache_built(fake, *, registered=True, mounted=True, seq="0.0k", congested=("0", "0")):
    """Both devices carry their bcache superblocks. `registered`: the kernel knows them
    (udev registered them at boot, or apply did), the set attached, the tunables read
    back as `seq` and `congested`."""
    fake.fs("vdc", "bcache", CACHE_UUID)
    fake.fs("vdb", "bcache", BACKING)
    if registered:
        cached_device(fake, "bcache0", BY_UUID)
        fake.sysfs_file(f"{BDEV}/cache_mode", "[writethrough] writeback writearound none")
        fake.sysfs_file(f"{BDEV}/sequential_cutoff", seq)
        fake.sysfs_file(f"{BDEV}/state", "clean")
        fake.sysfs_file(f"/sys/fs/bcache/{CSET}/congested_read_threshold_us", congested[0])
        fake.sysfs_file(f"/sys/fs/bcache/{CSET}/congested_write_threshold_us", congested[1])
        fake.link(f"{BDEV}/cache", f"/sys/fs/bcache/{CSET}")
    recorded(fake, "bcache", BCACHE_STATE, BY_UUID, mounted=mounted and registered)


def test_bcache_blank_disks(fake):
    new = "/dev/bcache/by-uuid/<new backing UUID>"
    assert plan(fake, "bcache") == [
        BUILDING,
        ["wipefs", "--all", "/dev/vdc"],
        ["make-bcache", "-C", "--bucket", "256k", "--block", "4k", "--cset-uuid", CSET,
         "/dev/vdc"],
        ["wipefs", "--all", "/dev/vdb"],
        ["make-bcache", "-B", "--block", "4k", "/dev/vdb"],
        "record the cache set and backing device UUIDs in the mapping",
        "register /dev/vdc and /dev/vdb with the kernel (udev may have done it already)",
        f"attach the backing device to cache set {CSET}",
        "wait for udev's /dev/bcache/by-uuid link",
        ["wipefs", "--all", new],
        "set bcache cache_mode to writethrough",
        "set bcache sequential_cutoff to 0",
        "set bcache congested_read_threshold_us to 0",
        "set bcache congested_write_threshold_us to 0",
        *first_build_tail(fake, new),
    ]
    assert not fake.env_.state.exists()      # planning changed nothing


def test_bcache_mode_change_is_one_sysfs_write(fake):
    bcache_built(fake)
    assert plan(fake, "bcache", "writeback") == ["set bcache cache_mode to writeback", READY]


def test_bcache_after_a_reboot_udev_registered_it_restore_writes_the_lost_tunables(fake):
    """bcache keeps only the cache mode in its superblock: the kernel's defaults are back."""
    bcache_built(fake, mounted=False, seq="4.0M", congested=("2000", "20000"))
    assert steps(plan_restore(fake.env_)) == [
        "set bcache sequential_cutoff to 0",
        "set bcache congested_read_threshold_us to 0",
        "set bcache congested_write_threshold_us to 0",
        MKDIR, mount(BY_UUID), READY,
    ]


# What it takes to bring up a bcache whose superblocks exist: register, attach, tunables.
BRING_UP = [
    "register /dev/vdc and /dev/vdb with the kernel (udev may have done it already)",
    f"attach the backing device to cache set {CSET}",
    "wait for udev's /dev/bcache/by-uuid link",
    "set bcache cache_mode to writethrough",
    "set bcache sequential_cutoff to 0",
    "set bcache congested_read_threshold_us to 0",
    "set bcache congested_write_threshold_us to 0",
]


def test_bcache_after_a_reboot_not_registered_restore_registers_and_never_formats(fake):
    bcache_built(fake, registered=False)
    assert steps(plan_restore(fake.env_)) == [
        *BRING_UP,
        checked(BY_UUID), MKDIR, mount(BY_UUID), READY,
    ]


def test_bcache_interrupted_after_make_bcache_resumes_without_making_it_again(fake):
    """Killed after both superblocks and their UUIDs were recorded, before registering:
    the next apply registers, attaches and formats; no wipefs, no make-bcache."""
    fake.fs("vdc", "bcache", CACHE_UUID)
    fake.fs("vdb", "bcache", BACKING)
    recorded(fake, "bcache", BCACHE_STATE, BY_UUID, state="building", mounted=False)
    assert plan(fake, "bcache") == [
        BUILDING,
        *BRING_UP,
        *first_build_tail(fake, BY_UUID),
    ]


# --- dm-cache --------------------------------------------------------------------------

DM_NAMES = {"cache": "hc-c1", "meta": "hc-c1-meta", "data": "hc-c1-data"}
# cache_metadata_size answers 8192 sectors (4 MiB); the rest of 256 MiB is 64 KiB blocks
DM_STATE = {"block_sectors": 128, "meta_sectors": 8192, "data_sectors": 516096,
            "names": DM_NAMES}
META = ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vdc 0"]
DATA = ["dmsetup", "create", "hc-c1-data", "--table", "0 516096 linear /dev/vdc 8192"]
DM_TABLE = ("0 2097152 cache /dev/mapper/hc-c1-meta /dev/mapper/hc-c1-data /dev/vdb 128 1 "
            "{mode} smq 0")


def dm_built(fake, *, loaded=True, tables=("meta", "data", "cache")):
    """A built dm-cache: the origin passes its XFS through. `loaded`: the `tables` are
    loaded (the SSD held by the meta and data maps), the filesystem mounted."""
    fake.fs("vdb", "xfs", FS)
    if loaded:
        for i, part in enumerate(("cache", "meta", "data")):
            if part not in tables:
                continue
            fake.tables[DM_NAMES[part]] = (DM_TABLE.format(mode="writethrough")
                                           if part == "cache" else
                                           f"0 {DM_STATE[part + '_sectors']} linear 254:32 0")
            if part != "cache":
                fake.sysfs_file(f"/sys/class/block/dm-{i}/dm/name", DM_NAMES[part])
                fake.sysfs_file(f"/sys/class/block/vdc/holders/dm-{i}", "")
        if "cache" in tables:
            cached_device(fake, "dm-0", "/dev/mapper/hc-c1")
    recorded(fake, "dm-cache", DM_STATE, "/dev/mapper/hc-c1",
             mounted=loaded and "cache" in tables)


def test_dmcache_blank_disks(fake):
    """hotcache's header takes the SSD's first 4 KiB (8 sectors); the maps follow it.
    Another takes the origin's first MiB: the cache device covers the whole origin, the
    top device maps the filesystem from 1 MiB in (test_dmcache_layout.py). A cache
    recorded without headers, DM_STATE, keeps its maps at 0 and its cache table as the
    top device."""
    assert plan(fake, "dm-cache") == [
        BUILDING,
        "write hotcache's header (cache c1, a new UUID) in the first 1 MiB of the origin, "
        "before the filesystem: the bare origin never shows a filesystem to mount without "
        "the cache, and the UUID proves which cache the origin is",
        ["wipefs", "--all", "/dev/vdc"],
        "write hotcache's header (cache c1, a new UUID) in the first 4 KiB of the SSD: it "
        "proves which cache the SSD is, where serials can follow the slot",
        ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vdc 8"],
        ["dmsetup", "create", "hc-c1-data", "--table", "0 515968 linear /dev/vdc 8200"],
        ["dd", "if=/dev/zero", "of=/dev/mapper/hc-c1-meta", "bs=4096", "count=1",
         "oflag=direct"],
        ["dmsetup", "create", "hc-c1-cache", "--table", DM_TABLE.format(mode="writethrough")],
        ["dmsetup", "create", "hc-c1", "--table",
         "0 2095104 linear /dev/mapper/hc-c1-cache 2048"],
        ["wipefs", "--all", "/dev/mapper/hc-c1"],
        "record the dm-cache geometry and table names in the mapping",
        *first_build_tail(fake, "/dev/mapper/hc-c1", fails_over=True),
    ]


def test_dmcache_mode_change_reloads_the_table_in_place(fake):
    dm_built(fake)
    assert plan(fake, "dm-cache", "writeback") == [
        ["dmsetup", "reload", "hc-c1", "--table", DM_TABLE.format(mode="writeback")],
        ["dmsetup", "resume", "hc-c1"],
        READY,
    ]


def test_dmcache_after_a_reboot_restore_loads_the_same_tables_without_zeroing(fake):
    """Raw tables are gone after a boot: the same geometry again, no wipefs, no dd, no
    mkfs; the filesystem UUID is checked before the mount."""
    dm_built(fake, loaded=False)
    assert steps(plan_restore(fake.env_)) == [
        META, DATA,
        ["dmsetup", "create", "hc-c1", "--table", DM_TABLE.format(mode="writethrough")],
        checked("/dev/mapper/hc-c1"), MKDIR, mount("/dev/mapper/hc-c1"), READY,
    ]


def test_dmcache_interrupted_before_the_cache_table_creates_only_that(fake):
    """Killed after the meta and data maps were created (the geometry recorded, state
    `building`): the next apply loads the cache table; the metadata is not zeroed again."""
    fake.tables["hc-c1-meta"] = "0 8192 linear 254:32 0"
    fake.tables["hc-c1-data"] = "0 516096 linear 254:32 8192"
    fake.sysfs_file("/sys/class/block/dm-1/dm/name", "hc-c1-meta")
    fake.sysfs_file("/sys/class/block/dm-2/dm/name", "hc-c1-data")
    fake.sysfs_file("/sys/class/block/vdc/holders/dm-1", "")
    fake.sysfs_file("/sys/class/block/vdc/holders/dm-2", "")
    recorded(fake, "dm-cache", DM_STATE, "/dev/mapper/hc-c1", state="building", mounted=False)
    assert plan(fake, "dm-cache") == [
        BUILDING,
        ["dmsetup", "create", "hc-c1", "--table", DM_TABLE.format(mode="writethrough")],
        *first_build_tail(fake, "/dev/mapper/hc-c1", fails_over=True),
    ]


# --- lvmcache --------------------------------------------------------------------------

NOFILE = ["--config", "devices { use_devicesfile=0 }"]   # the fake host has no devices file
LV_STATE = {"vg": "hc_c1", "origin_lv": "data", "adopted": False}


def lv_row(*, cached: bool, active: bool) -> dict:
    attr = ("C" if cached else "-") + "wi-" + ("a" if active else "-") + "o" \
        + ("C" if cached else "-") + "---"
    return {"lv_name": "data", "lv_attr": attr, "segtype": "cache" if cached else "linear",
            "cache_mode": "writethrough" if cached else "", "cache_policy": "smq" if cached else "",
            "kernel_cache_settings": ""}


def lvm_built(fake, *, active=True, cached=True, state="ready"):
    """Both disks are PVs of hc_c1 and data is an LV on the origin; `cached`: the cache
    volume is attached; `active`: activated (its /dev link there, the filesystem mounted)."""
    for name in ("vdb", "vdc"):
        fake.fs(name, "LVM2_member", f"pv-{name}")
        fake.pvs[f"/dev/{name}"] = "hc_c1"
    fake.lvs["hc_c1/data"] = lv_row(cached=cached, active=active)
    if cached:
        fake.lvs["hc_c1/data_hccache"] = {"lv_name": "data_hccache"}
    if active:
        cached_device(fake, "dm-0", "/dev/hc_c1/data", formatted=state == "ready")
    recorded(fake, "lvmcache", LV_STATE, "/dev/hc_c1/data", state=state,
             mounted=active and state == "ready")


def test_lvmcache_blank_disks_every_lvm_command_is_non_prompting(fake):
    assert plan(fake, "lvmcache") == [
        BUILDING,
        ["wipefs", "--all", "/dev/vdb"],
        ["wipefs", "--all", "/dev/vdc"],
        ["pvcreate", *NOFILE, "--yes", "/dev/vdb", "/dev/vdc"],
        ["vgcreate", *NOFILE, "--yes", "hc_c1", "/dev/vdb", "/dev/vdc"],
        ["lvcreate", *NOFILE, "--yes", "--name", "data", "--extents", "100%PVS", "hc_c1",
         "/dev/vdb"],
        "record volume group hc_c1 in the mapping",
        ["lvcreate", *NOFILE, "--yes", "--name", "data_hccache", "--extents", "100%PVS",
         "hc_c1", "/dev/vdc"],
        ["lvconvert", *NOFILE, "--yes", "--type", "cache", "--cachevol", "hc_c1/data_hccache",
         "--cachemode", "writethrough", "--cachepolicy", "smq", "hc_c1/data"],
        "record the PV, VG and LV UUIDs in the mapping (a later restore or teardown "
        "checks them)",
        *first_build_tail(fake, "/dev/hc_c1/data", fails_over=True),
    ]


def test_lvmcache_mode_change_in_place(fake):
    lvm_built(fake)
    assert plan(fake, "lvmcache", "writeback") == [
        ["lvchange", *NOFILE, "--yes", "--cachemode", "writeback", "hc_c1/data"],
        READY,
    ]


def test_lvmcache_after_a_reboot_restore_activates_the_volume_group(fake):
    lvm_built(fake, active=False)
    assert steps(plan_restore(fake.env_)) == [
        ["vgchange", *NOFILE, "--activate", "y", "hc_c1"],
        checked("/dev/hc_c1/data"), MKDIR, mount("/dev/hc_c1/data"), READY,
    ]


def test_lvmcache_interrupted_before_the_cache_was_attached_attaches_it(fake):
    """Killed after the origin LV was made, before the cache volume: the next apply
    creates and attaches it and formats the LV; no pvcreate, vgcreate or wipefs. The PV,
    VG and LV UUIDs, which the killed run never recorded, are recorded now."""
    lvm_built(fake, cached=False, state="building")
    assert plan(fake, "lvmcache") == [
        BUILDING,
        ["lvcreate", *NOFILE, "--yes", "--name", "data_hccache", "--extents", "100%PVS",
         "hc_c1", "/dev/vdc"],
        ["lvconvert", *NOFILE, "--yes", "--type", "cache", "--cachevol", "hc_c1/data_hccache",
         "--cachemode", "writethrough", "--cachepolicy", "smq", "hc_c1/data"],
        "record the PV, VG and LV UUIDs in the mapping (a later restore or teardown "
        "checks them)",
        *first_build_tail(fake, "/dev/hc_c1/data", fails_over=True),
    ]


# --- every backend -----------------------------------------------------------------------

@pytest.mark.parametrize("backend, built", [("bcache", bcache_built), ("dm-cache", dm_built),
                                            ("lvmcache", lvm_built)])
def test_built_and_loaded_a_second_apply_plans_nothing(fake, backend, built):
    built(fake)
    assert plan(fake, backend) == []


@pytest.mark.parametrize("backend", ["bcache", "dm-cache", "lvmcache"])
def test_a_foreign_signature_is_refused_before_any_step(fake, backend):
    """Without `wipe: true`, an ext4 on the origin is refused, nothing planned or run."""
    fake.fs("vdb", "ext4", "55555555-5555-4555-8555-555555555555")
    no_wipe = spec(backend).model_dump(mode="json", exclude_none=True)
    no_wipe["caches"][0]["origin"] = {"path": "/dev/vdb"}
    with pytest.raises(RefusedError) as err:
        plan_apply(HostSpec.model_validate(no_wipe), fake.env_)
    assert "c1.origin (/dev/vdb): it carries signatures (ext4)" in str(err.value)
    assert fake.runner.recorded == [] and not fake.env_.state.exists()


@pytest.mark.parametrize("backend", ["bcache", "dm-cache", "lvmcache"])
def test_a_probe_the_fake_host_cannot_answer_fails_the_plan(fake, backend):
    """The fake host fails closed: a probe it has no answer for is an error, never blank."""
    fake.runner.failing.add("wipefs")
    with pytest.raises(Exception) as err:
        plan(fake, backend)
    assert "wipefs" in str(err.value)


def test_the_fake_host_has_no_answer_for_an_unknown_probe(fake):
    with pytest.raises(AssertionError, match="no answer"):
        fake.runner.query(["lsblk", "--json"])
    with pytest.raises(AssertionError, match="no answer"):
        fake.runner.query(["lvs", "--select", "lv_kernel_major=254"])


def test_bcache_teardown_unmounts_detaches_stops_and_unregisters_in_that_order(fake):
    bcache_built(fake)
    env = fake.env_
    assert steps(plan_teardown("c1", env)) == [
        ["umount", MP],
        "detach the cache set (bcache first writes every dirty block back to the origin) "
        "and wait for state `no cache`",
        "stop the bcache device on /dev/vdb",
        f"unregister cache set {CSET} (only once no backing device is attached)",
        f"remove the boot-time restore unit {bootunit.unit_dir()}/hotcache-restore-c1.service",
        f"remove the entry of c1 from {env.fstab} (only a line that mounts its UUID on {MP} "
        "goes with its marker)",
        f"remove c1 from the mapping {env.state}",
    ]


def test_bcache_teardown_of_a_cache_not_registered_is_refused(fake):
    """After a boot before restore: nothing to flush through, so nothing is touched."""
    bcache_built(fake, registered=False)
    with pytest.raises(RefusedError, match="not registered with the kernel"):
        plan_teardown("c1", fake.env_)
    assert fake.runner.recorded == []

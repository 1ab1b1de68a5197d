"""Devices found by identity, planned against a fake host (docs/safety.md): after the disks change order,
every command finds each device by its recorded identity (or refuses, naming both
devices); `wipe: true` is never replayed; a recorded dm-cache is never zeroed and a
recorded filesystem never formatted; a cache that is not live is never torn down."""

from __future__ import annotations

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.backends.parts.recorded import locate
from hotcache.provision.backends.dmcache import DmCache
from hotcache.provision.engine.apply import Device, plan_apply
from hotcache.provision.engine.restore import plan_restore
from hotcache.provision.engine.spec import DeviceRef, HostSpec
from hotcache.provision.records import CacheEntry
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.errors import ExitCode, HotcacheError, RefusedError

from tests.unit.fakehost import install

FS = "11111111-2222-3333-4444-555555555555"
SPEC = {"name": "c1", "backend": "dm-cache", "mode": "writeback",
        "origin": {"path": "/dev/vdc", "wipe": True}, "cache": {"path": "/dev/vda", "wipe": True},
        "filesystem": {"mountpoint": "/mnt/c1"}}
GEOMETRY = {"block_sectors": 128, "meta_sectors": 8192, "data_sectors": 122880,
            "names": {"cache": "hc-c1", "meta": "hc-c1-meta", "data": "hc-c1-data"}}


def dev(node, serial, mib, **extra):
    return {"node": node, "path": node, "size": mib * 2**20,
            "by_id": [f"/dev/disk/by-id/virtio-{serial}"], "identity": {"serial": serial},
            **extra}


def entry(name="c1", spec=None, state="ready", devices=None, backend_state=None, fs=FS):
    spec = dict(spec or SPEC, name=name, filesystem={"mountpoint": f"/mnt/{name}"})
    return {"backend": spec["backend"], "state": state, "mode": spec.get("mode"),
            "devices": devices or {"origin": dev("/dev/vdc", "hdd1", 1024),
                                   "cache": dev("/dev/vda", "ssd1", 64)},
            "cached_device": f"/dev/mapper/hc-{name}",
            "filesystem": {"type": "xfs", "uuid": fs, "mountpoint": f"/mnt/{name}"},
            "persist": {"fstab": None},
            "backend_state": backend_state if backend_state is not None else
            {**GEOMETRY, "names": {k: v.replace("c1", name) for k, v in GEOMETRY["names"].items()}},
            "spec": spec}


@pytest.fixture
def host(monkeypatch, tmp_path):
    return install(monkeypatch, tmp_path)


@pytest.fixture
def env(host, tmp_path):
    return host.env(tmp_path)


def save(env, **caches):
    # keys sorted, as yaml.safe_dump writes them (plans follow the devices' order)
    mapping.save(env.state, yaml.safe_load(yaml.safe_dump({"caches": caches})))


def argvs(plan):
    return [[str(a) for a in step.argv] for step in plan.steps if step.argv]


# --- the disks changed order ----------------------------------------------------------

def test_restore_after_the_ssd_names_swap_uses_each_cache_its_own_ssd(host, env):
    """Two dm-cache caches whose SSDs swapped names: each loads its tables on its own SSD
    (found by serial), never the other cache's metadata."""
    host.disk("vda", "ssd2", 64)          # c1's SSD was vda; it is vdb now
    host.disk("vdb", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    host.disk("vdd", "hdd2", 1024, type="xfs", uuid=FS.replace("1", "7"))
    c2 = entry("c2", spec=dict(SPEC, origin={"path": "/dev/vdd"}, cache={"path": "/dev/vdb"}),
               devices={"origin": dev("/dev/vdd", "hdd2", 1024),
                        "cache": dev("/dev/vdb", "ssd2", 64)}, fs=FS.replace("1", "7"))
    save(env, c1=entry(), c2=c2)
    plan = plan_restore(env)
    assert argvs(plan) == [
        ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vdb 0"],
        ["dmsetup", "create", "hc-c1-data", "--table", "0 122880 linear /dev/vdb 8192"],
        ["dmsetup", "create", "hc-c1", "--table",
         "0 2097152 cache /dev/mapper/hc-c1-meta /dev/mapper/hc-c1-data /dev/vdc 128 1 "
         "writeback smq 0"],
        ["mkdir", "--parents", "/mnt/c1"],
        ["mount", "-t", "xfs", "-o", "noatime,nosuid,nodev", "/dev/mapper/hc-c1", "/mnt/c1"],
        ["dmsetup", "create", "hc-c2-meta", "--table", "0 8192 linear /dev/vda 0"],
        ["dmsetup", "create", "hc-c2-data", "--table", "0 122880 linear /dev/vda 8192"],
        ["dmsetup", "create", "hc-c2", "--table",
         "0 2097152 cache /dev/mapper/hc-c2-meta /dev/mapper/hc-c2-data /dev/vdd 128 1 "
         "writeback smq 0"],
        ["mkdir", "--parents", "/mnt/c2"],
        ["mount", "-t", "xfs", "-o", "noatime,nosuid,nodev", "/dev/mapper/hc-c2", "/mnt/c2"],
    ]
    assert any("/dev/vda now names" in n and "/dev/vdb" in n for n in plan.notes), plan.notes


def test_restore_refuses_naming_both_when_a_bystander_took_the_ssd_name(host, env):
    """The bcache SSD is gone and an ext4 disk now carries its name: restore plans
    nothing (no wipefs, no make-bcache) and names both devices."""
    host.disk("vda", "bystander", 64, type="ext4", uuid="e4e4")
    host.disk("vdc", "hdd1", 1024, type="bcache", uuid="bdev-uuid")
    spec = dict(SPEC, backend="bcache")
    save(env, c1=entry(spec=spec, backend_state={
        "cset_uuid": "cset", "cache_uuid": "cache-uuid", "backing_uuid": "bdev-uuid"}))
    with pytest.raises(RefusedError) as err:
        plan_restore(env)
    text = str(err.value)
    assert "/dev/vda now names /dev/vda" in text and "serial bystander" in text, text
    assert "virtio-ssd1" in text and "not present under any name" in text, text
    assert err.value.exit_code == ExitCode.REFUSED
    assert host.runner.recorded == []


def test_a_device_of_size_zero_is_not_probed_while_looking_for_a_missing_one(host, env,
                                                                          monkeypatch):
    """The SSD is gone: every device that could be it is read, but a loop device with no
    image (size 0) holds nothing, and reading it would only cost a blkid per loop
    device on every command."""
    host.disk("vdc", "hdd1", 1024, type="bcache", uuid="bdev-uuid")
    host.disk("vdb", None, 64)          # no serial, the SSD's size: it could be the SSD
    host.disk("loop0", None, 0)
    spec = dict(SPEC, backend="bcache")
    save(env, c1=entry(spec=spec, backend_state={
        "cset_uuid": "cset", "cache_uuid": "cache-uuid", "backing_uuid": "bdev-uuid"}))
    asked, query = [], host.runner.query

    def recording(argv, **kwargs):
        asked.append([str(a) for a in argv])
        return query(argv, **kwargs)

    monkeypatch.setattr(host.runner, "query", recording)
    found = locate(mapping.load(env.state)["caches"]["c1"], "cache", host)
    assert found.node is None, found
    probed = {argv[-1] for argv in asked if argv[0] == "blkid"}
    assert "/dev/vdb" in probed and "/dev/loop0" not in probed, probed


def test_apply_of_a_built_cache_never_replays_wipe(host, env):
    """The spec still says `wipe: true`; the disk its by-id link names now carries a
    filesystem hotcache did not write: refused, nothing planned."""
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="ext4", uuid="e4e4")   # replaced by another fs
    save(env, c1=entry())
    with pytest.raises(RefusedError) as err:
        plan_apply(HostSpec.model_validate({"caches": [SPEC]}), env)
    assert "ext4 e4e4, hotcache wrote xfs" in str(err.value)
    assert host.runner.recorded == []


def test_wipe_is_consent_for_the_first_build_only(host, env):
    """Even where no hotcache signature was recorded to compare (so identity alone proves
    the disk), a built cache's `wipe: true` does not erase what is on it now."""
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="ext4", uuid="e4e4")
    spec = dict(SPEC, backend="bcache")
    save(env, c1=entry(spec=spec, backend_state={}))
    with pytest.raises(RefusedError) as err:
        plan_apply(HostSpec.model_validate({"caches": [spec]}), env)
    assert "consent for the first build only" in str(err.value), str(err.value)
    assert host.runner.recorded == []


def test_restore_of_an_unfinished_build_is_refused(host, env):
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="ext4", uuid="e4e4")
    save(env, c1=entry(state="building"))
    with pytest.raises(RefusedError) as err:
        plan_restore(env)
    assert "did not finish (state 'building')" in str(err.value)
    assert "hotcache apply" in str(err.value)


def test_an_entry_without_identities_is_found_by_its_by_id_link_and_gets_them(host, env):
    """Mappings written before identities were recorded: the by-id link finds the
    device, and the next restore records the rest."""
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    old = entry()
    for info in old["devices"].values():
        info.pop("identity")
    old["devices"]["cache"]["node"] = old["devices"]["cache"]["path"] = "/dev/vdq"
    save(env, c1=old)
    plan = plan_restore(env)
    assert argvs(plan)[0] == ["dmsetup", "create", "hc-c1-meta", "--table",
                              "0 8192 linear /dev/vda 0"]
    assert plan.steps[-1].summary == "record c1 in the mapping as ready"


# --- a recorded dm-cache is never zeroed, its filesystem never re-made --------

def test_dm_cache_restore_never_zeroes_metadata_or_formats(host, env):
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    save(env, c1=entry())
    flat = [a for argv in argvs(plan_restore(env)) for a in argv]
    assert not {"dd", "wipefs", "mkfs.xfs"} & set(flat), flat


def test_dm_cache_apply_resuming_a_build_keeps_recorded_metadata(host, env):
    """state `building` with the geometry recorded (the tables were made): an apply
    that resumes it loads the same tables, it does not zero the metadata again."""
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024)
    save(env, c1=entry(state="building"))
    plan = plan_apply(HostSpec.model_validate({"caches": [SPEC]}), env)
    names = [argv[0] for argv in argvs(plan)]
    assert "dd" not in names and "wipefs" not in names, argvs(plan)
    assert names[:3] == ["dmsetup"] * 3


def test_dm_cache_restore_with_a_failing_blkid_is_an_error(host, env):
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    save(env, c1=entry())
    host.runner.failing.add("blkid")
    with pytest.raises(HotcacheError) as err:
        plan_restore(env)
    assert err.value.exit_code == ExitCode.COMMAND_FAILED and "blkid" in str(err.value)
    assert host.runner.recorded == []


def test_dm_cache_owns_no_signature_less_device_it_cannot_prove(host):
    cache = Device("cache", DeviceRef(path="/dev/vdb"), "/dev/vdb", True, 64 * 2**20)
    recorded = CacheEntry.model_validate(entry())
    assert DmCache(host).owns(recorded, cache) is False          # any blank SSD used to pass
    cache.proven = True
    assert DmCache(host).owns(recorded, cache) is True


# --- a cache that is not live is never torn down -------------------------------

def test_teardown_of_a_dm_cache_without_tables_is_refused_with_the_fix(host, env):
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    save(env, c1=entry())
    with pytest.raises(RefusedError) as err:
        plan_teardown("c1", env, wipe=True)
    assert "not live" in str(err.value) and "hotcache restore c1" in str(err.value)
    assert "c1" in yaml.safe_load(env.state.read_text())["caches"]


def test_teardown_of_a_live_dm_cache_flushes_before_removing(host, env):
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    host.tables["hc-c1"] = ("0 2097152 cache 254:1 254:2 254:3 128 1 writeback smq 2 "
                            "migration_threshold 0")
    host.tables["hc-c1-meta"] = "0 8192 linear 254:0 0"
    host.tables["hc-c1-data"] = "0 122880 linear 254:0 8192"
    save(env, c1=entry())
    plan = plan_teardown("c1", env, wipe=True)
    summaries = [s.summary for s in plan.steps]
    assert argvs(plan) == [
        ["dmsetup", "reload", "hc-c1", "--table",
         "0 2097152 cache 254:1 254:2 254:3 128 1 writeback cleaner 0"],
        ["dmsetup", "resume", "hc-c1"],
        ["dmsetup", "remove", "--retry", "hc-c1"],
        ["dmsetup", "remove", "--retry", "hc-c1-data"],
        ["dmsetup", "remove", "--retry", "hc-c1-meta"],
        ["wipefs", "--all", "/dev/vda"],      # the SSD and the origin, found by serial
        ["wipefs", "--all", "/dev/vdc"],
    ]
    check = summaries.index(next(s for s in summaries if s.startswith("check that the loaded")))
    wait = summaries.index("wait until the cache holds 0 dirty blocks")
    assert check < wait < summaries.index("remove the cache device")
    assert summaries[-1].startswith("remove c1 from the mapping")


def test_forget_says_what_is_lost_and_touches_no_device(host, env):
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    save(env, c1=entry())
    plan = plan_teardown("c1", env, forget=True)
    assert argvs(plan) == []
    lost = "\n".join(plan.notes)
    assert "writeback" in lost and "dm-cache geometry" in lost and "8192" in lost
    host.tables["hc-c1"] = "0 2097152 cache 254:1 254:2 254:3 128 1 writeback smq 0"
    with pytest.raises(RefusedError, match="is live"):
        plan_teardown("c1", env, forget=True)


def test_a_writeback_origin_whose_superblock_is_only_in_the_cache_is_still_found(host, env):
    """The block holding the XFS superblock may be dirty on the SSD only: a blank origin,
    proven by its serial, is restored (its tables loaded, the UUID checked before the
    mount); an origin showing another filesystem is not."""
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024)
    save(env, c1=entry())
    plan = plan_restore(env)
    assert argvs(plan)[2][:3] == ["dmsetup", "create", "hc-c1"]
    assert any(s.summary.startswith("check that /dev/mapper/hc-c1 shows the filesystem")
               for s in plan.steps)


# --- lvmcache: the PVs hotcache made are found by their PV UUIDs ------------------------

def test_lvmcache_pv_whose_uuid_differs_is_refused_by_restore_and_teardown(host, env,
                                                                           monkeypatch):
    """The SSD hotcache made a PV (recorded PV UUID) now carries another PV (another
    host's disk moved in under the same serial-less name, or a re-pvcreate): restore and
    teardown --wipe refuse it, naming both UUIDs, and plan nothing."""
    from hotcache.provision.backends import lvmcache

    host.disk("vda", "ssd1", 64, type="LVM2_member", uuid="PV-someone-else")
    host.disk("vdc", "hdd1", 1024, type="LVM2_member", uuid="PV-hdd")
    spec = dict(SPEC, backend="lvmcache")
    save(env, c1=entry(spec=spec, backend_state={
        "vg": "hc_c1", "origin_lv": "data", "adopted": False, "vg_uuid": "VG", "lv_uuid": "LV",
        "pv_uuids": {"origin": "PV-hdd", "cache": "PV-ssd"}}))
    monkeypatch.setattr(lvmcache, "lv_info", lambda runner, vg, lv: {
        "lv_name": "data", "lv_attr": "Cwi-aoC---", "segtype": "cache", "cache_mode":
        "writeback", "cache_policy": "smq", "vg_uuid": "VG", "lv_uuid": "LV"})
    before = env.state.read_bytes()
    for attempt in (lambda: plan_restore(env), lambda: plan_teardown("c1", env, wipe=True)):
        with pytest.raises(RefusedError) as err:
            attempt()
        text = str(err.value)
        assert "LVM2_member PV-someone-else, hotcache wrote LVM2_member PV-ssd" in text, text
        assert err.value.exit_code == ExitCode.REFUSED
    assert host.runner.recorded == [] and env.state.read_bytes() == before
    # the recorded PV back under its name: the same teardown goes ahead
    host.disks["vda"].sig["UUID"] = "PV-ssd"
    monkeypatch.setattr(lvmcache, "pv_vg", lambda runner, node: "hc_c1")
    plan = plan_teardown("c1", env, wipe=True)
    assert ["wipefs", "--all", "/dev/vda"] in argvs(plan)


# --- udev's properties ----------------------------------------------------------------

def test_udev_properties_name_the_device_before_sysfs(host):
    """WWN, serial and partition UUID come from udev's properties (the host's
    udev_properties), sysfs's serial only where udev has none; a recorded WWN that
    udev now reports differently proves another disk."""
    from hotcache.provision.block import identity

    host.disk("vdb", "sysfs-serial", 64)
    assert identity.hardware("vdb", host)[1] == {"serial": "sysfs-serial"}
    host.udev["vdb"] = {"ID_SERIAL_SHORT": "udev-serial", "ID_WWN": "0x5000c500a1b2c3d4",
                        "ID_PART_ENTRY_UUID": "0a1b2c3d-01"}
    seen = identity.probe("vdb", host, signatures=False)
    assert seen.identity == {"serial": "udev-serial", "wwn": "0x5000c500a1b2c3d4",
                             "partuuid": "0a1b2c3d-01"}
    recorded = {"size": 64 * 2**20, "identity": {"wwn": "0x5000c500ffffffff"}}
    assert identity.compare(recorded, seen).conflicts == \
        ["wwn 0x5000c500a1b2c3d4, recorded 0x5000c500ffffffff"]


def test_a_real_hosts_udev_properties_come_through_libudev():
    """On the machine itself, pyudev (libudev) answers for every block device: the
    properties name the device and its device number as sysfs does."""
    import os

    from hotcache.provision.block.host import Host

    real = Host()
    names = sorted(os.listdir("/sys/class/block"))
    assert names, "no block device on this machine"
    for name in names[:4]:
        props = real.udev_properties(name)
        dev = open(f"/sys/class/block/{name}/dev").read().strip()
        assert props["DEVNAME"] == f"/dev/{name}" and f"{props['MAJOR']}:{props['MINOR']}" == dev
    assert real.udev_properties("no-such-device") == {}

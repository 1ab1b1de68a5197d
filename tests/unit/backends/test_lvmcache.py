"""lvmcache plans against a fake host: every lvm2 command that changes something is
planned with --yes (lvconvert and friends ask questions, and a prompt hangs apply), and
each step's argv is the exact one that runs. The real lvm2 runs it in the guest tier."""

from __future__ import annotations

import pytest

from hotcache.provision.backends import lvmcache
from hotcache.provision.engine.apply import Device, Planner
from hotcache.provision.plan import Plan
from hotcache.provision.engine.spec import CacheSpec

from tests.helpers import entry_record
from tests.unit.fakehost import FakeHost

CHANGES = ("pvcreate", "vgcreate", "vgextend", "lvcreate", "lvconvert", "lvchange",
           "vgreduce", "pvremove")


def lvm_host(tmp_path, lvs: dict[str, dict] | None = None,
             pvs: dict[str, str] | None = None) -> FakeHost:
    """A fake host whose lvm2 reports show `lvs` ("vg/lv" -> row) and `pvs` (node -> vg)."""
    host = FakeHost(tmp_path / "host")
    host.lvs, host.pvs = lvs or {}, pvs or {}
    return host


def planner(tmp_path, host) -> Planner:
    return Planner(host.env(tmp_path), "c1", Plan())


def device(role: str, node: str) -> Device:
    from hotcache.provision.engine.spec import DeviceRef

    return Device(role, DeviceRef(path=node), node, True, 2**30)


def spec(**extra) -> CacheSpec:
    return CacheSpec.model_validate({"name": "c1", "backend": "lvmcache", "origin": "/dev/hdd",
                                     "cache": "/dev/ssd", "filesystem": {"mountpoint": "/mnt/c1"},
                                     **extra})


def argvs(p: Planner) -> list[list[str]]:
    return [[str(a) for a in s.argv] for s in p.plan.steps if s.argv]


def tail(argv: list[str]) -> list[str]:
    """The arguments after the command, without the devices-file --config pair."""
    return [x for x in argv if x not in ("--config", "devices { use_devicesfile=0 }")][1:]


def assert_never_prompts(steps: list[list[str]]) -> None:
    changing = [a for a in steps if a[0] in CHANGES]
    assert changing
    for argv in changing:
        assert "--yes" in argv, argv


@pytest.fixture(autouse=True)
def units(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTCACHE_UNIT_DIR", str(tmp_path / "units"))


def test_a_first_build_plans_every_lvm_command_with_yes(tmp_path):
    host = lvm_host(tmp_path)
    p = planner(tmp_path, host)
    node = lvmcache.LvmCache(host).build(p, spec(tunables={"migration_threshold": 4096}), None,
                                     {"origin": device("origin", "/dev/hdd"),
                                      "cache": device("cache", "/dev/ssd")})
    assert node == "/dev/hc_c1/data"
    steps = argvs(p)
    assert [a[0] for a in steps] == ["wipefs", "wipefs", "pvcreate", "vgcreate", "lvcreate",
                                     "lvcreate", "lvconvert"]
    assert_never_prompts(steps)
    assert tail(steps[2]) == ["--yes", "/dev/hdd", "/dev/ssd"]
    assert tail(steps[3]) == ["--yes", "hc_c1", "/dev/hdd", "/dev/ssd"]
    assert tail(steps[4]) == ["--yes", "--name", "data", "--extents", "100%PVS", "hc_c1", "/dev/hdd"]
    assert tail(steps[5]) == ["--yes", "--name", "data_hccache", "--extents", "100%PVS",
                              "hc_c1", "/dev/ssd"]
    assert tail(steps[6]) == ["--yes", "--type", "cache", "--cachevol", "hc_c1/data_hccache",
                              "--cachemode", "writethrough", "--cachepolicy", "smq",
                              "--cachesettings", "migration_threshold=4096", "hc_c1/data"]


def test_in_place_changes_plan_lvchange_with_yes(tmp_path):
    built = {"hc_c1/data": {"lv_name": "data", "lv_attr": "Cwi-aoC---", "segtype": "cache",
                            "cache_mode": "writethrough", "cache_policy": "smq",
                            "kernel_cache_settings": "migration_threshold=2048"}}
    host = lvm_host(tmp_path, lvs=built, pvs={"/dev/ssd": "hc_c1"})
    p = planner(tmp_path, host)
    entry = entry_record(backend="lvmcache", backend_state={"vg": "hc_c1", "origin_lv": "data"})
    lvmcache.LvmCache(host).build(p, spec(mode="writeback", tunables={"migration_threshold": 4096}),
                              entry, {"origin": device("origin", "/dev/hdd"),
                                      "cache": device("cache", "/dev/ssd")})
    steps = argvs(p)
    assert [a[0] for a in steps] == ["lvchange", "lvchange", "lvchange"]
    assert_never_prompts(steps)
    assert steps[0][-3:] == ["--cachemode", "writeback", "hc_c1/data"]
    assert "--refresh" in steps[2]


def test_attaching_to_an_existing_lv_plans_with_yes(tmp_path, monkeypatch):
    monkeypatch.setattr(lvmcache, "existing_lv", lambda host, node: ("userdata", "data"))
    lv = {"userdata/data": {"lv_name": "data", "lv_attr": "-wi-ao----", "segtype": "linear"}}
    host = lvm_host(tmp_path, lvs=lv)
    p = planner(tmp_path, host)
    node = lvmcache.LvmCache(host).build(p, spec(), None, {"origin": device("origin", "/dev/userdata/data"),
                                                       "cache": device("cache", "/dev/ssd")})
    assert node == "/dev/userdata/data"
    steps = argvs(p)
    assert [a[0] for a in steps] == ["wipefs", "pvcreate", "vgextend", "lvcreate", "lvconvert"]
    assert "mkfs.xfs" not in [a[0] for a in steps]
    assert_never_prompts(steps)


def test_teardown_plans_every_lvm_command_with_yes(tmp_path):
    built = {"hc_c1/data": {"lv_name": "data", "lv_attr": "Cwi-aoC---", "segtype": "cache"}}
    host = lvm_host(tmp_path, lvs=built, pvs={"/dev/ssd": "hc_c1"})
    p = planner(tmp_path, host)
    entry = entry_record(backend="lvmcache",
                         backend_state={"vg": "hc_c1", "origin_lv": "data"})
    lvmcache.LvmCache(host).dismantle(p, entry, {"cache": "/dev/ssd"})
    steps = argvs(p)
    assert [a[0] for a in steps] == ["lvchange", "lvchange", "lvconvert", "vgreduce", "pvremove"]
    assert_never_prompts(steps)
    assert steps[2][-2:] == ["--uncache", "hc_c1/data"]


@pytest.mark.parametrize("devices_file", [True, False])
def test_lvm_sees_all_devices_only_without_a_devices_file(tmp_path, devices_file):
    host = FakeHost(tmp_path)
    if devices_file:
        host.sysfs_file("/etc/lvm/devices/system.devices", "")
    argv = lvmcache.lvm(host, "lvs", "vg/data")
    extra = [] if devices_file else ["--config", "devices { use_devicesfile=0 }"]
    assert argv == ["lvs", *extra, "vg/data"]


# --- identities: PV, VG and LV UUIDs ------------------------------------------------

UUIDS = {"vg_uuid": "VGUUID-a", "lv_uuid": "LVUUID-a"}
BUILT = {"hc_c1/data": {"lv_name": "data", "lv_attr": "Cwi-aoC---", "segtype": "cache",
                        "cache_mode": "writethrough", "cache_policy": "smq",
                        "kernel_cache_settings": "", **UUIDS}}


def test_a_first_build_records_the_pv_vg_and_lv_uuids(tmp_path):
    host = lvm_host(tmp_path)
    p = planner(tmp_path, host)
    lvmcache.LvmCache(host).build(p, spec(), None, {"origin": device("origin", "/dev/hdd"),
                                                    "cache": device("cache", "/dev/ssd")})
    assert any("PV, VG and LV UUIDs" in s.summary for s in p.plan.steps)
    built = lvm_host(tmp_path / "built", lvs=BUILT, pvs={"/dev/hdd": "hc_c1", "/dev/ssd": "hc_c1"})
    built.pv_uuids = {"/dev/hdd": "PV-hdd", "/dev/ssd": "PV-ssd"}
    got = lvmcache.uuids(built, "hc_c1", "data", {"origin": "/dev/hdd", "cache": "/dev/ssd"})
    assert got == {"pv_uuids": {"origin": "PV-hdd", "cache": "PV-ssd"}, **UUIDS}
    # what blkid shows on each device is what a later command requires there
    entry = entry_record(backend="lvmcache", backend_state=got)
    assert lvmcache.LvmCache(host).signature(entry, "cache") == ("LVM2_member", "PV-ssd")


def test_uuids_of_a_pv_in_another_vg_are_an_error_not_recorded(tmp_path):
    from hotcache.provision.errors import ProbeFailed

    host = lvm_host(tmp_path, lvs=BUILT, pvs={"/dev/ssd": "other_vg"})
    host.pv_uuids = {"/dev/ssd": "PV-x"}
    with pytest.raises(ProbeFailed):
        lvmcache.uuids(host, "hc_c1", "data", {"cache": "/dev/ssd"})


@pytest.mark.parametrize("key", ["vg_uuid", "lv_uuid"])
def test_restore_and_teardown_refuse_a_vg_or_lv_whose_uuid_differs(tmp_path, key):
    """Another disk brought a VG `hc_c1` (another host's, or a copy): same names, other
    UUIDs. Neither apply/restore nor teardown plans a single lvm2 command on it."""
    from hotcache.provision.errors import RefusedError

    other = {"hc_c1/data": {**BUILT["hc_c1/data"], key: "SOMEONE-ELSES"}}
    entry = entry_record(backend="lvmcache",
                         backend_state={"vg": "hc_c1", "origin_lv": "data", **UUIDS,
                                        "pv_uuids": {"origin": "PV-hdd", "cache": "PV-ssd"}})
    devs = {"origin": device("origin", "/dev/hdd"), "cache": device("cache", "/dev/ssd")}
    for i, attempt in enumerate((
            lambda h, p: lvmcache.LvmCache(h).build(p, spec(mode="writeback"), entry, devs),
            lambda h, p: lvmcache.LvmCache(h).dismantle(p, entry, {"cache": "/dev/ssd"}))):
        host = lvm_host(tmp_path / f"h{i}", lvs=other, pvs={"/dev/ssd": "hc_c1"})
        p = planner(tmp_path / f"h{i}", host)
        with pytest.raises(RefusedError) as err:
            attempt(host, p)
        assert "SOMEONE-ELSES" in str(err.value) and "recorded" in str(err.value)
        assert p.plan.steps == []
    # the recorded UUIDs: the same teardown goes ahead
    host = lvm_host(tmp_path / "ok", lvs=BUILT, pvs={"/dev/ssd": "hc_c1"})
    p = planner(tmp_path / "ok", host)
    lvmcache.LvmCache(host).dismantle(p, entry, {"cache": "/dev/ssd"})
    assert [a[0] for a in argvs(p)][-1] == "pvremove"

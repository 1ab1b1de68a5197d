"""lvmcache plans against a fake host: every lvm2 command that changes something is
planned with --yes (lvconvert and friends ask questions, and a prompt hangs apply), and
each step's argv is the exact one that runs. The real lvm2 runs it in the guest tier."""

from __future__ import annotations

import pytest

from hotcache.provision.backends import lvmcache
from hotcache.provision.engine.apply import Device, Planner
from hotcache.provision.plan import Plan
from hotcache.provision.engine.spec import CacheSpec

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
    entry = {"state": "ready", "backend_state": {"vg": "hc_c1", "origin_lv": "data"}}
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
    lvmcache.LvmCache(host).dismantle(p, {"spec": {"name": "c1"},
                                      "backend_state": {"vg": "hc_c1", "origin_lv": "data"}},
                                  {"cache": "/dev/ssd"})
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

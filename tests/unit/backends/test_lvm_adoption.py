"""Adopting an existing LV as an lvmcache origin goes through the same
refusals as any device (mounted, holders, root), and teardown --wipe never wipes it."""

from __future__ import annotations

import pytest

from hotcache.provision import mapping
from hotcache.provision.backends import lvmcache
from hotcache.provision.block.blockdev import DeviceReport
from hotcache.provision.block.host import Host
from hotcache.provision.engine import apply, teardown
from hotcache.provision.plan import Plan
from hotcache.provision.engine.spec import CacheSpec
from hotcache.provision.system.runner import Result, Runner
from tests.helpers import entry_record

SPEC = CacheSpec.model_validate({
    "name": "home", "backend": "lvmcache", "origin": {"path": "/dev/vg0/home", "wipe": True},
    "cache": {"path": "/dev/nvme1n1"}, "filesystem": {"mountpoint": "/mnt/hot"}})


class Lvm(Runner):
    """lvs/pvs answer "nothing"; every argv is recorded."""

    def __init__(self):
        super().__init__(dry_run=True)

    def query(self, argv, *, check=True):
        argv = [str(a) for a in argv]
        self.recorded.append(argv)
        return Result(argv, 0, '{"report": [{"lv": [], "pv": []}]}', "")


@pytest.fixture
def lv(monkeypatch):
    monkeypatch.setattr(lvmcache, "existing_lv", lambda host, node: ("vg0", "home"))


def backend() -> lvmcache.LvmCache:
    return lvmcache.LvmCache(Host(Lvm()))


def origin(report: DeviceReport) -> apply.Device:
    return apply.Device("origin", SPEC.origin, "/dev/dm-4", True, report.size, report,
                        {"TYPE": "xfs", "UUID": "f00"})


@pytest.mark.parametrize("report, why", [
    (DeviceReport("/dev/dm-4", 2**30, True, mountpoints=["/home"]), "it is mounted at /home"),
    (DeviceReport("/dev/dm-4", 2**30, True, holders=["dm-9"]), "in use by dm-9 (holders)"),
    (DeviceReport("/dev/dm-4", 2**30, True, holds_root=True), "it holds the root filesystem"),
])
def test_adopting_a_busy_lv_is_refused_even_with_wipe(lv, tmp_path, report, why):
    p = apply.Planner(apply.Env(Lvm(), tmp_path / "m.yaml", tmp_path / "fstab"), "home", Plan())
    dev = origin(report)
    assert not backend().owns(None, dev)
    apply.preflight(p, backend(), SPEC, None, dev, 0)
    assert len(p.refusals) == 1 and why in p.refusals[0] and "even with wipe" in p.refusals[0]
    assert p.plan.steps == []


def test_an_idle_lv_is_adopted_and_the_adopted_lv_stays_ours_once_mounted(lv):
    idle = origin(DeviceReport("/dev/dm-4", 2**30, True))
    assert backend().owns(None, idle)
    entry = entry_record(backend="lvmcache",
                         backend_state={"vg": "vg0", "origin_lv": "home", "adopted": True})
    mounted = origin(DeviceReport("/dev/dm-4", 2**30, True, mountpoints=["/mnt/hot"]))
    assert backend().owns(entry, mounted)
    other = entry_record(backend="lvmcache",
                         backend_state={"vg": "vg0", "origin_lv": "data", "adopted": True})
    assert not backend().owns(other, mounted)


def test_teardown_wipe_never_wipes_an_adopted_lv(tmp_path, monkeypatch):
    state = tmp_path / "m.yaml"
    entry = {"backend": "lvmcache", "state": "ready",
             "backend_state": {"vg": "vg0", "origin_lv": "home", "adopted": True},
             "devices": {"origin": {"node": "/dev/dm-4", "size": 2**30, "path": "/dev/vg0/home"},
                         "cache": {"node": "/dev/nvme1n1", "size": 2**30,
                                   "path": "/dev/nvme1n1"}},
             "filesystem": {"uuid": "f00", "mountpoint": str(tmp_path / "mnt")},
             "spec": {"name": "home"}}
    with mapping.editing(state) as data:
        data["caches"]["home"] = entry
    monkeypatch.setenv("HOTCACHE_UNIT_DIR", str(tmp_path / "units"))
    from hotcache.provision.backends.parts import recorded

    monkeypatch.setattr(lvmcache.LvmCache, "live", lambda self, e, nodes: None)  # active
    monkeypatch.setattr(recorded, "locate", lambda e, role, *a, **k: recorded.Found(
        role, node=e.devices[role].node))
    runner = Lvm()
    plan = teardown.plan_teardown("home", apply.Env(runner, state, tmp_path / "fstab"),
                                  wipe=True)
    wipes = [s.argv for s in plan.steps if s.argv and s.argv[0] == "wipefs"]
    assert wipes == [["wipefs", "--all", "/dev/nvme1n1"]], "only the SSD hotcache took"
    assert any("/dev/dm-4 is not wiped" in n for n in plan.notes)

"""Restore re-assembles what the mapping records and never builds: whatever it would have
to create or erase is a refusal naming what is missing, for every backend; the refusal
is enforced by the planner itself, not by each backend remembering it."""

from __future__ import annotations

import pytest

from hotcache.provision.engine.apply import Planner
from hotcache.provision.engine.restore import plan_restore
from hotcache.provision.errors import RefusedError
from hotcache.provision.plan import Plan

from tests.unit.backends.test_plans import fake, lvm_built, steps  # noqa: F401  (fixture)


@pytest.mark.parametrize("argv", [
    ["wipefs", "--all", "/dev/vdb"], ["make-bcache", "-B", "/dev/vdb"],
    ["mkfs.xfs", "/dev/vdb"], ["pvcreate", "--yes", "/dev/vdb"],
    ["vgcreate", "--yes", "hc_c1", "/dev/vdb"], ["lvcreate", "--name", "data", "hc_c1"],
    ["lvconvert", "--yes", "--type", "cache", "hc_c1/data"],
    ["dd", "if=/dev/zero", "of=/dev/mapper/hc-c1-meta"]])
def test_a_restore_planner_refuses_every_building_step(fake, argv):
    plan = Plan()
    p = Planner(fake.env_, "c1", plan, restoring=True)
    p.command("build something", argv)
    assert plan.steps == []
    assert len(p.refusals) == 1 and "restore never builds" in p.refusals[0]
    # The same step in an apply is queued.
    Planner(fake.env_, "c1", plan).command("build something", argv)
    assert len(plan.steps) == 1


def test_lvmcache_restore_of_a_renamed_lv_refuses_naming_it_and_runs_nothing(fake):
    """The LV was renamed between boots, the PVs are still in the recorded VG: restore
    used to plan wipefs, pvcreate, vgcreate, lvcreate and lvconvert on both disks."""
    lvm_built(fake, active=False)
    fake.lvs["hc_c1/renamed"] = fake.lvs.pop("hc_c1/data")
    with pytest.raises(RefusedError) as err:
        plan_restore(fake.env_)
    said = str(err.value)
    assert "hc_c1/data" in said and "is not found" in said
    assert "the origin /dev/vdb is a PV of hc_c1" in said
    assert "the cache /dev/vdc is a PV of hc_c1" in said
    assert "lvrename hc_c1 NEW-NAME data" in said
    assert "wipefs" not in said and "pvcreate" not in said
    assert fake.runner.recorded == []


def test_lvmcache_restore_of_an_lv_no_longer_cached_attaches_nothing(fake):
    lvm_built(fake, active=False, cached=False)
    with pytest.raises(RefusedError, match="no longer cached") as err:
        plan_restore(fake.env_)
    assert "lvcreate" not in str(err.value) and fake.runner.recorded == []


def test_lvmcache_restore_of_the_recorded_lv_still_only_activates(fake):
    lvm_built(fake, active=False)
    assert [s for s in steps(plan_restore(fake.env_)) if isinstance(s, list)][0][:1] == \
        ["vgchange"]


@pytest.mark.parametrize("backend", ["bcache", "dm-cache", "lvmcache"])
def test_apply_refuses_a_disk_without_stable_identity(fake, backend):  # noqa: F811
    """A virtio disk without serial: no by-id link, serial, WWN or partition UUID, so no
    restore could ever prove it after a reboot. Refused before anything runs."""
    from hotcache.provision.engine.apply import plan_apply
    from tests.unit.backends.test_plans import spec

    fake.unplug("vdc")
    fake.disk("vdc", None, 256)
    with pytest.raises(RefusedError) as err:
        plan_apply(spec(backend), fake.env_)
    said = str(err.value)
    assert "c1.cache (/dev/vdc): /dev/vdc has no stable identity" in said
    assert "serial=" in said and "c1.origin" not in said
    assert fake.runner.recorded == [] and not fake.env_.state.exists()


def test_a_cache_restored_by_nothing_may_use_such_a_disk(fake):  # noqa: F811
    from hotcache.provision.engine.apply import plan_apply
    from hotcache.provision.engine.spec import HostSpec

    fake.unplug("vdc")
    fake.disk("vdc", None, 1024)
    plan_apply(HostSpec.model_validate({"caches": [{
        "name": "c1", "backend": "none", "origin": {"path": "/dev/vdc"},
        "filesystem": {"mountpoint": "/mnt/c1"}}]}), fake.env_)

"""The routine `apply` (the Ansible role runs it on every play) never rebuilds a cache the
mapping records as built over the cache's own devices: a recorded cache whose LV is
missing is a refusal naming what is missing, as restore's is, and no destructive step
is ever queued on a device `owns()` proved to be the cache's own."""

from __future__ import annotations

import pytest

from hotcache.provision.engine.apply import Planner, plan_apply
from hotcache.provision.errors import RefusedError
from hotcache.provision.plan import Plan

from tests.unit.backends.test_plans import fake, lvm_built, spec  # noqa: F401  (fixture)


@pytest.mark.parametrize("how", ["renamed", "removed"])
def test_apply_of_a_ready_lvmcache_whose_lv_is_missing_erases_nothing(fake, how):
    """VG inactive, the LV renamed or removed: owns() proves both disks are the cache's
    PVs, and apply used to plan wipefs on both, pvcreate, vgcreate and lvcreate."""
    lvm_built(fake, active=False)
    row = fake.lvs.pop("hc_c1/data")
    if how == "renamed":
        fake.lvs["hc_c1/renamed"] = row
    with pytest.raises(RefusedError) as err:
        plan_apply(spec("lvmcache"), fake.env_)
    said = str(err.value)
    assert "hc_c1/data" in said and "is not found" in said, said
    assert "Apply never rebuilds a recorded cache" in said
    assert "`hotcache apply` again" in said
    assert fake.runner.recorded == []


def test_the_planner_refuses_a_destructive_step_on_the_caches_own_device(fake):
    plan = Plan()
    p = Planner(fake.env_, "c1", plan)
    p.own_devices.add("/dev/vdb")
    p.command("erase old signatures", ["wipefs", "--all", "/dev/vdb"], destructive=True)
    p.command("make an XFS", ["mkfs.xfs", "-f", "/dev/vdb"], destructive=True)
    assert plan.steps == []
    assert len(p.refusals) == 2 and "holds this cache's own data" in p.refusals[0]
    # another device, the same steps: queued
    p.command("erase old signatures", ["wipefs", "--all", "/dev/vdc"], destructive=True)
    assert len(plan.steps) == 1

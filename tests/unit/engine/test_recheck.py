"""Identity proven again right before each destructive step (engine/recheck.py): a device
that changes between the plan and the step (pulled and replaced, re-plugged under the
same name, given a new filesystem while the confirmation prompt waited) stops the step
before its program runs."""

from __future__ import annotations

import pytest

from hotcache.provision.engine.apply import execute, plan_apply
from hotcache.provision.errors import RefusedError

from tests.unit.backends.test_plans import fake, spec  # noqa: F401  (fixture)

EXT4 = "55555555-5555-4555-8555-555555555555"


def planned(fake, backend="dm-cache"):
    fake.fs("vdc", "ext4", EXT4)          # wipe: true consents to erasing it
    plan = plan_apply(spec(backend), fake.env_)
    assert ["wipefs", "--all", "/dev/vdc"] in [[str(a) for a in s.argv] for s in plan.steps]
    return plan


def ran(fake) -> list[str]:
    return [argv[0] for argv in fake.runner.recorded]


def test_an_unchanged_device_runs_every_step(fake):
    execute(planned(fake), fake.runner)
    assert "wipefs" in ran(fake) and "mkfs.xfs" in ran(fake)


def test_a_disk_replaced_under_the_same_name_stops_the_wipe(fake):
    plan = planned(fake)
    fake.unplug("vdc")
    fake.disk("vdc", "someone-elses", 256, type="ext4", uuid=EXT4)   # same size, same fs
    with pytest.raises(RefusedError) as err:
        execute(plan, fake.runner)
    said = str(err.value)
    assert "stopped before `erase every signature on /dev/vdc (ext4)" in said
    assert "serial, someone-elses, planned with serial, ssd1" in said and "nothing was run" in err.value.hint
    assert "wipefs" not in ran(fake) and "dmsetup" not in ran(fake)


def test_a_disk_gone_stops_the_step(fake):
    plan = planned(fake)
    fake.unplug("vdc")
    with pytest.raises(RefusedError, match="/dev/vdc is gone"):
        execute(plan, fake.runner)
    assert "wipefs" not in ran(fake)


def test_a_new_filesystem_made_while_the_prompt_waited_stops_the_wipe(fake):
    plan = planned(fake)
    fake.fs("vdc", "xfs", "66666666-6666-4666-8666-666666666666")
    with pytest.raises(RefusedError, match="signature xfs 6666.*planned with ext4"):
        execute(plan, fake.runner)
    assert "wipefs" not in ran(fake)


def test_a_later_step_on_a_device_the_plan_already_wrote_expects_a_new_signature(fake):
    """bcache: wipefs then make-bcache on the same SSD; the first changes what blkid
    shows, which is no reason to stop the second."""
    fake.fs("vdc", "ext4", EXT4)
    plan = plan_apply(spec("bcache"), fake.env_)
    steps = iter(plan.steps)
    from hotcache.provision.plan import RunContext
    ctx = RunContext(fake.runner)
    for step in steps:
        step.run(ctx)
        if [str(a) for a in step.argv][:1] == ["wipefs"] and "/dev/vdc" in step.argv:
            fake.fs("vdc", "", "")            # wiped
            fake.disks["vdc"].sig = {}
            break
    make = next(s for s in steps if s.argv[:2] == ["make-bcache", "-C"])
    make.run(ctx)
    assert fake.runner.recorded[-1][0] == "make-bcache"

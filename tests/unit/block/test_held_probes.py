"""A plan reads each device once (Host.holding_probes): planning one cache asks for a
device's signature several times, and on a slow machine each ask is a blkid run. What
runs after the plan reads afresh: the guard of a destructive step, right before it."""

from __future__ import annotations

from collections import Counter

import pytest

from hotcache.provision.block import blockdev
from hotcache.provision.engine.apply import execute, plan_apply
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.errors import ProbeFailed, RefusedError

from tests.unit.backends.test_plans import fake, spec  # noqa: F401  (fixture)
from tests.unit.block.test_identity_plans import env, host  # noqa: F401  (fixtures)
from tests.unit.engine.test_cache_failed import dm_cache

VDC = ("blkid", "--probe", "--output", "export", "/dev/vdc")


@pytest.fixture
def asked(fake, monkeypatch) -> Counter:
    """The read-only probes the fake host answered: each argv's count."""
    return counting(fake, monkeypatch)


def counting(host, monkeypatch) -> Counter:
    count: Counter = Counter()
    query = host.runner.query

    def counted(argv, *, check=True):
        count[tuple(str(a) for a in argv)] += 1
        return query(argv, check=check)

    monkeypatch.setattr(host.runner, "query", counted)
    return count


def blkid(asked: Counter) -> dict:
    return {argv: n for argv, n in asked.items() if argv[0] == "blkid"}


@pytest.mark.parametrize("backend", ["bcache", "dm-cache", "lvmcache"])
def test_planning_an_apply_reads_each_device_once(fake, asked, backend):
    plan_apply(spec(backend), fake.env_)
    assert blkid(asked), "the plan read no signature"
    assert set(blkid(asked).values()) == {1}, blkid(asked)
    assert asked[("dmsetup", "version")] <= 1


def test_each_plan_reads_the_device_again(fake, asked):
    """Nothing is held between two plans (two commands, or a plan and its re-plan)."""
    plan_apply(spec("dm-cache"), fake.env_)
    plan_apply(spec("dm-cache"), fake.env_)
    assert asked[VDC] == 2


def test_outside_a_plan_every_read_runs(fake, asked):
    for _ in range(2):
        blockdev.fs_identity(fake, "/dev/vdc")
    assert asked[VDC] == 2


def test_a_held_answer_is_a_copy_the_reader_cannot_change_for_the_next(fake):
    fake.fs("vdc", "ext4", "55555555-5555-4555-8555-555555555555")
    with fake.holding_probes():
        blockdev.fs_identity(fake, "/dev/vdc")["TYPE"] = "changed by a reader"
        assert blockdev.fs_identity(fake, "/dev/vdc")["TYPE"] == "ext4"


def test_a_failed_probe_is_asked_again_and_fails_again(fake, asked):
    """A failure is never held as an answer (least of all as "blank")."""
    fake.runner.failing.add("blkid")
    with fake.holding_probes():
        for _ in range(2):
            with pytest.raises(ProbeFailed):
                blockdev.fs_identity(fake, "/dev/vdc")
    assert asked[VDC] == 2


def test_a_filesystem_made_after_the_plan_stops_the_wipe(fake):
    """The guard reads the device again at run time, not the answer the plan held."""
    fake.fs("vdc", "ext4", "55555555-5555-4555-8555-555555555555")   # wipe: true erases it
    plan = plan_apply(spec("bcache"), fake.env_)
    fake.fs("vdc", "xfs", "66666666-6666-4666-8666-666666666666")
    with pytest.raises(RefusedError, match="signature xfs 6666.*planned with ext4"):
        execute(plan, fake.runner)
    assert "wipefs" not in [argv[0] for argv in fake.runner.recorded]


def test_planning_a_teardown_reads_each_device_once(host, env, monkeypatch):
    dm_cache(host, env, status_line="0 2097152 cache Fail")
    asked = counting(host, monkeypatch)
    plan_teardown("c1", env, cache_failed=True)
    assert blkid(asked), "the plan read no signature"
    assert set(blkid(asked).values()) == {1}, blkid(asked)

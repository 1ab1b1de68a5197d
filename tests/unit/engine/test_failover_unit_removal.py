"""The fail-over watcher's service goes with the last cache that can fail over: the
teardown of the last dm-cache or lvmcache stops, disables and removes it; while another
such cache remains, it stays."""

from __future__ import annotations

import yaml

from hotcache.provision import mapping
from hotcache.provision.engine import bootunit, failoverunit
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.plan import RunContext
from hotcache.provision.system.runner import Runner

from tests.unit.backends.test_plans import bcache_built, dm_built, fake, steps  # noqa: F401

REMOVAL = "stop and remove {units}/hotcache-failover.service (no cache left that can fail " \
          "over to its origin)"


def removal() -> str:
    return REMOVAL.format(units=bootunit.unit_dir())


def test_the_last_dm_cache_takes_the_watcher_with_it(fake):
    dm_built(fake)
    plan = plan_teardown("c1", fake.env_)
    assert steps(plan)[-1] == removal()
    unit = bootunit.unit_dir() / failoverunit.UNIT
    wants = bootunit.unit_dir() / "multi-user.target.wants" / failoverunit.UNIT
    assert unit.exists() and wants.is_symlink()
    plan.steps[-1].action(RunContext(Runner()))
    assert not unit.exists() and not wants.is_symlink()


def test_the_watcher_stays_while_another_cache_can_fail_over(fake):
    dm_built(fake)
    data = yaml.safe_load(fake.env_.state.read_text())
    data["caches"]["c2"] = {**data["caches"]["c1"]}
    mapping.save(fake.env_.state, data)
    assert removal() not in steps(plan_teardown("c1", fake.env_))


def test_a_cache_that_cannot_fail_over_leaves_it_alone(fake):
    bcache_built(fake)
    unit = bootunit.unit_dir() / failoverunit.UNIT
    unit.write_text(failoverunit.unit_text(fake.env_.state.absolute()))
    assert removal() not in steps(plan_teardown("c1", fake.env_))
    assert unit.exists()


def test_a_watcher_of_another_mapping_is_left_alone(fake, tmp_path):
    """A teardown run on another mapping (--state) never removes the host's watcher."""
    dm_built(fake)
    unit = bootunit.unit_dir() / failoverunit.UNIT
    unit.write_text(failoverunit.unit_text(tmp_path / "the-hosts-mappings.yaml"))
    assert removal() not in steps(plan_teardown("c1", fake.env_))
    assert unit.exists()

"""A cache whose SSD failed, planned against a fake host: status names the failure as the
kernel reports it (never "unproven" or "another filesystem"), doctor and the metrics say
so, and `teardown --cache-failed` takes it apart without a flush, only with the loss of
dirty data acknowledged."""

from __future__ import annotations

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.engine import status
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.errors import RefusedError, UsageError
from hotcache.provision.observe import doctor
from hotcache.provision.records import CacheEntry

from tests.unit.test_identity_plans import FS, SPEC, argvs, entry, env, host, save  # noqa: F401

LIVE = "0 2097152 cache 8 33/1024 128 900/960 10 2 3 4 0 5 {dirty} 1 {mode} 2 " \
       "migration_threshold 2048 smq 0 rw -"


def dm_cache(host, env, *, mode="writethrough", status_line=None, dirty=0):
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    host.tables["hc-c1"] = f"0 2097152 cache 254:1 254:2 254:3 128 1 {mode} smq 0"
    host.tables["hc-c1-meta"] = "0 8192 linear 254:0 0"
    host.tables["hc-c1-data"] = "0 122880 linear 254:0 8192"
    host.statuses["hc-c1"] = status_line or LIVE.format(dirty=dirty, mode=mode)
    save(env, c1=entry(spec=dict(SPEC, mode=mode)))


def row(host, env) -> dict:
    data = mapping.load(env.state)
    return status.cache_status("c1", data["caches"]["c1"], host.runner, None, host=host)


def test_a_healthy_cache_is_not_failed(host, env):
    dm_cache(host, env)
    got = row(host, env)
    assert got["cache_failed"] is None
    assert "CACHE_FAILED" not in [f["code"] for f in got["findings"]]


@pytest.mark.parametrize("line, said", [
    ("0 2097152 cache Fail", "dm-cache reports Fail"),
    (LIVE.format(dirty=0, mode="writethrough").replace(" rw -", " ro -"), "read-only"),
    (LIVE.format(dirty=0, mode="writethrough").replace(" rw -", " rw needs_check"),
     "needs_check"),
])
def test_status_names_the_kernels_verdict(host, env, line, said):
    dm_cache(host, env, status_line=line)
    host.unplug("vda")      # the SSD is gone too: one finding says why, not DEVICE_MISSING
    got = row(host, env)
    codes = [f["code"] for f in got["findings"]]
    assert codes.count("CACHE_FAILED") == 1 and "DEVICE_MISSING" not in codes, codes
    message = next(f["message"] for f in got["findings"] if f["code"] == "CACHE_FAILED")
    assert message.startswith("cache failed: /dev/disk/by-id/virtio-ssd1: ") and said in message
    assert "no dirty data at risk" in message          # writethrough
    assert got["cache_failed"]["dirty_bytes"] == 0


def test_doctor_leads_to_the_way_out(host, env):
    dm_cache(host, env, status_line="0 2097152 cache Fail")
    got = row(host, env)
    found = doctor.check_drift({"c1": got})
    failed = next(f for f in found if f.code == "CACHE_FAILED")
    assert "hotcache teardown c1 --cache-failed" in failed.fix
    assert "another filesystem" not in failed.fix and "put the recorded disk" not in failed.fix


def test_metrics_report_the_failure(host, env, tmp_path):
    from prometheus_client import generate_latest

    from hotcache.provision.observe.metrics import registry_for

    dm_cache(host, env, mode="writeback", status_line="0 2097152 cache Fail")
    text = generate_latest(registry_for([row(host, env)], env.state)).decode()
    assert 'hotcache_cache_failed{cache="c1"} 1.0' in text
    host.statuses["hc-c1"] = LIVE.format(dirty=0, mode="writeback")
    text = generate_latest(registry_for([row(host, env)], env.state)).decode()
    assert 'hotcache_cache_failed{cache="c1"} 0.0' in text


def test_teardown_cache_failed_removes_the_tables_without_a_flush(host, env):
    dm_cache(host, env, status_line="0 2097152 cache Fail")
    plan = plan_teardown("c1", env, cache_failed=True)
    assert argvs(plan) == [["dmsetup", "remove", "--force", "--retry", "hc-c1"],
                           ["dmsetup", "remove", "--force", "--retry", "hc-c1-data"],
                           ["dmsetup", "remove", "--force", "--retry", "hc-c1-meta"]]
    summaries = [s.summary for s in plan.steps]
    assert summaries[-1].startswith("remove c1 from the mapping")
    assert any(f"UUID={FS}" in n for n in plan.notes)


def test_teardown_cache_failed_of_a_healthy_cache_is_refused(host, env):
    dm_cache(host, env)
    with pytest.raises(RefusedError, match="nothing wrong with the SSD"):
        plan_teardown("c1", env, cache_failed=True)
    assert host.runner.recorded == []


def test_dirty_data_lost_needs_an_acknowledgement_that_covers_it(host, env):
    """Writeback with 3 dirty blocks of 64 KiB on an SSD whose metadata went read-only:
    nothing goes ahead without --accept-loss of at least 196608 bytes."""
    line = LIVE.format(dirty=3, mode="writeback").replace(" rw -", " ro -")
    dm_cache(host, env, mode="writeback", status_line=line)
    with pytest.raises(RefusedError) as err:
        plan_teardown("c1", env, cache_failed=True)
    assert "196608 bytes" in str(err.value) and "--accept-loss 196608" in err.value.hint
    with pytest.raises(RefusedError):
        plan_teardown("c1", env, cache_failed=True, accept_loss="100K")
    with pytest.raises(UsageError, match="--accept-loss lots"):
        plan_teardown("c1", env, cache_failed=True, accept_loss="lots")
    plan = plan_teardown("c1", env, cache_failed=True, accept_loss="192K")
    assert argvs(plan)[0] == ["dmsetup", "remove", "--force", "--retry", "hc-c1"]
    assert any("xfs_repair -n" in n for n in plan.notes)


def test_unknown_dirty_data_needs_accept_loss_all(host, env):
    dm_cache(host, env, mode="writeback", status_line="0 2097152 cache Fail")
    for given in (None, "1T"):
        with pytest.raises(RefusedError, match="an unknown amount"):
            plan_teardown("c1", env, cache_failed=True, accept_loss=given)
    assert plan_teardown("c1", env, cache_failed=True, accept_loss="all").steps
    assert "c1" in yaml.safe_load(env.state.read_text())["caches"]     # plans change nothing

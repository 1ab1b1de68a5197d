"""A restore that fails at boot is loud: the real `hotcache restore` exits non-zero and
records it for this boot, `hotcache doctor` reports it (RESTORE_FAILED, with the fix)
and the metrics carry hotcache_restore_failed=1 (valid for promtool) until a restore
succeeds. Root: restore runs as root."""

from __future__ import annotations

import json
import subprocess

import pytest

from hotcache.provision import mapping
from hotcache.provision.engine import restorelog
from hotcache.provision.errors import ExitCode
from hotcache.provision.observe import doctor, metrics
from hotcache.provision.system.runner import Runner
from tests.helpers import hotcache, recorded_entry
from tests.unit.observe.test_metrics import row

pytestmark = pytest.mark.root


@pytest.fixture
def run_dir(sandbox, monkeypatch):
    monkeypatch.setenv("HOTCACHE_RUN_DIR", str(sandbox / "run"))
    return sandbox / "run"


def a_dm_cache_whose_ssd_is_gone(sandbox):
    """A ready dm-cache whose recorded SSD image is not there (a boot without it)."""
    state = sandbox / "state" / "mappings.yaml"
    gone = str(sandbox / "gone-ssd.img")
    spec = {"name": "w1", "backend": "dm-cache", "mode": "writeback",
            "origin": {"loop": {"file": str(sandbox / "hdd.img"), "size": "512M"}},
            "cache": {"loop": {"file": gone, "size": "128M"}},
            "filesystem": {"mountpoint": str(sandbox / "mnt" / "w1")}}
    mapping.save(state, {"caches": {"w1": recorded_entry(
        "w1", backend="dm-cache", spec=spec, devices={
            "origin": {"node": "/dev/loop99", "size": 512 * 2**20,
                       "loop_file": str(sandbox / "hdd.img")},
            "cache": {"node": "/dev/loop98", "size": 128 * 2**20, "loop_file": gone}},
        backend_state={"block_sectors": 128, "meta_sectors": 8192, "data_sectors": 245760,
                       "names": {"cache": "hc-w1", "meta": "hc-w1-meta",
                                 "data": "hc-w1-data"}})}})
    return state


def test_a_failed_restore_is_reported_by_doctor_and_the_metrics(sandbox, run_dir):
    state = a_dm_cache_whose_ssd_is_gone(sandbox)
    proc = hotcache("restore", "w1", "--yes", "--state", state)
    assert proc.returncode != ExitCode.OK, proc.stdout + proc.stderr
    recorded = json.loads((run_dir / "restore-w1.json").read_text())
    assert recorded["ok"] is False and recorded["error"]

    findings = [f for f in doctor.check_restore_failed(mapping.load(state)["caches"],
                                                       Runner())]
    assert [(f.code, f.severity, f.subject) for f in findings] == \
        [("RESTORE_FAILED", "problem", "w1")]
    assert "hotcache-restore-w1.service" in findings[0].fix
    assert "`hotcache restore w1`" in findings[0].fix

    from prometheus_client import generate_latest
    rows = [row("w1", backend="dm-cache", mp="/mnt/w1", mounted=False, ok=False)]
    text = generate_latest(metrics.registry_for(rows, state)).decode()
    assert 'hotcache_restore_failed{cache="w1"} 1.0' in text
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # A later restore that succeeds clears it (recorded as the CLI does on success).
    restorelog.record(["w1"], None)
    assert restorelog.failure("w1") is None
    assert doctor.check_restore_failed(mapping.load(state)["caches"], Runner()) == []
    text = generate_latest(metrics.registry_for(rows, state)).decode()
    assert 'hotcache_restore_failed{cache="w1"} 0.0' in text


def test_a_cache_restored_by_nothing_has_no_restore_metric(sandbox, run_dir):
    from prometheus_client import generate_latest

    state = sandbox / "m.yaml"
    mapping.save(state, {"caches": {"p": recorded_entry("p")}})
    rows = [row("p", backend="none", mp="/mnt/p")]
    assert "hotcache_restore_failed" not in generate_latest(
        metrics.registry_for(rows, state)).decode()

"""The alert rules: valid for Prometheus, and each alert has a promtool test case that
shows it firing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parents[3] / "playbooks" / "prometheus"
RULES = RULES_DIR / "hotcache-rules.yml"
TESTS = RULES_DIR / "hotcache-rules.test.yml"
# the alert that waits a week, evaluated every 30 minutes rather than every minute
WEEK = RULES_DIR / "hotcache-rules.week.test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=RULES_DIR,
                          timeout=300)


def test_promtool_check_rules():
    proc = promtool("check", "rules", RULES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules():
    proc = promtool("test", "rules", TESTS.name, WEEK.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    firing, quiet = set(), set()
    for case in [c for f in (TESTS, WEEK) for c in yaml.safe_load(f.read_text())["tests"]]:
        for t in case.get("promql_expr_test", []):
            if 'alertname="' not in t["expr"]:
                continue                  # a recording rule's own case
            name = t["expr"].split('alertname="')[1].split('"')[0]
            (firing if t["exp_samples"] else quiet).add(name)
    assert alerts == firing
    assert alerts == quiet
    # The list: hit ratio, dirty data, failed/missing device, hot copy failed or
    # too old, low free space on the fast tier.
    for wanted in ("HotcacheLowHitRatio", "HotcacheHighDirtyData", "HotcacheCacheDeviceMissing",
                   "HotcacheCacheDown", "HotcacheHotCopyVerifyFailed",
                   "HotcacheHotCopyVerificationOld", "HotcacheFastTierLowFree",
                   "HotcacheCacheThrashing", "HotcacheJobInputBound"):
        assert wanted in alerts


def broken_rules_fail(tmp_path, old: str, new: str, alert: str) -> None:
    """With `old` changed to `new` in the rules, promtool's tests fail, naming `alert`."""
    broken = RULES.read_text().replace(old, new)
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    for tests in (TESTS, WEEK):
        (tmp_path / tests.name).write_text(tests.read_text())
    proc = subprocess.run(["promtool", "test", "rules", TESTS.name, WEEK.name],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    assert alert in proc.stdout + proc.stderr


def test_a_broken_threshold_is_caught(tmp_path):
    """The tests would notice a rule that no longer fires."""
    broken_rules_fail(tmp_path, "< 0.10", "< 0.01", "HotcacheFastTierLowFree")


def test_a_thrashing_threshold_too_high_is_caught(tmp_path):
    """A thrashing rule that waits for demotions to equal promotions misses a cache that
    demotes 95 of every 100 blocks it promotes."""
    broken_rules_fail(tmp_path, ">= 0.8 * sum", ">= 0.99 * sum", "HotcacheCacheThrashing")


def test_a_job_alert_blind_to_the_nodes_cache_is_caught(tmp_path):
    """A job waiting on a node whose cache failed or thrashes must alert, not only a job
    that reads a cold data root."""
    broken_rules_fail(tmp_path, "group by (node) (hotcache_node:cache_trouble)",
                      'group by (node) (hotcache_node:cache_trouble{reason="none"})',
                      "HotcacheJobInputBound")


def test_the_node_label_a_job_pushes_is_the_one_the_rules_cut_from_instance(monkeypatch):
    """The rules join a job to its node's cache by cutting the node's `instance` with the
    recording rule's regex; the adapters push `node` as pushgateway.node_name() gives it.
    The same host, named either way, gives the same label."""
    import re

    from hotcache.adapters import pushgateway

    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("record") == "hotcache_node:cache_trouble")
    regex = re.search(r'"node", "\$1", "instance", "([^"]+)"', rule["expr"]).group(1)
    for var in ("HOTCACHE_NODE", "SLURMD_NODENAME", "NODE_NAME"):
        monkeypatch.delenv(var, raising=False)
    for hostname in ("gpu01", "gpu01.example.org"):
        monkeypatch.setattr(pushgateway.socket, "gethostname", lambda h=hostname: h)
        for instance in ("gpu01", "gpu01:9100", "gpu01.example.org:9100"):
            assert re.fullmatch(regex, instance).group(1) == pushgateway.node_name(), (hostname, instance)

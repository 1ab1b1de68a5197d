"""The Grafana dashboard shipped in playbooks/grafana/: one `datasource` variable that
every panel and query uses, `job` and `instance` variables in every selector, a unit on
every panel, `$__rate_interval` in every rate; every metric it queries exists in a
metrics file hotcache wrote; every PromQL expression parses (`promtool check rules`)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hotcache.provision.observe import metrics, progress
from hotcache.provision.system.meter import NullMeter
from tests.unit.observe.test_metrics import FULL_STATS, NOW, make_copy, row, write_state

DASHBOARD = Path(__file__).resolve().parents[3] / "playbooks" / "grafana" / "hotcache-dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
METRIC = re.compile(r"\bhotcache_[a-z0-9_]+")
RANGE = re.compile(r"\b(rate|irate|increase|delta|deriv|[a-z]+_over_time)\s*\(([^\[]*)\[([^\]]+)\]")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out += [p] if p["type"] != "row" else []
        out += p.get("panels", [])
    return out


def exprs(dash: dict) -> list[str]:
    return [t["expr"] for p in panels(dash) for t in p["targets"]]


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric, label matchers) for each hotcache metric in `expr`."""
    return [(m.group(0), expr[m.end():].split("}")[0] if expr[m.end():].startswith("{") else "")
            for m in METRIC.finditer(expr)]


def problems(dash: dict) -> list[str]:
    """Every rule the dashboard must keep, as a list of what breaks them."""
    found = []
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds_vars = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    if [v["name"] for v in ds_vars] != ["datasource"] or ds_vars[0]["query"] != "prometheus":
        found.append("exactly one datasource variable, named datasource, of Prometheus")
    for name in ("job", "instance"):
        v = variables.get(name)
        if not v or v["type"] != "query" or v["datasource"] != DS:
            found.append(f"variable {name} must be a query on ${{datasource}}")
    if "$job" not in variables.get("instance", {}).get("definition", ""):
        found.append("instance must be chained on $job")
    for p in panels(dash):
        title = p.get("title")
        if p.get("datasource") != DS:
            found.append(f"{title}: panel datasource is not ${{datasource}}")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            found.append(f"{title}: no unit")
        if not p.get("targets"):
            found.append(f"{title}: no query")
        for t in p.get("targets", []):
            if t.get("datasource") != DS:
                found.append(f"{title}/{t.get('refId')}: query datasource is not ${{datasource}}")
            expr = t.get("expr", "")
            for fn, _, window in RANGE.findall(expr):
                if window != "$__rate_interval":
                    found.append(f"{title}: {fn}(...[{window}]) must use [$__rate_interval]")
            for metric, matchers in selectors(expr):
                for var in ("job", "instance"):
                    if f'{var}=~"${var}"' not in matchers:
                        found.append(f"{title}: {metric} is not filtered by ${var}")
    return found


def test_dashboard_keeps_the_rules():
    assert problems(load()) == []


@pytest.mark.parametrize("breakage", [
    lambda d: panels(d)[3]["fieldConfig"]["defaults"].pop("unit"),
    lambda d: panels(d)[3]["targets"][0].update(
        expr=panels(d)[3]["targets"][0]["expr"].replace("$__rate_interval", "5m", 1)),
    lambda d: panels(d)[0].update(datasource={"type": "prometheus", "uid": "prom1"}),
    lambda d: panels(d)[5]["targets"][0].update(
        expr=panels(d)[5]["targets"][0]["expr"].replace('instance=~"$instance",', "")),
    lambda d: d["templating"]["list"].append(dict(d["templating"]["list"][0], name="ds2")),
])
def test_the_rules_catch_a_broken_dashboard(breakage):
    broken = copy.deepcopy(load())
    breakage(broken)
    assert problems(broken)


def test_the_panels_the_issue_asks_for():
    text = " ".join(exprs(load()))
    for metric in ("hotcache_cache_hits_total", "hotcache_cache_misses_total",
                   "hotcache_cache_dirty_bytes", "hotcache_cache_used_bytes",
                   "hotcache_cache_promotions_total", "hotcache_filesystem_free_bytes",
                   "hotcache_hot_copy_verify_ok", "hotcache_hot_copy_verification_age_seconds",
                   "hotcache_metrics_refresh_timestamp_seconds", "hotcache_progress_bytes_left"):
        assert metric in text, metric


def generated_metric_names(tmp_path) -> set[str]:
    """Every sample name in metrics files hotcache wrote: the status metrics of a cache
    with full statistics (dm-cache also counts demotions), its working-set sizing and a
    hot copy, and a copy's progress file."""
    make_copy(tmp_path / "mnt" / "imagenet")
    state = write_state(tmp_path / "m.yaml", {"fast": {"filesystem": {"mountpoint": str(tmp_path / "mnt")}}})
    text = generate_latest(metrics.registry_for(
        [{**row("fast", stats={**FULL_STATS, "demotions": 3}, mp=str(tmp_path / "mnt")),
          "working_set": {"sizing": {"need_bytes": 900, "ratio": 1.1}}}], state, now=NOW)).decode()
    meter = progress.TextfileMeter(NullMeter(), tmp_path / "p.prom", "copy", tmp_path)
    meter.start("copy", 10, 2)
    meter.stop()
    text += (tmp_path / "p.prom").read_text()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_queried_metric_exists_in_a_generated_metrics_file(tmp_path):
    have = generated_metric_names(tmp_path)
    queried = {m for e in exprs(load()) for m in METRIC.findall(e)}
    queried |= {m for v in load()["templating"]["list"] for m in METRIC.findall(v.get("definition", ""))}
    assert queried - have == set()
    assert len(queried) >= 15


def test_every_expression_parses_with_promtool(tmp_path):
    """Grafana's variables replaced by what Grafana sends, each expression becomes a
    recording rule, and the real `promtool check rules` parses them."""
    def concrete(expr: str) -> str:
        return (expr.replace("$__rate_interval", "4m").replace("$job", ".*")
                .replace("$instance", ".*").replace("$cache", ".*"))
    rules = [{"record": f"hotcache_dashboard:expr{i}", "expr": concrete(e)}
             for i, e in enumerate(exprs(load()))]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
    # and promtool does reject a broken one
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [
        {"record": "x:y", "expr": concrete(exprs(load())[3]).replace(")", "", 1)}]}]}))
    assert subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          timeout=120).returncode != 0

"""The Grafana dashboard shipped in playbooks/grafana/: one `datasource` variable that
every panel and query uses, `job` and `instance` variables in every selector of the
node's metrics and `training_job` in every selector of the jobs' (pushed through a
Pushgateway, their `job` is the training job), a unit on every panel, `$__rate_interval`
in every rate; every metric it queries exists in a metrics file hotcache wrote or in
what a training job pushes; every PromQL expression parses (`promtool check rules`), and
the jobs row's join to the nodes' caches picks the right node (`promtool test rules`)."""

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
JOB_SIDE = "hotcache_input_"      # what training jobs push (adapters/pushgateway.py)
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
    for name in ("job", "instance", "training_job"):
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
                wanted = [("job", "training_job")] if metric.startswith(JOB_SIDE) else \
                    [("job", "job"), ("instance", "instance")]
                for label, var in wanted:
                    if f'{label}=~"${var}"' not in matchers:
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
    lambda d: jobs_row(d)[0]["targets"][0].update(
        expr=jobs_row(d)[0]["targets"][0]["expr"].replace('{job=~"$training_job"}', "", 1)),
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


def jobs_row(dash: dict) -> list[dict]:
    """The panels of the row that puts the training jobs beside their nodes' caches."""
    flat = dash["panels"]
    start = next(i for i, p in enumerate(flat) if p["type"] == "row" and "Training jobs" in p["title"])
    end = next((i for i in range(start + 1, len(flat)) if flat[i]["type"] == "row"), len(flat))
    return flat[start + 1:end]


def test_the_jobs_row_puts_each_jobs_wait_beside_its_nodes_cache():
    """Waiting share and batch wait of the jobs; hit ratio, dirty data, warm-up and a
    failed SSD of the caches on their nodes, each joined to the jobs on the node label."""
    row = jobs_row(load())
    text = [t["expr"] for p in row for t in p["targets"]]
    for metric in ("hotcache_input_waiting_ratio", "hotcache_input_wait_seconds"):
        assert any(e.startswith(metric) for e in text), metric
    for metric in ("hotcache_cache_hits_total", "hotcache_cache_dirty_bytes",
                   "hotcache_progress_bytes_left", "hotcache_cache_failed"):
        joined = [e for e in text if metric in e]
        assert joined and all('"node", "$1", "instance"' in e and "and on (node)" in e
                              for e in joined), metric


def test_the_jobs_row_joins_each_job_to_its_own_nodes_cache(tmp_path):
    """The row's queries, as Grafana sends them with every variable at All, run by
    promtool over a node whose cache is dirty and failed under a job (gpu01, scraped as
    gpu01:9100) and one without a job (gpu02): only gpu01's series come back."""
    queries = {p["title"]: concrete(p["targets"][0]["expr"]) for p in jobs_row(load())}
    rules = [{"record": f"row:q{i}", "expr": e} for i, e in enumerate(queries.values())]
    (tmp_path / "row.yml").write_text(yaml.safe_dump({"groups": [{"name": "row", "rules": rules}]}))
    series = []
    for host in ("gpu01", "gpu02"):
        node = f'instance="{host}:9100",job="node",cache="data"'
        series += [{"series": f"hotcache_cache_dirty_bytes{{{node}}}", "values": "4096x10"},
                   {"series": f"hotcache_cache_failed{{{node}}}", "values": "1x10"}]
    series += [{"series": 'hotcache_input_waiting_ratio{job="4242",rank="0",node="gpu01",hot="yes"}',
                "values": "0.5x10"},
               {"series": 'push_time_seconds{job="4242",rank="0"}', "values": "0+60x10"}]
    titles = list(queries)
    expect = [
        {"expr": f"row:q{titles.index('Dirty data on the jobs' + chr(39) + ' nodes')}", "eval_time": "5m",
         "exp_samples": [{"labels": 'row:q{}{{instance="gpu01:9100",job="node",cache="data",node="gpu01"}}'.format(
             titles.index("Dirty data on the jobs' nodes")), "value": 4096}]},
        {"expr": f"row:q{titles.index('Caches failed on the jobs' + chr(39) + ' nodes')}", "eval_time": "5m",
         "exp_samples": [{"labels": 'row:q{}{{instance="gpu01:9100",job="node",cache="data",node="gpu01"}}'.format(
             titles.index("Caches failed on the jobs' nodes")), "value": 1}]},
    ]
    (tmp_path / "row.test.yml").write_text(yaml.safe_dump({
        "rule_files": ["row.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": expect}]}))
    proc = subprocess.run(["promtool", "test", "rules", "row.test.yml"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def concrete(expr: str) -> str:
    """An expression as Grafana sends it with every variable at All."""
    return (expr.replace("$__rate_interval", "4m").replace("$training_job", ".*")
            .replace("$job", ".*").replace("$instance", ".*").replace("$cache", ".*"))


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
    text += pushed_text()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def pushed_text() -> str:
    """What a training job's timer pushes to a Pushgateway after an epoch."""
    from hotcache.adapters import timed
    from hotcache.adapters.pushgateway import exposition

    timer = timed([1, 2, 3], log_every=0)
    list(timer)
    return exposition({"train": (timer.summaries[0], 2, None)}, "gpu01")


def test_every_queried_metric_exists_in_a_generated_metrics_file(tmp_path):
    have = generated_metric_names(tmp_path)
    queried = {m for e in exprs(load()) for m in METRIC.findall(e)}
    queried |= {m for v in load()["templating"]["list"] for m in METRIC.findall(v.get("definition", ""))}
    assert queried - have == set()
    assert len(queried) >= 15


def test_every_expression_parses_with_promtool(tmp_path):
    """Grafana's variables replaced by what Grafana sends, each expression becomes a
    recording rule, and the real `promtool check rules` parses them."""
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

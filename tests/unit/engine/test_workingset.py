"""Sizing advice in plan, status, doctor and the metrics; thrashing judged from a block
cache's own counters (promotions against demotions; bcache's buckets)."""

from __future__ import annotations

import os

import pytest

from hotcache.provision.engine.status import working_set
from hotcache.provision.hotcopy.sizing import FITS, SPILLS, TIGHT
from hotcache.provision.observe.doctor import OK, WARNING, check_working_set
from hotcache.provision.engine.workingset import churn
from tests.helpers import hotcache_json, loop_spec, write_spec
from tests.helpers import entry_record
from tests.unit.observe.test_metrics import promtool_check, render, row, samples, write_state

GiB = 1 << 30


def block_row(used, cache_total, **stats):
    r = row("data", stats={"cache_total_bytes": cache_total, "promotions": 10,
                           "demotions": 1, **stats})
    r["used_bytes"] = used
    r["working_set"] = working_set(r, entry_record("data"))
    return r


@pytest.mark.parametrize("used,case,severity", [(100 * GiB, FITS, OK), (180 * GiB, TIGHT, WARNING),
                                                (400 * GiB, SPILLS, WARNING)])
def test_each_case_in_status_doctor_and_metrics(tmp_path, used, case, severity):
    r = block_row(used, 200 * GiB)
    sizing = r["working_set"]["sizing"]
    assert sizing["case"] == case
    found = [f for f in check_working_set({"data": r}) if f.check == "sizing"]
    assert [f.severity for f in found] == [severity]
    if case == SPILLS:
        assert "thrash" in found[0].message and "--fit" in found[0].fix
        assert "expected hot share 42%" in found[0].message      # 200 / 1.2 / 400
    text = render([r], write_state(tmp_path / "m.yaml", {"data": {}}))
    promtool_check(text)
    got = samples(text)
    assert got[("hotcache_cache_working_set_bytes", (("cache", "data"),))] == used
    assert got[("hotcache_cache_capacity_ratio", (("cache", "data"),))] == pytest.approx(200 * GiB / used)


def test_churn_over_an_interval():
    before = {"promotions": 1000, "demotions": 900}
    thrash = churn(before, {"promotions": 1500, "demotions": 1350}, 60)
    assert thrash["verdict"] == "thrashing" and thrash["demotions_per_promotion"] == 0.9
    assert "--fit" in thrash["message"] and "in 60 s" in thrash["message"]
    filling = churn(before, {"promotions": 1500, "demotions": 950}, 60)
    assert filling["verdict"] == "filling"
    assert churn(before, {"promotions": 1000, "demotions": 950}, 60)["verdict"] == "settled"
    r = block_row(400 * GiB, 200 * GiB, promotions=500, demotions=450)
    assert r["working_set"]["activity"]["verdict"] == "thrashing"      # since it started
    assert any(f.check == "thrashing" for f in check_working_set({"data": r}))


def test_bcache_buckets(tmp_path):
    full = {"priority": {"unused": 0, "clean": 98, "dirty": 0, "metadata": 2},
            "hit_ratio": 0.2, "promotions": None}
    assert churn(None, full, None)["verdict"] == "thrashing"
    assert churn(None, {**full, "hit_ratio": 0.9}, None)["verdict"] == "full"
    r = block_row(100 * GiB, 200 * GiB, **full)
    text = render([r], write_state(tmp_path / "m.yaml", {"data": {}}))
    promtool_check(text)
    got = samples(text)
    assert got[("hotcache_bcache_buckets_ratio", (("cache", "data"), ("state", "clean")))] == 0.98


@pytest.mark.parametrize("dataset_mib,case", [(300, FITS), (450, TIGHT), (1024, SPILLS)])
def test_plan_dataset_advice(tmp_path, dataset_mib, case):
    spec = write_spec(tmp_path / "spec.yaml", loop_spec(tmp_path, size="512M"))
    ds = tmp_path / "ds" / "cls"
    ds.mkdir(parents=True)
    for i in range(4):
        open(ds / f"{i}.bin", "wb").close()
        os.truncate(ds / f"{i}.bin", dataset_mib * (1 << 20) // 4)
    rc, out = hotcache_json("plan", spec, "--dataset", tmp_path / "ds",
                            env={"HOTCACHE_STATE": str(tmp_path / "m.yaml"),
                                 "HOTCACHE_FSTAB": str(tmp_path / "fstab")})
    assert rc == 0, out
    assert [a["case"] for a in out["sizing"]] == [case]
    assert any(n.startswith("sizing: ") for n in out["notes"])
    assert not (tmp_path / "hot.img").exists(), "plan changes nothing"

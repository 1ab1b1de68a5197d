"""Slurm feature names, the push's merge, the TaskProlog's lines (observe/slurm.py)."""

from __future__ import annotations

import pytest

from hotcache.provision.errors import UsageError
from hotcache.provision.observe import slurm


def test_feature_names_are_ones_helpers_conf_takes_and_never_collide():
    assert slurm.feature_name("imagenet", 3) == "hc_imagenet_3"
    assert slurm.feature_name("toy", "2024.06") == "hc_toy_2024.06"
    odd = [slurm.feature_name(n, v) for n, v in
           [("imagenet-21k", "v1_beta"), ("imagenet21k", "v1beta"), ("imagenet_21k", "v1-beta"),
            ("-", None), ("x" * 200, "9" * 80), ("3d", ".1")]]
    assert len(set(odd)) == len(odd)
    for name in odd:
        assert slurm.valid(name), name
        assert name.count("_") == 2 and len(name) <= slurm.MAX_FEATURE, name
    # what slurmctld 22.05 refused when parsing helpers.conf
    assert not any(slurm.valid(f) for f in ("ds-imagenet_v3", "3abc", "a,b", "a:b"))


def test_a_push_keeps_the_admins_features_and_replaces_hotcaches():
    now = slurm.parse_node("NodeName=n1 AvailableFeatures=gpu,hc_old_1 "
                           "ActiveFeatures=gpu,hc_old_1 State=IDLE")
    assert now == {"available": ["gpu", "hc_old_1"], "active": ["gpu", "hc_old_1"]}
    assert slurm.merged(now["available"], ["hc_toy_3"]) == ["gpu", "hc_toy_3"]
    assert slurm.merged(now["active"], []) == ["gpu"]
    assert slurm.parse_node("AvailableFeatures=(null) ActiveFeatures=") == \
        {"available": [], "active": []}


COPY = {"feature": "hc_toy_3", "name": "toy", "version": "3", "path": "/mnt/hot/toy",
        "source": "/data/toy", "partial": False}


def test_the_task_prolog_exports_the_copy_the_job_named():
    assert slurm.parse_job_features("JobId=7 Features=hc_toy_3&gpu|[a*2] X=1") == \
        ["hc_toy_3", "gpu", "a"]
    assert slurm.choose([COPY], ["hc_toy_3"], None) is COPY
    assert slurm.choose([COPY], [], "toy@3") is COPY
    assert slurm.choose([COPY], [], "toy@4") is None
    assert slurm.task_prolog_lines(COPY, "toy") == ["export DATA_ROOT=/mnt/hot/toy",
                                                    "export DATA_ROOT_EXPECT=hot"]
    assert slurm.task_prolog_lines({**COPY, "partial": True}, "toy") == [
        "export DATA_ROOT=/mnt/hot/toy", "export DATA_COLD_ROOT=/data/toy",
        "export DATA_ROOT_EXPECT=partial"]
    # named but not here: expect hot without a root, so data_root() fails loudly
    assert slurm.task_prolog_lines(None, "toy@4")[-1] == "export DATA_ROOT_EXPECT=hot"
    assert slurm.task_prolog_lines(None, None) == []
    with pytest.raises(UsageError):
        slurm.task_prolog_lines({**COPY, "path": "/mnt/a\nexport X=1"}, "toy")


def test_the_metrics_timer_pushes_when_asked():
    from hotcache.provision.observe.metrics import timer_units

    def exec_start(**kw):
        units = timer_units("/opt/hotcache/bin/hotcache", "/var/m.prom", "1min", {}, **kw)
        (line,) = [x for x in units["hotcache-metrics.service"].splitlines()
                   if x.startswith("ExecStart=")]
        return line

    assert exec_start().endswith("--prometheus /var/m.prom")
    assert exec_start(slurm_push=True).endswith("--prometheus /var/m.prom --slurm-push")

"""Slurm against a real one-node cluster (munged, slurmctld, slurmd from Debian) and a
real verified hot copy on a loop-backed XFS cache:

- `hotcache slurm features` and `helpers-conf` name the copy's feature; `hotcache slurm
  push` puts it on the node and the node's active features include it;
- `sbatch --constraint=<it>` runs a job in which hotcache's TaskProlog set DATA_ROOT to
  the hot copy, and the adapter's data_root line says hot=yes;
- once the copy is corrupted and `hotcache verify` fails, the next push takes the
  feature off the node and a new submission for it is refused.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import hotcache
from tests.loop.test_kube_loop import build
from tests.slurm.conftest import wait_for
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root

FEATURE = "hc_toy_3"


def active(cluster) -> list[str]:
    for word in cluster.show_node().split():
        if word.startswith("ActiveFeatures="):
            return [f for f in word.partition("=")[2].split(",") if f and f != "(null)"]
    return []


def test_jobs_land_on_the_verified_hot_copy_and_not_after_it_fails(sandbox, cluster):
    mp = build(sandbox)
    src = make_dataset(sandbox / "src")
    hotcache("copy", src, mp / "toy", "--name", "toy", "--version", "3", "--verify", check=True)
    proc = hotcache("slurm", "features")
    assert proc.returncode == 0 and proc.stdout == f"{FEATURE}\n", proc.stderr

    conf = hotcache("slurm", "helpers-conf", "--helper", cluster.feature_helper, check=True)
    assert conf.stdout == f"Feature={FEATURE} Helper={cluster.feature_helper}\n"
    cluster.write_conf()
    cluster.start()
    push = hotcache("slurm", "push", "--node", cluster.node, env=cluster.hotcache_env)
    assert push.returncode == 0, push.stderr
    assert active(cluster) == [FEATURE]

    job = (f"{sys.executable} -m hotcache.adapters; echo rc=$?; "
           "echo DATA_ROOT=$DATA_ROOT EXPECT=$DATA_ROOT_EXPECT")
    sub = cluster.sbatch(f"--constraint={FEATURE}", "-o", "job1.out", "--wrap", job)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    wait_for("job 1 to finish", lambda: "JobState=COMPLETED" in cluster.job(job_id))
    out = (cluster.root / "jobs" / "job1.out").read_text()
    assert f"DATA_ROOT={mp / 'toy'} EXPECT=hot" in out, out
    assert "hot=yes" in out and "rc=0" in out, out

    # a file goes bad: verify fails, nothing is reported, and the next push (the metrics
    # timer's) takes the feature off the node; a new job asking for it is refused
    victim = next((mp / "toy" / "cat").iterdir())
    victim.write_bytes(b"rotten" + victim.read_bytes()[6:])
    assert hotcache("verify", mp / "toy", "--full").returncode == 5
    assert hotcache("slurm", "features").stdout == ""
    push = hotcache("status", "--slurm-push", env=cluster.hotcache_env)   # the timer's run
    assert push.returncode == 0, push.stderr
    assert FEATURE not in active(cluster)
    late = cluster.sbatch(f"--constraint={FEATURE}", "-o", "job2.out", "--wrap", "true")
    assert late.returncode != 0, late.stdout
    assert "Requested node configuration is not available" in late.stderr, late.stderr

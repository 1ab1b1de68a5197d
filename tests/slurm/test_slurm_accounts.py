"""Jobs of an ordinary account, on a real one-node cluster set up as docs/slurm.md and
docs/running-as-root.md say: hotcache in a root-owned venv under /opt on the system
Python, the helper scripts as the Ansible role writes them, the node_features/helpers
plugin, and a verified hot copy `ds` version 1 on a loop-backed XFS cache.

Slurm runs the TaskProlog as the job's user, who cannot open block devices: the prolog
decides from the index root wrote, checked against the live folder.

- `sbatch --constraint=hc_ds_1` and `HOTCACHE_DATASET=ds sbatch` run, with DATA_ROOT
  at the verified copy, and `python -m hotcache.adapters` in the job logs hot=yes;
- a job naming no dataset gets nothing and runs;
- once `verify --full` fails on a file rewritten in place (and a later `verify --fast`
  cannot clear it), a job naming the dataset gets no DATA_ROOT and data_root() fails
  naming why; the feature (which the helpers plugin keeps) runs such a job too, with the
  same outcome.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import hotcache
from tests.loop.test_kube_loop import build
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root

FEATURE = "hc_ds_1"
SHOW = ("echo DATA_ROOT=${DATA_ROOT-unset} EXPECT=${DATA_ROOT_EXPECT-unset}; "
        "{python} -m hotcache.adapters; echo rc=$?")


def submit(cluster, account, venv, name: str, *args: str, env: dict | None = None) -> str:
    """Run a job as `account`; its output once it ended COMPLETED."""
    out = cluster.root / "jobs" / f"{name}.out"
    job = SHOW.replace("{python}", str(venv / "python"))
    sub = cluster.sbatch_as(account, "-o", str(out), *args, "--wrap", job,
                            env={"HOTCACHE_STATE": cluster.hotcache_env["HOTCACHE_STATE"],
                                 **(env or {})})
    assert sub.returncode == 0, sub.stderr
    state = cluster.finished(sub.stdout.strip().split(";")[0])
    text = out.read_text() if out.exists() else ""
    assert state == "COMPLETED", (state, text, (cluster.root / "log" / "slurmd.log").read_text()[-3000:])
    return text


def test_an_ordinary_accounts_jobs_get_the_verified_copy_and_not_after_it_fails(
        open_sandbox, opt_venv, account, user_cluster):
    cluster = user_cluster
    mp = build(open_sandbox)
    src = make_dataset(open_sandbox / "src", n=4)
    copy = mp / "ds"
    hotcache("copy", src, copy, "--name", "ds", "--version", "1", "--verify", check=True)
    conf = hotcache("slurm", "helpers-conf", "--helper", cluster.feature_helper, check=True)
    assert conf.stdout == f"Feature={FEATURE} Helper={cluster.feature_helper}\n"
    cluster.write_conf(conf.stdout)
    cluster.start()
    assert FEATURE in cluster.show_node()

    for name, args, env in (("constraint", [f"--constraint={FEATURE}"], {}),
                            ("dataset", [], {"HOTCACHE_DATASET": "ds"})):
        out = submit(cluster, account, opt_venv, name, *args, env=env)
        assert f"DATA_ROOT={copy} EXPECT=hot" in out, out
        assert "hot=yes" in out and "rc=0" in out, out
    out = submit(cluster, account, opt_venv, "none")
    assert "DATA_ROOT=unset EXPECT=unset" in out, out

    # a member file rewritten in place, its mtime put back: only the full check sees it,
    # and the fast check after it cannot clear it
    victim = copy / "cat" / "002.jpg"
    st = victim.stat()
    victim.write_bytes(bytes(b ^ 1 for b in victim.read_bytes()))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert hotcache("verify", copy, "--full").returncode == 5
    assert hotcache("verify", copy, "--fast").returncode == 5
    for name, args, env in (("failed-dataset", [], {"HOTCACHE_DATASET": "ds"}),
                            ("failed-constraint", [f"--constraint={FEATURE}"], {})):
        out = submit(cluster, account, opt_venv, name, *args, env=env)
        assert "DATA_ROOT=unset EXPECT=hot" in out, out
        assert "rc=1" in out and "hot=yes" not in out, out
        assert "DATA_ROOT is not set: no verified hot copy of" in out, out
        assert "failed verification" in out, out

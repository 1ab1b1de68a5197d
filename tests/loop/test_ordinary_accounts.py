"""What an ordinary account may reasonably run, run as one (an account made for the test,
hotcache installed in a root-owned venv on the system Python, as the docs say), against
a real cache on a loop-backed XFS with a verified hot copy: `copies`, `status`,
`slurm features`, `slurm task-prolog` and `python -m hotcache.adapters` answer from what
root recorded, and none of them fails on a device probe it has no right to make;
`doctor` says plainly that it needs root and where to look instead."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.accounts import run_as
from tests.helpers import hotcache
from tests.loop.test_kube_loop import build
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root

PROBE_ERRORS = ("cannot be opened", "blkid", "Traceback")


def test_an_ordinary_account_reads_what_root_proved_and_never_probes(open_sandbox, opt_venv,
                                                                     account):
    mp = build(open_sandbox)
    copy = mp / "ds"
    hotcache("copy", make_dataset(open_sandbox / "src", n=3), copy, "--name", "ds",
             "--version", "1", "--verify", check=True)
    index = open_sandbox / "state" / "verified-copies.json"
    assert stat.S_IMODE(index.stat().st_mode) == 0o644 and index.stat().st_uid == 0
    env = {"HOTCACHE_STATE": os.environ["HOTCACHE_STATE"],
           "HOTCACHE_FSTAB": os.environ["HOTCACHE_FSTAB"]}
    hc = opt_venv / "hotcache"

    def as_account(*argv, **extra):
        proc = run_as(account, [*argv], {**env, **extra})
        assert not any(e in proc.stderr + proc.stdout for e in PROBE_ERRORS), proc.stderr
        return proc

    proc = as_account(hc, "copies", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [c["path"] for c in json.loads(proc.stdout)["copies"]] == [str(copy)]

    proc = as_account(hc, "status")
    assert proc.returncode == 0, proc.stderr
    assert "not root: device probes need root" in proc.stdout, proc.stdout
    assert f"verified hot copy ds version 1: {copy}" in proc.stdout, proc.stdout
    proc = as_account(hc, "status", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["privileged"] is False, proc.stderr
    (row,) = doc["caches"]
    assert row["mounted"] and row["noatime"] and row["size_bytes"] > 0, row
    assert [c["path"] for c in row["verified_copies"]] == [str(copy)]
    proc = as_account(hc, "status", "--prometheus", "/tmp/x.prom")
    assert proc.returncode == 6 and "must run as root" in proc.stderr, proc.stderr

    proc = as_account(hc, "slurm", "features")
    assert proc.returncode == 0 and proc.stdout == "hc_ds_1\n", proc.stderr
    proc = as_account(hc, "slurm", "task-prolog", HOTCACHE_DATASET="ds")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"export DATA_ROOT={copy}\nexport DATA_ROOT_EXPECT=hot\n"
    proc = as_account(opt_venv / "python", "-m", "hotcache.adapters", DATA_ROOT=str(copy),
                      DATA_ROOT_EXPECT="hot")
    assert proc.returncode == 0 and "hot=yes" in proc.stdout, proc.stdout + proc.stderr

    proc = as_account(hc, "doctor")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert "probes block devices" in proc.stderr and "hotcache status" in proc.stderr

    # root finds the copy damaged: what the account sees follows at once
    victim = copy / "cat" / "001.jpg"
    victim.write_bytes(b"x" * victim.stat().st_size)
    assert hotcache("verify", copy).returncode == 5
    proc = as_account(hc, "slurm", "features")
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
    proc = as_account(hc, "status")
    assert "ds: its copy at" in proc.stdout and "failed verification" in proc.stdout, proc.stdout

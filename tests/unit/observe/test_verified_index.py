"""The verified-copies index and the TaskProlog that reads it (observe/verified_index.py,
observe/slurm.run_task_prolog): a job gets DATA_ROOT only for a copy root proved and
that is still that folder, mounted from that device, with that verification; otherwise
DATA_ROOT_EXPECT=hot, no DATA_ROOT, and the reason, which data_root() names. Real copies
on this host's filesystem; the index is written as root writes it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotcache.provision.observe import slurm, verified_index
from hotcache.provision.system import mountinfo
from tests.helpers import hotcache
from tests.unit.hotcopy.test_copy import make_dataset


@pytest.fixture
def node(tmp_path):
    """A verified hot copy `ds` version 1 and an index that offers it, as root writes it."""
    src = make_dataset(tmp_path / "src", n=3)
    dest = tmp_path / "hot" / "ds"
    dest.parent.mkdir()
    hotcache("copy", src, dest, "--name", "ds", "--version", "1", "--verify", check=True)
    state = tmp_path / "state" / "mappings.yaml"
    state.parent.mkdir()
    write_index(state, [entry_for(dest)])
    return state, dest


def entry_for(dest: Path, **over) -> dict:
    st = os.lstat(dest)
    meta = json.loads((dest / ".hotcache-copy.json").read_text())
    mount = mountinfo.holding(mountinfo.read(), str(dest))
    return {"name": "ds", "version": "1", "path": str(dest), "cache": "hot",
            "backend": "none", "mountpoint": mount.mountpoint,
            "mount_dev": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", "dev": st.st_dev,
            "inode": st.st_ino, "uid": st.st_uid, "verified_at": meta["verified_at"],
            "verify_mode": meta["verify_mode"], "partial": False, "source": None, **over}


def write_index(state: Path, copies: list[dict], **extra) -> None:
    doc = {"kind": verified_index.KIND, "format": verified_index.FORMAT,
           "written_at": "2026-12-05T00:00:00+00:00", "copies": copies, **extra}
    verified_index.path_for(state).write_text(json.dumps(doc))


def prolog(state: Path, **env) -> list[str]:
    return slurm.run_task_prolog(state, env)


def refused(lines: list[str]) -> str:
    """The reason a prolog gave no DATA_ROOT (failing when it gave one)."""
    assert not any(line.startswith("export DATA_ROOT=") for line in lines), lines
    assert "unset DATA_ROOT" in lines and "export DATA_ROOT_EXPECT=hot" in lines, lines
    (reason,) = [line.partition("=")[2] for line in lines
                 if line.startswith("export DATA_ROOT_UNSET_REASON=")]
    return reason


def test_a_job_naming_its_dataset_gets_the_copy_root_proved(node):
    state, dest = node
    want = [f"export DATA_ROOT={dest}", "export DATA_ROOT_EXPECT=hot"]
    assert prolog(state, HOTCACHE_DATASET="ds") == want
    assert prolog(state, HOTCACHE_DATASET="ds@1") == want
    assert prolog(state, HOTCACHE_DATASET="hc_ds_1") == want
    assert prolog(state, SLURM_JOB_ID="7", SLURM_JOB_CONSTRAINTS="gpu&hc_ds_1") == want
    # naming nothing of hotcache's: nothing, and no scontrol asked
    assert prolog(state) == []
    assert prolog(state, SLURM_JOB_ID="7", SLURM_JOB_CONSTRAINTS="gpu") == []
    assert "another version" not in refused(prolog(state, HOTCACHE_DATASET="ds@2"))
    # and the real entry point, as the helper script runs it
    out = hotcache("slurm", "task-prolog", "--state", state, env={"HOTCACHE_DATASET": "ds"})
    assert out.returncode == 0 and out.stdout.splitlines() == want, out.stderr


def test_a_folder_swapped_in_at_the_copys_path_is_not_offered(node):
    state, dest = node
    twin = dest.parent / "twin"
    shutil.copytree(dest, twin)             # the same files, metadata saying verified
    dest.rename(dest.parent / "aside")
    twin.rename(dest)
    assert "is not the folder root verified" in refused(prolog(state, HOTCACHE_DATASET="ds"))


def test_a_copy_whose_verification_failed_since_is_not_offered(node):
    state, dest = node
    victim = dest / "cat" / "000.jpg"
    victim.write_bytes(b"X" * victim.stat().st_size)
    assert hotcache("verify", dest, "--full").returncode == 5      # no mapping: no refresh
    why = refused(prolog(state, HOTCACHE_DATASET="ds"))
    assert "no verified hot copy of ds" in why and "did not pass" in why, why


def test_an_index_entry_whose_mount_is_gone_is_not_offered(node, tmp_path):
    state, dest = node
    write_index(state, [entry_for(dest, mountpoint=str(tmp_path / "not-mounted"))])
    assert "is not mounted" in refused(prolog(state, HOTCACHE_DATASET="ds"))
    write_index(state, [entry_for(dest, mount_dev="254:99")])
    assert "not mounted from the device" in refused(prolog(state, HOTCACHE_DATASET="ds"))


def test_no_index_or_a_broken_one_offers_nothing_and_says_so(node):
    state, _dest = node
    index = verified_index.path_for(state)
    index.write_text("{not json")
    assert "cannot be read" in refused(prolog(state, HOTCACHE_DATASET="ds"))
    index.write_text(json.dumps({"kind": "other", "copies": []}))
    assert "not an index hotcache writes" in refused(prolog(state, HOTCACHE_DATASET="ds"))
    index.unlink()
    os.mkfifo(index)                 # never blocks on a FIFO planted at its name
    assert "cannot be read" in refused(prolog(state, HOTCACHE_DATASET="ds"))
    index.unlink()
    assert "no index of verified copies" in refused(prolog(state, HOTCACHE_DATASET="ds"))


def test_what_root_found_wrong_with_a_copy_is_the_reason_given(node):
    state, dest = node
    write_index(state, [], unverified=[{"name": "ds", "version": "1", "path": str(dest),
                                         "state": "failed verification"}])
    why = refused(prolog(state, HOTCACHE_DATASET="ds"))
    assert f"its copy at {dest}: failed verification" in why, why
    why = refused(prolog(state, SLURM_JOB_ID="7", SLURM_JOB_CONSTRAINTS="hc_ds_1"))
    assert f"its copy at {dest}: failed verification" in why, why


def test_checks_that_do_not_answer_cost_the_limit_not_the_job(node, monkeypatch):
    state, _dest = node

    def hangs(entry, mounts):      # a stat on a dead device
        time.sleep(60)

    monkeypatch.setattr(verified_index, "stale", hangs)
    lines = slurm.run_task_prolog(state, {"HOTCACHE_DATASET": "ds"}, limit=0.2)
    assert "did not answer within 0.2 s" in refused(lines)


def test_data_root_names_the_reason_the_prolog_gave(node):
    """The job's side: the prolog's lines applied to the environment, then the adapter's
    `python -m hotcache.adapters`, which fails naming why."""
    state, dest = node
    (dest / "cat" / "000.jpg").write_bytes(b"rot")
    hotcache("verify", dest)
    lines = prolog(state, HOTCACHE_DATASET="ds")
    env = {k: v for k, v in os.environ.items() if k != "DATA_ROOT"}
    for line in lines:
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = value
    proc = subprocess.run([sys.executable, "-m", "hotcache.adapters"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout
    assert "DATA_ROOT is not set: no verified hot copy of ds on this node" in proc.stderr
    assert "did not pass" in proc.stderr, proc.stderr


def test_the_index_is_root_only_and_readable_by_everyone(tmp_path):
    state = tmp_path / "mappings.yaml"
    if os.geteuid() != 0:       # another account's findings never count
        assert verified_index.write(state, [], {}) is None
        return
    assert verified_index.write(state, [], {}) == verified_index.path_for(state)
    assert verified_index.path_for(state).stat().st_mode & 0o777 == 0o644
    assert verified_index.read(state) == ([], "")


def test_a_status_run_that_cannot_check_the_host_empties_the_index(node, monkeypatch):
    """The metrics timer's `status` as root: when a probe fails, what jobs read is
    emptied rather than left promising what root can no longer prove."""
    from hotcache.provision import mapping
    from hotcache.provision.cli import commands
    from hotcache.provision.engine import status as engine_status
    from hotcache.provision.errors import ProbeFailed

    state, _dest = node
    mapping.save(state, mapping.empty())
    assert prolog(state, HOTCACHE_DATASET="ds")[0].startswith("export DATA_ROOT=")

    def fails(*args, **kwargs):
        raise ProbeFailed(["blkid", "/dev/vdb"], 2, "cannot open")

    monkeypatch.setattr(engine_status, "host_status", fails)
    if os.geteuid() != 0:
        return                                  # only root writes the index
    with pytest.raises(ProbeFailed):
        commands.status(name=None, as_json=False, state=state, fstab=None, prometheus=None,
                        node_labels=None, slurm_push=False, interval=0)
    assert verified_index.read(state) == ([], "")
    assert "no verified hot copy of ds" in refused(prolog(state, HOTCACHE_DATASET="ds"))


def test_a_folder_swapped_in_while_root_writes_the_index_is_never_indexed(node, monkeypatch):
    """Between nodelabels' check of the record and the index's own look at the folder, a
    member swaps hers in: the index describes what the record names, or nothing."""
    from hotcache.provision.observe import nodelabels
    from tests.helpers import entry_record

    _state, dest = node
    roots = os.lstat(dest)
    dest.rename(dest.parent / "roots")
    shutil.copytree(dest.parent / "roots", dest)          # hers, metadata and all
    entry = entry_record("hot", hot_copies={str(dest): {
        "name": "ds", "version": "1", "dev": roots.st_dev, "inode": roots.st_ino,
        "uid": roots.st_uid}})
    seen = [{"name": "ds", "version": "1", "path": str(dest), "cache": "hot",
             "backend": "none"}]                           # as checked before the swap
    monkeypatch.setattr(nodelabels, "verified_copies", lambda rows, caches, listed=None: seen)
    assert verified_index.entries([], {"hot": entry}) == []


def test_root_lists_the_copies_once_for_both_lists(node, monkeypatch):
    """The index's verified copies and its unverified ones come from one listing of the
    hot copies (each copy's metadata read there once), not one listing each."""
    from hotcache.provision.observe import nodelabels
    from tests.helpers import entry_record

    state, dest = node
    st = os.lstat(dest)
    entry = entry_record("hot", hot_copies={str(dest): {
        "name": "ds", "version": "1", "dev": st.st_dev, "inode": st.st_ino, "uid": st.st_uid}})
    row = {"name": "hot", "backend": "none", "mounted": True, "state": "ready", "findings": []}
    calls = []
    listing = nodelabels.hot_copies
    monkeypatch.setattr(nodelabels, "hot_copies",
                        lambda *args: calls.append(args) or listing(*args))
    if os.geteuid() != 0:
        return                                  # only root writes the index
    verified_index.write(state, [row], {"hot": entry})
    assert len(calls) == 1, calls
    doc = json.loads(verified_index.path_for(state).read_text())
    assert [c["path"] for c in doc["copies"]] == [str(dest)] and doc["unverified"] == []

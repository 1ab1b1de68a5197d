""""Verified" on a shared hot tier: a cache built by `hotcache apply` (XFS on a loop
device) whose mount a second account can write to (group, 2775). A folder the member
makes with a metadata file that says `verify_ok: true`, or puts in place of root's copy,
never appears in the node labels, the Kubernetes manifests or as verified in the
metrics; root's own recorded copy does."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hotcache.provision.hotcopy import format as hotcopy_format
from hotcache.provision.observe import nodelabels
from tests.helpers import hotcache
from tests.loop.test_kube_loop import build, labels_now
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


def forge(folder, user, name: str) -> None:
    """What any member can write: a complete-looking copy that says it was verified."""
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"the member's bytes\n")
    (folder / hotcopy_format.MANIFEST).write_text("")
    meta = {"format": hotcopy_format.FORMAT, "complete": True, "name": name,
            "version": "1", "files": 1, "bytes": 19,
            "copied_at": "2099-01-01T00:00:00+00:00",
            "verified_at": "2099-01-01T00:00:00+00:00", "verify_ok": True}
    (folder / hotcopy_format.METADATA).write_text(json.dumps(meta))
    for p in [folder, *folder.iterdir()]:
        os.lchown(p, user.pw_uid, user.pw_gid)


def manifests_paths() -> list[str]:
    proc = hotcache("kube", "manifests", "--node", "gpu-node-1", "--uid", "1500", "--json")
    assert proc.returncode == 0, proc.stderr
    return [d["spec"]["local"]["path"] for d in json.loads(proc.stdout)["items"]
            if d["kind"] == "PersistentVolume"]


def verify_ok_samples(sandbox) -> str:
    text = (sandbox / "hotcache.prom").read_text()
    return "\n".join(line for line in text.splitlines()
                     if line.startswith("hotcache_hot_copy_verify_ok{") and line.endswith(" 1.0"))


def test_a_members_forged_copy_is_never_published_as_verified(sandbox, user):
    mp = build(sandbox)
    os.chown(mp, 0, user.pw_gid)
    os.chmod(mp, 0o2775)
    src = make_dataset(sandbox / "src")
    hotcache("copy", src, mp / "toy", "--name", "toy", "--version", "3", "--verify", check=True)
    forge(mp / "imagenet", user, "imagenet")
    got = labels_now(sandbox)
    assert got[f"{nodelabels.PREFIX}/ds-toy_3"] == "verified"
    assert not any("imagenet" in k for k in got), got
    assert manifests_paths() == [str(mp / "toy")]
    assert "imagenet" not in verify_ok_samples(sandbox)
    assert "toy" in verify_ok_samples(sandbox)

    # the member moves root's copy away and puts a forged one at its path
    os.rename(mp / "toy", mp / "toy-moved")
    forge(mp / "toy", user, "toy")
    got = labels_now(sandbox)
    assert not any("ds-toy" in k for k in got), got
    assert manifests_paths() == []
    assert "toy" not in verify_ok_samples(sandbox)
    shutil.rmtree(mp / "toy")


def test_data_root_expect_hot_takes_only_a_recorded_copy(sandbox, user, monkeypatch):
    """A training job's `data_root(expect="hot")` on a host whose mapping it can see: a
    member's forged copy, or one put in place of root's, is `unrecorded` and refused;
    root's own recorded copy is hot."""
    from hotcache.adapters.dataroot import DataRootError, data_root, describe

    mp = build(sandbox)
    os.chown(mp, 0, user.pw_gid)
    os.chmod(mp, 0o2775)
    hotcache("copy", make_dataset(sandbox / "src"), mp / "toy", "--verify", check=True)
    forge(mp / "imagenet", user, "imagenet")
    toy = describe(mp / "toy")
    assert (toy.view.state, toy.hot) == ("fresh", "yes")
    assert describe(mp / "imagenet").copy.state == "unrecorded"
    monkeypatch.setenv("DATA_ROOT", str(mp / "imagenet" / "a.jpg").rsplit("/", 1)[0])
    with pytest.raises(DataRootError, match="mapping records no copy there"):
        data_root(expect="hot")

    os.rename(mp / "toy", mp / "toy-moved")
    forge(mp / "toy", user, "toy")
    assert describe(mp / "toy").copy.state == "unrecorded"
    monkeypatch.setenv("DATA_ROOT", str(mp / "toy"))
    with pytest.raises(DataRootError, match="mapping records no copy there"):
        data_root(expect="hot")
    shutil.rmtree(mp / "toy")
    os.rename(mp / "toy-moved", mp / "toy")
    assert data_root(expect="hot").hot == "yes"

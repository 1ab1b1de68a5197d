"""The whole path an administrator and an ML engineer walk, on real loop devices:
apply a cache, copy a hot subset onto it, point DATA_ROOT at it, and read the one log
line that says which copy the job used and what backs it."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest

from hotcache.adapters import data_root
from hotcache.adapters.dataroot import DataRootError
from tests.helpers import hotcache, hotcache_json, loop_spec

pytestmark = pytest.mark.root


def test_cache_then_hot_copy_then_data_root(sandbox, monkeypatch, caplog):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    src = sandbox / "cold" / "ds"
    for cls in ("cat", "dog"):
        (src / cls).mkdir(parents=True)
        for i in range(5):
            (src / cls / f"{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    dest = sandbox / "mnt" / "hot" / "ds"
    hotcache("copy", src, dest, "--name", "ds", "--version", "v1", check=True)
    subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=dest, check=True)

    rc, doc = hotcache_json("copies")
    assert rc == 0 and any(c.get("name") == "ds" for c in doc["copies"]), doc

    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    monkeypatch.setenv("HOTCACHE_LOG", "json")
    monkeypatch.setenv("DATA_ROOT", str(dest))
    assert data_root().copy.state == "unverified", "hashed while copying, not yet read back"
    hotcache("verify", dest, "--full", check=True)
    root = data_root()
    line = json.loads(caplog.records[-1].getMessage())
    assert line["path"] == str(dest) and line["hot"] is True
    assert line["copy"]["name"] == "ds" and line["copy"]["version"] == "v1"
    assert line["fs"] == "xfs" and line["device"].startswith("loop")
    assert root.copy.is_hot

    monkeypatch.setenv("DATA_ROOT", str(src))
    assert data_root().copy.is_hot is False
    with pytest.raises(DataRootError) as info:
        data_root(expect="hot")
    assert f"DATA_ROOT {src}" in str(info.value) and "hot copy was expected" in str(info.value)

    proc = hotcache("teardown", "hot", "--yes")
    assert proc.returncode == 0, proc.stderr

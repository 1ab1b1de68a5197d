"""The spec examples/demo.py writes is a valid host spec for every fast tier it may pick
(this host runs neither block cache, so the loop tier only ever builds `none`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hotcache.provision.engine.spec import load_spec

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.py"


def demo_module():
    spec = importlib.util.spec_from_file_location("demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", [None, "bcache", "dm-cache"])
def test_demo_spec_is_valid(tmp_path, backend):
    demo = demo_module()
    path = tmp_path / "demo.yaml"
    demo.write_spec(path, tmp_path, tmp_path / "mnt", backend)
    host = load_spec(path)
    origin, fast = host.caches
    assert (origin.name, origin.backend) == ("demo-hdd", backend or "none")
    assert (origin.cache is not None) == bool(backend)
    assert (fast.name, fast.backend) == ("demo", "none")
    assert origin.filesystem.persist == fast.filesystem.persist == "none"
    assert origin.origin.loop.file == str(tmp_path / "hdd.img")

"""One `data_root()` parses the host's mapping once and passes what it read down: the
stale-view check and the check that the mapping records the copy both use that one
parse. A real cache on a loop-backed XFS with a recorded, verified hot copy (a fresh
view, so both checks run), data_root() called in this process with the YAML parser
counted."""

from __future__ import annotations

import traceback

import pytest
import yaml

from hotcache.adapters.dataroot import data_root
from tests.helpers import hotcache
from tests.loop.test_kube_loop import build
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


def test_one_data_root_parses_the_mapping_once(sandbox, monkeypatch):
    mp = build(sandbox)
    hotcache("copy", make_dataset(sandbox / "src", n=2), mp / "ds", "--name", "ds",
             "--verify", check=True)
    parsed: list[str] = []
    inside = []      # safe_load calls load: count the outermost call only
    for name in ("safe_load", "load"):
        real = getattr(yaml, name)

        def counted(*args, _real=real, **kwargs):
            if not inside:
                parsed.append(traceback.extract_stack()[-2].name)
            inside.append(1)
            try:
                return _real(*args, **kwargs)
            finally:
                inside.pop()

        monkeypatch.setattr(yaml, name, counted)
    monkeypatch.setenv("DATA_ROOT", str(mp / "ds"))
    root = data_root(expect="hot")
    assert (root.view.state, root.hot, root.copy.state) == ("fresh", "yes", "hot")
    assert len(parsed) == 1, parsed

"""One `hotcache status --prometheus FILE --node-labels FILE` (the metrics timer's run)
parses the mapping once and passes it down: the rows, the verified-copies index, the
metrics and the node labels all read that one parse. A real cache on a loop-backed XFS
with a verified hot copy, the command run in this process with the parser counted."""

from __future__ import annotations

import pytest

from hotcache.provision import mapping
from hotcache.provision.cli import commands
from tests.helpers import hotcache
from tests.loop.test_kube_loop import build
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


def test_the_metrics_timers_status_parses_the_mapping_once(sandbox, monkeypatch):
    mp = build(sandbox)
    hotcache("copy", make_dataset(sandbox / "src", n=2), mp / "ds", "--name", "ds",
             "--verify", check=True)
    parsed = []
    real = mapping.load

    def counted(path):
        parsed.append(str(path))
        return real(path)

    monkeypatch.setattr(mapping, "load", counted)
    prom, labels = sandbox / "hotcache.prom", sandbox / "labels"
    commands.status(name=None, as_json=False, state=None, fstab=None, prometheus=prom,
                    node_labels=labels, slurm_push=False, interval=0)
    assert len(parsed) == 1, parsed
    assert "hotcache_hot_copy" in prom.read_text() and "ds-ds_1=verified" in labels.read_text()

"""`copy --fit` on a real XFS that cannot hold the dataset: the subset fits with the
margin, is stratified per class, and is the same on a re-run and on a fresh draw."""

from __future__ import annotations

import json

import pytest

from tests.helpers import hotcache_json
from tests.loop.test_copy_xfs import fill_until, free_bytes, small_xfs
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root

CLASSES = {"a": 30, "b": 20, "c": 10}


def members(dest):
    return sorted((dest / "SHA256SUMS").read_text().split()[1::2])


def test_fit_on_a_tier_half_the_dataset(sandbox):
    mp = small_xfs(sandbox, "fit")
    fill_until(mp, 100 << 20)
    src = sandbox / "src"
    for cls, n in CLASSES.items():
        make_dataset(src, classes=(cls,), n=n, size=3 << 20)       # ~180 MiB in all
    free = free_bytes(mp)
    dest = mp / "ds"
    rc, out = hotcache_json("copy", src, dest, "--fit", "--seed", "7")
    assert rc == 0, out
    meta = json.loads((dest / ".hotcache-copy.json").read_text())
    assert meta["bytes"] * 1.2 <= free, "the subset must fit with the 20% margin"
    assert meta["selection"]["rule"] == "fit" and meta["selection"]["seed"] == 7
    assert out["sizing"]["case"] == "does not fit" and meta["partial"]
    share = meta["selection"]["class_fraction"]
    counts = {}
    for rel in members(dest):
        if "/" in rel:
            counts[rel.split("/")[0]] = counts.get(rel.split("/")[0], 0) + 1
    assert counts == {c: int(share * n + 1e-9) for c, n in CLASSES.items()}
    assert 0.2 < share < 0.8
    first = members(dest)
    rc, again = hotcache_json("copy", src, dest, "--fit", "--seed", "7")
    assert rc == 0 and not again["changed"] and members(dest) == first
    # a fresh draw onto the same free space picks the same files
    import shutil
    shutil.rmtree(dest)
    rc, fresh = hotcache_json("copy", src, dest, "--fit", "--seed", "7")
    assert rc == 0 and members(dest) == first

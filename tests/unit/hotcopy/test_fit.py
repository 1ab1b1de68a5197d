"""`copy --fit` / `--budget`: the largest stratified subset within a budget, the sizing
advice's three cases, and bad budgets refused before anything is written."""

from __future__ import annotations

import json
import os

import pytest

from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy.selection import _ranked_classes, fit, select
from hotcache.provision.hotcopy.sizing import FITS, SPILLS, TIGHT, advise, budget_bytes, budget_size
from tests.helpers import hotcache, hotcache_json


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for cls, n in (("cat", 40), ("dog", 20), ("owl", 10)):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            (root / cls / f"{i:03}.jpg").write_bytes(os.urandom(1000 + 37 * i))
    return root


def per_class(rels):
    out = {}
    for r in rels:
        out[r.split("/")[0]] = out.get(r.split("/")[0], 0) + 1
    return out


def test_fit_takes_the_same_largest_share_of_every_class(src):
    sel = select(src)
    budget = sel.bytes // 2
    picked, share = fit(sel, budget, seed=3)
    assert picked.bytes <= budget
    counts = per_class(e.rel for e in picked.entries)
    assert counts == {"cat": int(share * 40), "dog": int(share * 20), "owl": int(share * 10)}
    step, _ = fit(sel, picked.bytes + 1, seed=3)
    assert step.entries == picked.entries          # nothing more fits one byte above it
    again, share2 = fit(select(src), budget, seed=3)
    assert [e.rel for e in again.entries] == [e.rel for e in picked.entries] and share2 == share
    other, _ = fit(sel, budget, seed=4)
    assert [e.rel for e in other.entries] != [e.rel for e in picked.entries]


def test_fit_is_the_largest_share_that_fits(src):
    sel = select(src)
    budget = sel.bytes * 3 // 10
    picked, share = fit(sel, budget, seed=0)
    shares = sorted({j / n for n in (40, 20, 10) for j in range(1, n + 1)})
    nxt = shares[shares.index(share) + 1]
    # recompute the cost of the next share from the same ranking: it must exceed the budget
    cost = sum(sum(e.size for e in m[:int(nxt * len(m) + 1e-9)])
               for m in _ranked_classes(sel, 0))
    assert cost > budget >= picked.bytes


@pytest.mark.parametrize("need,capacity,case", [(100, 150, FITS), (100, 120, FITS),
                                                 (100, 110, TIGHT), (100, 100, TIGHT),
                                                 (100, 60, SPILLS)])
def test_advice_cases(need, capacity, case):
    a = advise(need << 30, capacity << 30)
    assert a.case == case
    if case == SPILLS:
        assert "thrash" in a.message and "--fit" in a.message
        assert a.hot_share == pytest.approx(0.5) and "expected hot share 50%" in a.message
    if case == TIGHT:
        assert "without margin" in a.message
    if case == FITS:
        assert a.hot_share == 1.0


def test_budget_parsing(tmp_path):
    assert budget_size("200G") == 200 << 30 and budget_size("1.5MiB") == int(1.5 * (1 << 20))
    for bad in ("lots", "-3G", "0", "12X"):
        with pytest.raises(UsageError, match="--budget"):
            budget_size(bad)
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    assert budget_bytes(None, tmp_path)[0] == pytest.approx(free, rel=0.01)
    half, how = budget_bytes("50%", tmp_path)
    st = os.statvfs(tmp_path)       # other work on the disk may have freed space meanwhile
    assert half <= max(free, st.f_bavail * st.f_frsize) and ("50%" in how)
    small, how = budget_bytes("1M", tmp_path)
    assert small == 1 << 20 and how == "--budget 1M"
    with pytest.raises(UsageError, match="at most 100%"):
        budget_bytes("150%", tmp_path)


@pytest.mark.parametrize("args,needle", [(["--budget", "lots"], "--budget lots"),
                                          (["--budget", "0%"], "above 0%"),
                                          (["--fit", "--fraction", "0.5"], "--fit/--budget"),
                                          (["--redraw"], "--redraw"),
                                          (["--budget", "10"], "not even one file")])
def test_bad_fit_options_change_nothing(src, tmp_path, args, needle):
    dest = tmp_path / "hot"
    proc = hotcache("copy", src, dest, *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not dest.exists() and not any(p.name.endswith("staging") for p in tmp_path.iterdir())


def test_refresh_keeps_members_until_redraw(src, tmp_path):
    dest = tmp_path / "hot"
    budget = str(select(src).bytes // 2)
    rc, first = hotcache_json("copy", src, dest, "--budget", budget)
    assert rc == 0 and first["partial"] and first["fit"]["rule"] == "fit"
    members = set((dest / "SHA256SUMS").read_text().split()[1::2])
    meta = json.loads((dest / ".hotcache-copy.json").read_text())
    assert meta["selection"]["rule"] == "fit" and meta["fraction"] == first["fraction"]
    assert 0 < meta["fraction"] < 1 and meta["source_files"] == 70
    # SRC grows: a refresh keeps the same members (and copies none of the new files)
    (src / "cat" / "new.jpg").write_bytes(b"x" * 10)
    rc, again = hotcache_json("copy", src, dest, "--budget", str(int(budget) * 2))
    assert rc == 0 and not again["changed"]
    assert set((dest / "SHA256SUMS").read_text().split()[1::2]) == members
    rc, redrawn = hotcache_json("copy", src, dest, "--budget", str(int(budget) * 2), "--redraw")
    assert rc == 0 and redrawn["changed"] and redrawn["files"] > len(members)

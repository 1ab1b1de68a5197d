"""`hotcache warm`'s decisions for smq caches: the focused sweep's windows, when a window
or the full passes stop, and the whole loop against scripted cache statistics (the real
dm-cache runs are in the guest-kernel tier and bench/bench_vm_cache.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotcache.provision import warm as w

MIB = 1 << 20


def fake_files(sizes: list[int]) -> list[tuple[Path, int]]:
    return [(Path(f"/d/f{i:03d}"), s) for i, s in enumerate(sizes)]


def test_windows_cut_path_ordered_files_into_runs_of_similar_size():
    files = fake_files([MIB] * 100)
    parts = w.windows(list(reversed(files)))
    assert len(parts) == w.WINDOWS
    assert [f for part in parts for f in part] == files          # every file once, in order
    sizes = [sum(s for _, s in part) for part in parts]
    assert max(sizes) - min(sizes) <= MIB


@pytest.mark.parametrize("total_mib, count", [(1, 1), (8, 1), (24, 3), (4096, w.WINDOWS)])
def test_small_data_sets_get_fewer_windows(total_mib, count):
    assert len(w.windows(fake_files([MIB] * total_mib))) == count


def reads(*gains: int) -> list[dict]:
    return [{"promoted": g} for g in gains]


@pytest.mark.parametrize("gains, done", [
    ((0,), False), ((0, 0), False), ((0, 0, 0), True),       # smq will not take it now
    ((5,), False), ((5, 3), False), ((5, 3, 0), True), ((0, 4, 0), True),
    ((1,) * w.WINDOW_READS, True),                            # bounded
])
def test_a_window_is_read_until_its_promotions_stop(gains, done):
    assert w.window_done(reads(*gains)) is done


def full(fps: float | None, promoted: int, rising: bool = True, total: int = 3000) -> dict:
    return {"files_per_s": fps, "promoted": promoted, "rising": rising,
            "stats": {"promotions": total}}


def test_full_passes_stop_when_promotion_stops_or_dwindles():
    assert w.settled([full(100, 50)]) is None
    assert w.settled([full(300, 50), full(302, 17, total=2923)]) is None   # rate alone: no
    assert "dwindled (3 in the last pass, 3129 in all)" in \
        w.settled([full(300, 50), full(600, 3, total=3129)])
    assert w.settled([full(100, 50), full(90, 0, rising=False)]) == \
        "promotions and cache use stopped rising"
    assert w.settled([{"stats": None}]) == "no cache statistics to follow"


class ScriptedCache:
    """Promotions that rise by the scripted gains, one step per stats() call."""

    def __init__(self, gains: list[int]):
        self.gains, self.total, self.calls = list(gains), 0, 0

    def __call__(self) -> dict:
        if self.calls:
            self.total += self.gains.pop(0) if self.gains else 0
        self.calls += 1
        return {"promotions": self.total, "cache_used_bytes": self.total * 65536,
                "hit_ratio": None}


def dataset(tmp_path: Path, files: int, size: int) -> Path:
    for i in range(files):
        (tmp_path / f"f{i:03d}.bin").write_bytes(bytes([i % 251]) * size)
    return tmp_path


def no_metadata_drop(monkeypatch) -> list[int]:
    """Count the dentry/inode drops instead of doing them (host-wide, on a shared host)."""
    calls: list[int] = []
    monkeypatch.setattr(w, "forget_metadata", lambda: calls.append(1) or True)
    return calls


def test_smq_warm_sweeps_then_reads_everything_until_it_settles(tmp_path, monkeypatch):
    monkeypatch.setattr(w, "TICK", 0)          # no waiting between re-reads in this test
    drops = no_metadata_drop(monkeypatch)
    data = dataset(tmp_path, 4, 4096)
    # one window (tiny data): reads promote 3, 2, 0 -> done; full passes: 1, 0 -> settled
    cache = ScriptedCache([3, 2, 0, 1, 0])
    report = w.warm(data, backend="dm-cache", stats=cache, max_passes=10, jobs=2)
    assert report["sweep"] == [{"window": 1, "files": 4, "reads": 3, "promoted": 5,
                                "seconds": report["sweep"][0]["seconds"]}]
    assert [p["promoted"] for p in report["passes"]] == [1, 0]
    assert all(p["bytes"] == 4 * 4096 and p["files"] == 4 for p in report["passes"])
    assert report["stopped"] == "promotions and cache use stopped rising"
    assert report["after"]["promotions"] == 6
    assert report["metadata_reread"] and len(drops) == 3 + 2   # before every read


def test_the_full_passes_are_bounded_and_other_caches_read_once(tmp_path, monkeypatch):
    monkeypatch.setattr(w, "TICK", 0)
    no_metadata_drop(monkeypatch)
    data = dataset(tmp_path, 2, 4096)
    report = w.warm(data, backend="lvmcache", stats=ScriptedCache([9] * 50), max_passes=3)
    assert len(report["sweep"][0:1]) == 1 and report["sweep"][0]["reads"] == w.WINDOW_READS
    assert len(report["passes"]) == 3 and "max-passes 3" in report["stopped"]
    once = w.warm(data, backend="bcache", stats=ScriptedCache([9] * 50), max_passes=3)
    assert (once["sweep"], len(once["passes"])) == ([], 1)
    blind = w.warm(data, backend="dm-cache", stats=lambda: None, max_passes=3)
    assert (blind["sweep"], len(blind["passes"]), blind["stopped"]) == \
        ([], 1, "no cache statistics to follow")


def test_metadata_is_not_dropped_for_the_page_cache_or_when_not_allowed(tmp_path,
                                                                       monkeypatch):
    data = dataset(tmp_path, 2, 4096)
    drops = no_metadata_drop(monkeypatch)
    report = w.warm(data, backend="none")
    assert (drops, report["metadata_reread"]) == ([], False)
    monkeypatch.setattr(w, "forget_metadata", lambda: (drops.append(1), False)[1])
    report = w.warm(data, backend="bcache", stats=ScriptedCache([1]))
    assert (len(drops), report["metadata_reread"]) == (1, False)   # tried once, then not

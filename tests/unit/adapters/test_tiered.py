"""Tiered reads with real PyTorch and TensorFlow: a partial hot copy in front of the whole
dataset. The hot copy's files are written with other bytes than the cold root's, so each
delivered sample proves which root it was read from."""

from __future__ import annotations

import logging
import shutil

import pytest

from hotcache.adapters import data_root, timed
from hotcache.adapters.errors import DataRootError
from tests.unit.adapters.helpers import make_jpegs, write_hot_copy

PER_CLASS = 6


@pytest.fixture
def tiers(tmp_path, monkeypatch):
    """cold: 18 JPEGs; hot: a verified copy of the even-numbered half, other bytes."""
    for var in ("DATA_ROOT", "DATA_COLD_ROOT", "DATA_ROOT_EXPECT", "HOTCACHE_LOG"):
        monkeypatch.delenv(var, raising=False)
    cold = tmp_path / "cold"
    rels = [r for r, _ in make_jpegs(cold, per_class=PER_CLASS)]
    alt = tmp_path / "alt"
    make_jpegs(alt, per_class=PER_CLASS, size=(24, 18))
    members = {r for r in rels if int(r[-7:-4]) % 2 == 0}
    sub = tmp_path / "subset"
    for r in members:
        (sub / r).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(alt / r, sub / r)
    hot = write_hot_copy(sub, tmp_path / "hot", meta_extra={
        "partial": True, "fraction": 0.5, "source_files": 18,
        "selection": {"rule": "fit", "seed": 0}})
    expected = {}
    for r in rels:
        source = hot if r in members else cold
        expected[(source / r).read_bytes()] = (r, r in members)
    return hot, cold, members, expected


def check_epoch(samples, members, expected):
    """Every sample exactly once; members from the hot root, the rest from the cold."""
    seen = [expected[s] for s in samples]          # KeyError: bytes of neither the right tier
    assert sorted(r for r, _ in seen) == sorted(r for r, _ in expected.values())
    assert {r for r, hot in seen if hot} == members


def test_log_line_and_expect(tiers, monkeypatch, caplog):
    hot, cold, members, _ = tiers
    with caplog.at_level(logging.INFO, "hotcache.adapters"):
        root = data_root(hot=hot, cold=cold, expect="partial")
    line = caplog.records[-1].getMessage()
    assert "hot=partial fraction=0.50" in line and f"cold={cold}" in line
    assert root.tiers.members == frozenset(members)
    with pytest.raises(DataRootError, match="(?s)partial hot copy .*expect='partial'"):
        data_root(hot=hot, cold=cold, expect="hot")
    monkeypatch.setenv("DATA_ROOT", str(hot))
    monkeypatch.setenv("DATA_COLD_ROOT", str(cold))
    assert data_root(expect="partial").tiers.cold == cold
    monkeypatch.setenv("DATA_COLD_ROOT", str(cold / "nope"))
    with pytest.raises(DataRootError, match="DATA_COLD_ROOT"):
        data_root()


def test_unverified_copy_serves_nothing_hot(tiers, tmp_path):
    _hot, cold, members, _ = tiers
    other = write_hot_copy(tmp_path / "subset", tmp_path / "unverified", verified=False,
                           meta_extra={"partial": True, "fraction": 0.5})
    root = data_root(hot=other, cold=cold)
    assert root.hot == "no" and not root.tiers.members
    with pytest.raises(DataRootError, match="verification"):
        data_root(hot=other, cold=cold, expect="partial")


def test_torch_reads_each_file_once_from_its_tier(tiers, caplog):
    from hotcache.adapters import make_loader

    hot, cold, members, expected = tiers
    root = data_root(hot=hot, cold=cold)
    loader = make_loader(root, decode=False, batch_size=3, num_workers=2, log_every=2,
                         persistent_workers=False)
    with caplog.at_level(logging.INFO, "hotcache.adapters"):
        for _epoch in range(2):
            samples = [s for batch, _labels in loader for s in batch]
            check_epoch(samples, members, expected)
    assert [s.hot_share for s in loader.summaries] == [0.5, 0.5]
    last = loader.summaries[-1]
    assert last.hot_batches + last.cold_batches == 5     # 6 batches, the first apart
    windows = [r.getMessage() for r in caplog.records if "timing (so far)" in r.getMessage()]
    assert windows and all(" hot=" in w and "wait hot=" in w for w in windows)
    assert " hot=0.50 " in loader.summaries[-1].line()


def test_torch_batched_decoding_counts_the_hot_share(tiers):
    """Whole batches decoded in place (a fixed image_size) know their tiers too."""
    from hotcache.adapters import make_loader

    hot, cold, _members, _ = tiers
    loader = make_loader(data_root(hot=hot, cold=cold), image_size=(8, 8), batch_size=4,
                         num_workers=1, decode_threads=2, persistent_workers=False)
    labels = [int(x) for _images, batch_labels in loader for x in batch_labels]
    assert sorted(labels) == sorted([0, 1, 2] * PER_CLASS)
    assert loader.summaries[-1].hot_share == 0.5


def test_torch_falls_back_and_names_a_file_missing_from_both(tiers):
    from hotcache.adapters import make_loader

    hot, cold, members, _ = tiers
    gone, lost = sorted(members)[:2]
    (hot / gone).unlink()                  # a member lost from the copy: read cold
    (hot / lost).unlink()
    (cold / lost).unlink()                 # ... and from the origin too: an error
    ds = make_loader(data_root(hot=hot, cold=cold), decode=False, num_workers=0).dataset
    i = ds.rels.index(gone)
    assert ds.fetch(i)[1] is False
    with pytest.raises(DataRootError, match=f"{lost}: missing from both"):
        ds.fetch(ds.rels.index(lost))


def test_tf_reads_each_file_once_from_its_tier(tiers, caplog):
    from hotcache.adapters import make_dataset

    hot, cold, members, expected = tiers
    ds = make_dataset(data_root(hot=hot, cold=cold), decode=False, batch_size=3, seed=1)
    timer = timed(ds, log_every=2)
    with caplog.at_level(logging.INFO, "hotcache.adapters"):
        for _epoch in range(2):
            samples = [s for batch, _labels in timer for s in batch.numpy()]
            check_epoch(samples, members, expected)
    assert [s.hot_share for s in timer.summaries] == [0.5, 0.5]
    assert timer.summaries[-1].hot_batches + timer.summaries[-1].cold_batches == 5
    windows = [r.getMessage() for r in caplog.records if "timing (so far)" in r.getMessage()]
    assert windows and all(" hot=" in w for w in windows)


def test_hot_and_cold_waits_are_split_by_batch():
    """Batches served mostly hot and mostly cold get their own mean wait; the first
    batch counts toward the share only (its wait is reported apart)."""
    from hotcache.adapters.timing import summarize

    stamps = [(0.1, 4, 4), (0.1, 4, 4), (0.1, 0, 4), (0.1, 3, 4), (0.1, 1, 4)]
    s = summarize("t", 0, 0.5, [0.001, 0.030, 0.003, 0.040], 1.0, 4, stamps)
    assert s.hot_share == pytest.approx(12 / 20)
    assert (s.hot_batches, s.cold_batches) == (2, 2)
    assert s.hot_wait_s == pytest.approx(0.002) and s.cold_wait_s == pytest.approx(0.035)
    assert s.worker_load_s == pytest.approx(0.5)
    assert "hot=0.60 wait hot=2.00ms (2 batches) cold=35.00ms (2 batches)" in s.line()


def test_a_real_fit_copy_read_tiered(tmp_path, monkeypatch):
    """`hotcache copy --budget --verify` makes the partial copy; data_root reads its
    metadata (hot=partial, the recorded fraction) and the loader serves exactly its
    manifest's members from it."""
    from hotcache.adapters import make_loader
    from tests.helpers import hotcache_json

    for var in ("DATA_ROOT", "DATA_COLD_ROOT", "DATA_ROOT_EXPECT"):
        monkeypatch.delenv(var, raising=False)
    cold = tmp_path / "cold"
    make_jpegs(cold, per_class=10, size=(64, 48))
    total = sum(p.stat().st_size for p in cold.rglob("*.jpg"))
    rc, out = hotcache_json("copy", cold, tmp_path / "hot", "--budget", str(total // 2),
                            "--verify", env={"HOTCACHE_STATE": str(tmp_path / "m.yaml")})
    assert rc == 0 and out["partial"], out
    members = set((tmp_path / "hot" / "SHA256SUMS").read_text().split()[1::2])
    root = data_root(hot=tmp_path / "hot", cold=cold, expect="partial")
    assert root.hot == "partial" and root.fraction == out["fraction"] == len(members) / 30
    ds = make_loader(root, decode=False, num_workers=0).dataset
    served = {ds.rels[i]: ds.fetch(i)[1] for i in range(len(ds))}
    assert len(served) == 30 and {r for r, hot in served.items() if hot} == members


def test_torch_writes_each_next_epochs_cold_order_for_warm(tiers, tmp_path):
    """order_file: written at once for the first epoch, then, as each epoch starts, for
    the next one: exactly the cold files, in the order the loader then delivers them,
    relative to the cold root, which `warm --order` reads."""
    from hotcache.adapters import make_loader
    from hotcache.provision.tend.warm import warm

    hot, cold, members, expected = tiers
    order = tmp_path / "next-epoch.txt"
    loader = make_loader(data_root(hot=hot, cold=cold), decode=False, batch_size=4,
                         num_workers=2, seed=5, order_file=order)
    written = [order.read_text().splitlines()]
    delivered = []
    for _epoch in range(2):
        samples = [s for batch, _labels in loader for s in batch]
        check_epoch(samples, members, expected)
        delivered.append([r for r, is_hot in map(expected.get, samples) if not is_hot])
        written.append(order.read_text().splitlines())
    assert delivered == written[:2]                  # each epoch read as written ahead
    assert sorted(written[0]) == sorted(r for r, is_hot in expected.values() if not is_hot)
    assert written[0] != written[1] != written[2]    # a new order every epoch
    again = make_loader(data_root(hot=hot, cold=cold), decode=False, batch_size=6,
                        num_workers=0, seed=5,
                        order_file=tmp_path / "again.txt")
    assert (tmp_path / "again.txt").read_text().splitlines() == written[0]   # seeded
    assert len(list(again)) == 3
    assert (tmp_path / "again.txt").read_text().splitlines() == written[1]
    report = warm(cold, order=order, state=tmp_path / "no-mapping.yaml")
    assert report["files"] == len(written[2]) == 9


def test_torch_order_file_needs_a_shuffled_image_folder(tiers, tmp_path):
    from hotcache.adapters import make_loader

    hot, cold, _members, _expected = tiers
    with pytest.raises(ValueError, match="order_file="):
        make_loader(cold, decode=False, shuffle=False, order_file=tmp_path / "o.txt")
    assert not (tmp_path / "o.txt").exists()
    loader = make_loader(cold, decode=False, num_workers=0, order_file=tmp_path / "o.txt")
    assert sorted((tmp_path / "o.txt").read_text().splitlines()) == sorted(
        r for r, _ in expected_rels(cold))
    assert len(list(loader)) == 1


def expected_rels(root):
    return [(p.relative_to(root).as_posix(), None) for p in root.rglob("*.jpg")]

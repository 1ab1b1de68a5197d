"""The decisions between `hotcache warm`'s full passes, each on scripted passes: how a
pass is named, when a pass read by one reader comes next, why the passes stop, and when
the slow files are re-read on their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotcache.provision.tend.warm import (FOCUS_SHARE, _epoch_pass_due, _focus_due,
                                             _pass_label, _stop_reason)

MIB = 1 << 20
USED = {"cache_used_bytes": 10 * MIB, "cache_total_bytes": 100 * MIB}


def a_pass(n: int, *, from_origin: int, readers: int = 4, rising: bool = True) -> dict:
    return {"pass": n, "readers": readers, "bytes": 100 * MIB, "files": 10, "seconds": 1.0,
            "mib_per_s": 100.0, "files_per_s": 10.0, "promoted": 5 if rising else 0,
            "lookups": None, "from_origin": from_origin, "rising": rising, "stats": USED}


HIT = dict(from_origin=MIB // 10)          # 0.1 % from the origin: the reads hit
MISS = dict(from_origin=40 * MIB)          # 40 % still from the origin


@pytest.mark.parametrize("n,limit,jobs,block,label", [
    (1, 1, 4, False, "warm"),                                   # the page cache: one pass
    (2, 8, 4, True, "warm pass 2/8"),
    (3, 8, 1, True, "warm pass 3/8 (one reader, as an epoch reads)"),
    (1, 1, 1, False, "warm"),                                   # one reader, no block cache
])
def test_pass_label(n, limit, jobs, block, label):
    assert _pass_label(n, limit, jobs, block) == label


def test_a_parallel_pass_that_hit_is_followed_by_one_reader():
    assert _epoch_pass_due([a_pass(1, **MISS), a_pass(2, **HIT)], jobs=4)


def test_no_epoch_pass_once_one_reader_read_or_while_reads_miss():
    assert not _epoch_pass_due([a_pass(1, **HIT, readers=1)], jobs=1)
    assert not _epoch_pass_due([a_pass(1, **MISS)], jobs=4)


def test_no_epoch_pass_when_the_passes_settled_without_hitting():
    full = dict(USED, cache_used_bytes=100 * MIB)       # full: no pass will take more in
    last = {**a_pass(1, **MISS, rising=False), "stats": full}
    assert not _epoch_pass_due([last], jobs=4)
    assert _stop_reason([last], jobs=4, limit=8, max_passes=8).startswith("the cache is full")


def test_a_single_reader_pass_that_hit_ends_it_and_says_so():
    reason = _stop_reason([a_pass(1, **MISS), a_pass(2, **HIT, readers=1)], jobs=1, limit=8,
                          max_passes=8)
    assert reason is not None
    assert reason.startswith("reads hit the cache: ")
    assert reason.endswith(" in the last pass (read by one reader, as an epoch reads)")


def test_passes_go_on_while_reads_miss_and_promotions_rise():
    assert _stop_reason([a_pass(1, **MISS)], jobs=4, limit=8, max_passes=8) is None


def test_the_limit_ends_the_passes_naming_what_still_missed():
    passes = [a_pass(n, **MISS) for n in range(1, 4)]
    reason = _stop_reason(passes, jobs=4, limit=3, max_passes=3)
    assert reason == "reached --max-passes 3; 40.0 MiB of 100.0 MiB in the last pass " \
                     "came from the origin"


def test_a_settled_pass_that_did_not_hit_ends_without_the_one_reader_note():
    full = dict(USED, cache_used_bytes=100 * MIB)
    last = {**a_pass(1, **MISS, readers=1, rising=False), "stats": full}
    reason = _stop_reason([last], jobs=1, limit=8, max_passes=8)
    assert reason is not None and reason.startswith("the cache is full")
    assert "one reader" not in reason


FILES = [(Path(f"/d/f{i}"), MIB) for i in range(10)]


@pytest.mark.parametrize("smq,slow,due", [
    (True, FILES[:1], True),
    (True, FILES[:int(FOCUS_SHARE * len(FILES)) - 1], True),
    (True, FILES[:int(FOCUS_SHARE * len(FILES))], False),      # half of all: a full pass does it
    (True, [], False),
    (False, FILES[:1], False),                                  # only smq promotes gradually
])
def test_slow_files_are_reread_alone_only_under_smq_and_when_few(smq, slow, due):
    assert _focus_due(smq, slow, FILES) is due


def test_the_cache_statistics_find_the_devices_once_per_warm_run(monkeypatch):
    """Warm reads the cache's statistics before and after every pass; the devices are
    found by their identity (a blkid each) once, not at every read."""
    from hotcache.provision.backends.parts import recorded
    from hotcache.provision.records import CacheEntry
    from hotcache.provision.system.runner import Runner
    from hotcache.provision.tend import warm
    from tests.helpers import recorded_entry

    found = []
    monkeypatch.setattr(recorded, "current_node",
                        lambda entry, role, host: found.append(role) or f"/dev/{role}")
    entry = CacheEntry.model_validate(recorded_entry("c1", backend="dm-cache", devices={
        "origin": {"node": "/dev/vdb", "size": 1}, "cache": {"node": "/dev/vdc", "size": 1}}))
    read = warm.backend_stats(entry, Runner(dry_run=True))
    for _ in range(3):
        read()
    assert sorted(found) == ["cache", "origin"]

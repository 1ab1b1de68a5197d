"""Batch timing: the wait for each batch, the first batch apart, and the verdict."""

from __future__ import annotations

import json
import logging
import time

from hotcache.adapters import BatchTimer, timed, verdict


def slow_items(n, delay):
    for i in range(n):
        time.sleep(delay)                  # the data is late
        yield i


def consume(timer, step):
    got = []
    for item in timer:
        time.sleep(step)                   # the "training step"
        got.append(item)
    return got


def test_slow_source_is_highly_input_bound_fast_one_is_not():
    slow = timed(slow_items(12, 0.02), name="slow", log_every=0)
    fast = timed(list(range(12)), name="fast", log_every=0)
    assert consume(slow, 0.002) == list(range(12))
    assert consume(fast, 0.01) == list(range(12))
    assert slow.summary().verdict == "highly input-bound"
    assert fast.summary().verdict == "not input-bound"


def test_counts_and_first_batch_kept_apart():
    timer = BatchTimer(slow_items(5, 0.0), log_every=0)
    consume(timer, 0)
    s = timer.summary()
    assert s.batches == 5 and len(timer.waits) == 4 and s.first_batch_s is not None
    assert s.p50_wait_s <= s.p95_wait_s <= s.p99_wait_s <= s.max_wait_s
    assert abs(s.total_wait_s - sum(timer.waits)) < 1e-12


def test_timer_starts_before_next():
    """The wait of a source that blocks inside next() is seen, not lost."""
    timer = BatchTimer(slow_items(3, 0.03), log_every=0)
    consume(timer, 0)
    assert timer.first >= 0.03 and min(timer.waits) >= 0.03


def test_verdict_thresholds():
    assert verdict(0.20) == "highly input-bound"
    assert verdict(0.05) == "moderately input-bound"
    assert verdict(0.049) == "not input-bound"
    assert verdict(None) == "unknown"


def test_logs_every_n_and_at_end_with_json_lines(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    path = tmp_path / "timing.jsonl"
    monkeypatch.setenv("HOTCACHE_TIMING_LOG", str(path))
    consume(timed(range(11), name="t", log_every=5), 0)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["final"] for r in records] == [False, False, True]
    assert [r["batches"] for r in records] == [6, 11, 11]
    assert all(r["event"] == "batch_timing" and r["name"] == "t" for r in records)
    assert sum("timing" in r.getMessage() for r in caplog.records) == 3


def test_epochs_and_early_break(tmp_path):
    timer = timed([1, 2, 3, 4], log_every=0, log_path=tmp_path / "t.jsonl")
    consume(timer, 0)
    for item in timer:
        if item == 2:
            break
    assert [s.epoch for s in timer.summaries] == [0, 1]
    assert [s.batches for s in timer.summaries] == [4, 2]
    assert len(timer) == 4


def test_empty_iterable():
    timer = timed([], log_every=0)
    assert list(timer) == []
    assert timer.summary().batches == 0 and timer.summary().verdict == "unknown"

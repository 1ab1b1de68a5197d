"""Batch timing: the wait for each batch, the first batch apart, and the verdict."""

from __future__ import annotations

import json
import logging

import pytest

from hotcache.adapters import BatchTimer, timed, verdict

from .helpers import FakeClock


def slow_items(n, delay, clock):
    for i in range(n):
        clock.sleep(delay)                 # the data is late
        yield i


def consume(timer, step, clock):
    got = []
    for item in timer:
        clock.sleep(step)                  # the "training step"
        got.append(item)
    return got


def test_slow_source_is_highly_input_bound_fast_one_is_not():
    """20 ms of waiting per 22 ms step is 91 % waiting; 0.1 ms per 10.1 ms is 1 %; the
    5 % and 20 % lines sit between: 1 ms per 11 ms (9 %) is moderate."""
    clock = FakeClock()
    cases = {"slow": (0.02, 0.002, "highly input-bound"),
             "middle": (0.001, 0.010, "moderately input-bound"),
             "fast": (0.0001, 0.010, "not input-bound")}
    for name, (delay, step, want) in cases.items():
        timer = timed(slow_items(12, delay, clock), name=name, log_every=0, clock=clock)
        assert consume(timer, step, clock) == list(range(12))
        s = timer.summary()
        assert s.first_batch_s == pytest.approx(delay)
        # the wall runs from the first batch's arrival: 11 waits and 12 steps
        assert s.wait_share == pytest.approx(11 * delay / (11 * (delay + step) + step)), name
        assert s.verdict == want, (name, s)


def test_counts_and_first_batch_kept_apart():
    clock = FakeClock()
    timer = BatchTimer(slow_items(5, 0.0, clock), log_every=0, clock=clock)
    consume(timer, 0, clock)
    s = timer.summary()
    assert s.batches == 5 and len(timer.waits) == 4 and s.first_batch_s is not None
    assert s.p50_wait_s <= s.p95_wait_s <= s.p99_wait_s <= s.max_wait_s
    assert abs(s.total_wait_s - sum(timer.waits)) < 1e-12


def test_timer_starts_before_next():
    """The wait of a source that blocks inside next() is seen, not lost; the step's own
    time is not counted as waiting."""
    clock = FakeClock()
    timer = BatchTimer(slow_items(3, 0.03, clock), log_every=0, clock=clock)
    consume(timer, 0.5, clock)
    assert timer.first == pytest.approx(0.03)
    assert timer.waits == pytest.approx([0.03, 0.03])
    assert timer.summary().total_wait_s == pytest.approx(0.06)


def test_verdict_thresholds():
    assert verdict(0.20) == "highly input-bound"
    assert verdict(0.05) == "moderately input-bound"
    assert verdict(0.049) == "not input-bound"
    assert verdict(None) == "unknown"


def test_logs_every_n_and_at_end_with_json_lines(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    path = tmp_path / "timing.jsonl"
    monkeypatch.setenv("HOTCACHE_TIMING_LOG", str(path))
    consume(timed(range(11), name="t", log_every=5), 0, FakeClock())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["final"] for r in records] == [False, False, True]
    assert [r["batches"] for r in records] == [6, 11, 11]
    assert all(r["event"] == "batch_timing" and r["name"] == "t" for r in records)
    assert sum("timing" in r.getMessage() for r in caplog.records) == 3


def test_timing_lines_carry_the_rank_when_it_is_set(tmp_path, monkeypatch, caplog):
    """Every rank logs its own lines: RANK and LOCAL_RANK (torchrun's) tag the periodic
    and final lines, text and JSON; without them the lines say nothing of a rank."""
    caplog.set_level(logging.INFO, logger="hotcache.adapters")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    consume(timed(range(4), name="t", log_every=2), 0, FakeClock())
    assert caplog.records and not any("rank=" in r.getMessage() for r in caplog.records)
    caplog.clear()
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    path = tmp_path / "timing.jsonl"
    consume(timed(range(4), name="t", log_every=2, log_path=path), 0, FakeClock())
    lines = [r.getMessage() for r in caplog.records if "timing" in r.getMessage()]
    assert len(lines) == 2 and all(line.endswith(" rank=5 local_rank=1") for line in lines)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["rank"], r["local_rank"]) for r in records] == [(5, 1), (5, 1)]


def test_epochs_and_early_break(tmp_path):
    timer = timed([1, 2, 3, 4], log_every=0, log_path=tmp_path / "t.jsonl")
    consume(timer, 0, FakeClock())
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


def test_percentiles_are_exact_nearest_rank():
    """Nearest rank: the k-th smallest with k = ceil(q/100 * n), one-based; one rank off in
    either direction gives a different value here."""
    from hotcache.adapters.timing import _percentile
    ordered = [float(i) for i in range(1, 21)]          # 1..20
    assert _percentile(ordered, 50) == 10.0
    assert _percentile(ordered, 95) == 19.0
    assert _percentile(ordered, 99) == 20.0
    assert _percentile([7.0], 50) == 7.0
    assert _percentile([], 95) == 0.0

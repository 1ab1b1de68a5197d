"""How a copy hands its files to the threads (hotcopy/copier.py, _Lanes): each thread
works through its own stretch of the selection, so that two threads never start in the
same folder; a thread done early takes the second half of the longest stretch left; every
file is handed out exactly once, batches respect their file and byte limits, and files an
earlier run finished are not handed out at all."""

from __future__ import annotations

from hotcache.provision.hotcopy import copier
from hotcache.provision.hotcopy.copier import BATCH_BYTES, BATCH_FILES, COPY, LINK, RESUMED
from hotcache.provision.hotcopy.selection import Entries, Entry
from hotcache.provision.hotcopy.spool import Spool


class Worker:
    """Stands in for FileCopier: the lanes only pick its methods."""

    def copy(self, e):
        return e

    link = check = copy


def plan_of(sizes: list[int], kinds: dict[int, int] | None = None,
            per_folder: int = 100) -> copier.CopyPlan:
    entries = Entries(Entry(f"c{i // per_folder:04d}/{i:06d}.jpg", size, 0, 0o644)
                      for i, size in enumerate(sizes))
    plan = copier.CopyPlan(entries, bytearray(len(sizes)), Spool(32 * len(sizes)), None, False)
    for i, kind in (kinds or {}).items():
        plan.kinds[i] = kind
    assert COPY == 0   # bytearray's zeros: every file is copied unless said otherwise
    return plan


def drain(lanes: copier._Lanes, order: list[int]) -> list[list[tuple]]:
    """Ask the lanes for batches in `order` (lane numbers, repeated) until all are empty."""
    batches, empty = [], set()
    while len(empty) < len(lanes.spans):
        for lane in order:
            if lane in empty:
                continue
            batch = lanes.batch(lane)
            if not batch:
                empty.add(lane)
            batches.append(batch)
    return batches


def test_each_thread_starts_in_its_own_stretch_far_from_the_others():
    plan = plan_of([2048] * 10_000)
    lanes = copier._Lanes(plan, Worker(), 8)
    firsts = [lanes.batch(lane) for lane in range(8)]
    starts = [batch[0][0] for batch in firsts]
    assert starts == [k * 1250 for k in range(8)]
    folders = [{e.rel.split("/")[0] for _i, _fn, (e,) in batch} for batch in firsts]
    assert all(not a & b for n, a in enumerate(folders) for b in folders[n + 1:])
    assert all(len(batch) == BATCH_FILES for batch in firsts)


def test_every_file_is_handed_out_once_and_finished_ones_never():
    resumed = {i: RESUMED for i in range(0, 3000, 7)}
    linked = {i: LINK for i in range(3, 3000, 11) if i % 7}
    plan = plan_of([2048] * 3000, {**resumed, **linked})
    batches = drain(copier._Lanes(plan, Worker(), 5), [0, 3, 3, 1, 4, 2, 2, 2])
    handed = [i for batch in batches for i, _fn, _args in batch]
    assert sorted(handed) == [i for i in range(3000) if i not in resumed]
    assert all(len(batch) <= BATCH_FILES for batch in batches)
    worker_of = {i: fn.__name__ for batch in batches for i, fn, _args in batch}
    assert {worker_of[i] for i in linked} == {"copy"}   # Worker.link is Worker.copy
    assert all(len(args) == 2 for batch in batches for i, _fn, args in batch if i in linked)


def test_a_thread_done_early_takes_the_second_half_of_the_longest_stretch():
    plan = plan_of([2048] * 1000)
    lanes = copier._Lanes(plan, Worker(), 4)           # stretches of 250
    lanes.spans[0][0] = 250                            # lane 0 is done with its own,
    lanes.spans[2][0] = 700                            # lane 2 has 50 left, 1 and 3 250
    stolen = lanes.batch(0)
    assert stolen[0][0] == 250 + 125                   # the second half of lane 1's
    assert lanes.spans[1] == [250, 375] and lanes.spans[0] == [375 + BATCH_FILES, 500]


def test_a_batch_stops_at_its_byte_limit_and_a_large_file_goes_alone():
    sizes = [BATCH_BYTES // 4] * 10 + [BATCH_BYTES * 3] + [100] * 10
    plan = plan_of(sizes)
    batches = [b for b in drain(copier._Lanes(plan, Worker(), 1), [0]) if b]
    assert [len(b) for b in batches] == [4, 4, 2, 1, 10]
    assert batches[3][0][0] == 10

"""The fail-over watcher's decisions on kernel status lines as dm-cache prints them
(Documentation/admin-guide/device-mapper/cache.rst), the switch's exact dmsetup calls
against a fake device-mapper, and what status, the metrics and a boot's restore make
of a cache switched to its origin."""

from __future__ import annotations

import threading

import pytest

from hotcache.provision import mapping
from hotcache.provision.backends.parts import failover
from hotcache.provision.block.host import Host
from hotcache.provision.engine import status
from hotcache.provision.engine.restore import plan_restore
from hotcache.provision.tend.failover import BoundedReads, Watcher
from hotcache.provision.observe.metrics import registry_for
from hotcache.provision.system.runner import Result, Runner

from tests.unit.block.test_identity_plans import FS, SPEC, argvs, entry, env, host, save  # noqa: F401

TABLE = "0 2097152 cache 254:1 254:2 254:3 128 1 {mode} smq 0"
LINEAR = "0 2097152 linear 254:3 0"
LIVE = "0 2097152 cache 8 33/1024 128 900/960 10 2 3 4 0 5 {dirty} 1 {mode} 2 " \
       "migration_threshold 2048 smq 0 {meta} {check}"
FAIL = "0 2097152 cache Fail"
BLOCK = 128 * 512


def live(mode="writethrough", dirty=0, meta="rw", check="-") -> str:
    return LIVE.format(mode=mode, dirty=dirty, meta=meta, check=check)


# --- decisions on recorded lines ---------------------------------------------------------

@pytest.mark.parametrize("mode", ["writethrough", "passthrough"])
def test_fail_with_nothing_dirty_switches(mode):
    d = failover.decide(TABLE.format(mode=mode), FAIL, writeback_ever=False)
    assert (d.action, d.dirty_bytes, d.mode) == (failover.SWITCH, 0, mode)
    assert d.said.startswith("dm-cache reports Fail") and d.kernel == "Fail"


def test_fail_in_writeback_is_an_alarm_and_never_a_switch():
    """Fail reports no counts: in writeback the dirty blocks on the SSD are unknown."""
    d = failover.decide(TABLE.format(mode="writeback"), FAIL)
    assert (d.action, d.dirty_bytes) == (failover.ALARM, None) and d.alarm


def test_read_only_metadata_with_dirty_blocks_is_an_alarm():
    d = failover.decide(TABLE.format(mode="writeback"), live("writeback", 7, meta="ro"))
    assert (d.action, d.dirty_bytes) == (failover.ALARM, 7 * BLOCK)
    assert "read-only" in d.said


def test_dirty_blocks_counted_in_writethrough_are_an_alarm_too():
    """A cache switched from writeback to writethrough may still hold dirty blocks."""
    d = failover.decide(TABLE.format(mode="writethrough"), live("writethrough", 3, meta="ro"))
    assert (d.action, d.dirty_bytes) == (failover.ALARM, 3 * BLOCK)


def test_read_only_writeback_with_zero_dirty_switches():
    d = failover.decide(TABLE.format(mode="writeback"), live("writeback", 0, meta="ro"))
    assert (d.action, d.dirty_bytes) == (failover.SWITCH, 0)


@pytest.mark.parametrize("mode, dirty, action", [("writethrough", 0, failover.SWITCH),
                                                 ("writeback", 0, failover.SWITCH),
                                                 ("writeback", 12, failover.ALARM)])
def test_needs_check(mode, dirty, action):
    d = failover.decide(TABLE.format(mode=mode), live(mode, dirty, meta="ro",
                                                      check="needs_check"))
    assert d.action == action and "needs_check" in d.kernel


def test_a_healthy_cache_is_left_alone():
    d = failover.decide(TABLE.format(mode="writethrough"), live())
    assert d.action == failover.HEALTHY and not d.alarm and d.said == ""


def test_a_status_that_did_not_answer_never_switches():
    d = failover.decide(TABLE.format(mode="writethrough"), None,
                        why="`dmsetup status hc-c1` did not answer within 5 s")
    assert d.action == failover.UNANSWERED and d.alarm and "did not answer" in d.said


ERROR = "0 2097152 cache Error"     # dm-cache could not read its metadata for the status


@pytest.mark.parametrize("mode, action", [("writethrough", failover.SWITCH),
                                          ("writeback", failover.ALARM)])
def test_error_is_a_failed_cache_like_fail(mode, action):
    """`Error` (the metadata on the SSD cannot be read) comes before `Fail`, for seconds
    or longer (seen in the guest kernel): a failed cache, never a line too odd to judge."""
    d = failover.decide(TABLE.format(mode=mode), ERROR, writeback_ever=False)
    assert (d.action, d.dirty_bytes) == (action, 0 if action == failover.SWITCH else None)
    assert d.said == "dm-cache reports Error: it cannot read its metadata on the SSD"


@pytest.mark.parametrize("line", [FAIL, ERROR])
@pytest.mark.parametrize("ever", [True, None])
def test_no_count_on_a_cache_that_ran_writeback_is_an_alarm_even_in_writethrough(line, ever):
    """A cache switched from writeback to writethrough drains its dirty blocks in the
    background; Fail and Error count none. Unless the mapping knows it never ran
    writeback, nothing is switched: the same rule status and teardown follow."""
    d = failover.decide(TABLE.format(mode="writethrough"), line, writeback_ever=ever)
    assert (d.action, d.dirty_bytes) == (failover.ALARM, None) and d.alarm


def test_a_status_line_hotcache_cannot_read_never_switches():
    d = failover.decide(TABLE.format(mode="writethrough"), "0 2097152 cache 8 garbage")
    assert d.action == failover.UNANSWERED and "not one hotcache can read" in d.said


def test_already_linear_and_not_loaded():
    assert failover.decide(LINEAR, "0 2097152 linear").action == failover.ON_ORIGIN
    assert failover.decide(None, None).action == failover.NOT_LOADED


def test_the_linear_table_maps_the_origin_the_cache_sat_on():
    assert failover.linear_table(TABLE.format(mode="writethrough")) == LINEAR


# --- the switch against a fake device-mapper ---------------------------------------------

class FakeDm(Runner):
    """dmsetup table/status/suspend/load/resume/clear on named devices, recording argv."""

    def __init__(self, tables: dict, statuses: dict):
        super().__init__()
        self.tables, self.statuses = tables, statuses
        self.calls: list[list[str]] = []
        self.suspended: set[str] = set()
        self.inactive: dict[str, str] = {}
        self.on_suspend = None          # called when a device is suspended
        self.hold: threading.Event | None = None    # status reads wait for it
        self.fail_load = False

    def run(self, argv, *, check=True, input=None, timeout=None):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        op = argv[1]
        name = argv[2] if op != "suspend" else argv[3]
        rc, out = 0, ""
        if name not in self.tables:
            rc = 1
        elif op == "table":
            out = self.tables[name]
        elif op == "status":
            if self.hold is not None:
                self.hold.wait()
            out = self.statuses[name]
        elif op == "suspend":
            self.suspended.add(name)
            if self.on_suspend:
                self.on_suspend(name)
        elif op == "load":
            if self.fail_load:
                rc = 1
            else:
                self.inactive[name] = argv[4]
        elif op == "resume":
            self.suspended.discard(name)
            if name in self.inactive:
                self.tables[name] = self.inactive.pop(name)
                self.statuses[name] = "0 2097152 linear"
        elif op == "clear":
            self.inactive.pop(name, None)
        if check and rc:
            from hotcache.provision.errors import CommandFailed
            raise CommandFailed(argv, rc, "simulated failure")
        return Result(argv, rc, out + "\n", "")


def dm(mode="writethrough", line=FAIL) -> FakeDm:
    return FakeDm({"hc-c1": TABLE.format(mode=mode)}, {"hc-c1": line})


def test_switch_loads_a_linear_mapping_of_the_origin_while_suspended():
    fake = dm()
    done = failover.switch(fake, "hc-c1", writeback_ever=False)
    assert done.done and done.table == LINEAR and done.replaced == TABLE.format(mode="writethrough")
    assert fake.calls == [
        ["dmsetup", "table", "hc-c1"], ["dmsetup", "status", "hc-c1"],
        ["dmsetup", "suspend", "--noflush", "hc-c1"],
        ["dmsetup", "table", "hc-c1"], ["dmsetup", "status", "hc-c1"],
        ["dmsetup", "load", "hc-c1", "--table", LINEAR],
        ["dmsetup", "resume", "hc-c1"]]
    assert fake.tables["hc-c1"] == LINEAR and not fake.suspended


def test_a_block_dirtied_before_the_suspend_cancels_the_switch():
    """Read-only metadata, zero dirty at the first read; a write dirties a block before
    the suspend: the check under suspension sees it and resumes the cache table."""
    fake = dm("writeback", live("writeback", 0, meta="ro"))
    fake.on_suspend = lambda name: fake.statuses.__setitem__(name, live("writeback", 1, meta="ro"))
    done = failover.switch(fake, "hc-c1")
    assert not done.done and done.decision.action == failover.ALARM
    assert ["dmsetup", "load", "hc-c1", "--table", LINEAR] not in fake.calls
    assert fake.calls[-1] == ["dmsetup", "resume", "hc-c1"] and not fake.suspended
    assert fake.tables["hc-c1"] == TABLE.format(mode="writeback")


def test_a_failed_load_leaves_the_device_resumed_never_suspended():
    fake = dm()
    fake.fail_load = True
    done = failover.switch(fake, "hc-c1", writeback_ever=False)
    assert not done.done and "simulated failure" in (done.error or "")
    assert fake.calls[-3:] == [["dmsetup", "clear", "hc-c1"], ["dmsetup", "resume", "hc-c1"],
                               ["dmsetup", "table", "hc-c1"]]
    assert not fake.suspended


def test_writeback_fail_is_never_switched():
    fake = dm("writeback")
    done = failover.switch(fake, "hc-c1")
    assert not done.done and done.decision.action == failover.ALARM
    assert all(c[1] in ("table", "status") for c in fake.calls)


# --- the watcher -------------------------------------------------------------------------

def watcher(env, fake: FakeDm, said: list, timeout: float = 5.0) -> Watcher:
    return Watcher(env.state, Host(fake), read_timeout=timeout, say=said.append)


def test_the_watcher_switches_and_records_the_cache_on_its_origin(env):
    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "writeback_ever": False})
    fake, said = dm(), []
    (got,) = watcher(env, fake, said).check()
    assert got.switched and got.switched.done and fake.tables["hc-c1"] == LINEAR
    moved = mapping.load(env.state)["caches"]["c1"].on_origin
    assert moved is not None and moved.table == LINEAR and moved.device == "hc-c1"
    assert moved.said.startswith("dm-cache reports Fail") and moved.since == got.since
    assert said == [f"c1: running on the origin since {moved.since}: cache failed "
                    f"({moved.said})"]


def test_a_switch_whose_resume_answered_too_late_is_recorded_all_the_same(env):
    """The kernel swapped the tables, but dmsetup resume was killed at its bound: the
    switch sees the linear table live after its recovery and reports it done, and the
    watcher records the cache on its origin, so a boot never loads the failed SSD."""
    from hotcache.provision.errors import CommandFailed

    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "writeback_ever": False})
    fake, said = dm(), []
    resume = fake.run

    def late(argv, **kw):
        done = resume(argv, **kw)
        if argv[1] == "resume" and fake.tables["hc-c1"] == LINEAR and not late.once:
            late.once = True
            raise CommandFailed(argv, -9, "timed out")
        return done
    late.once = False
    fake.run = late
    (got,) = watcher(env, fake, said).check()
    assert got.switched.done and fake.tables["hc-c1"] == LINEAR
    moved = mapping.load(env.state)["caches"]["c1"].on_origin
    assert moved is not None and moved.table == LINEAR and got.since == moved.since
    assert said[-1].startswith(f"c1: running on the origin since {moved.since}"), said

def test_a_linear_table_the_watcher_did_not_switch_from_its_cache_is_not_a_fail_over(env):
    """A linear table on a built entry that is not the switch of the cache table this
    watcher saw (a teardown's `lvconvert --uncache` maps the LV linearly too; a watcher
    started afterwards saw no cache table) is never recorded as a fail-over."""
    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "writeback_ever": False})
    fake, said = FakeDm({"hc-c1": LINEAR}, {"hc-c1": "0 2097152 linear"}), []
    w = watcher(env, fake, said)
    w.check()
    assert mapping.load(env.state)["caches"]["c1"].on_origin is None
    fake.tables["hc-c1"] = TABLE.format(mode="writethrough")        # a cache table seen,
    fake.statuses["hc-c1"] = live()
    w.check()
    fake.tables["hc-c1"] = "0 2097152 linear 254:9 0"                # then another linear
    w.check()
    assert mapping.load(env.state)["caches"]["c1"].on_origin is None


def test_the_switch_of_the_cache_table_it_saw_is_recorded_on_the_next_pass(env):
    """The watcher saw the cache table; by its next pass the device maps exactly that
    table's origin linearly, unrecorded (a switch whose record never reached the
    mapping, the watcher stopped meanwhile): recorded now."""
    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "writeback_ever": False})
    fake, said = FakeDm({"hc-c1": TABLE.format(mode="writethrough")}, {"hc-c1": live()}), []
    w = watcher(env, fake, said)
    w.check()
    fake.tables["hc-c1"], fake.statuses["hc-c1"] = LINEAR, "0 2097152 linear"
    (got,) = w.check()
    moved = mapping.load(env.state)["caches"]["c1"].on_origin
    assert moved is not None and moved.table == LINEAR and got.since == moved.since


def test_an_entry_an_apply_rewrote_meanwhile_is_not_marked_on_the_origin(env):
    """The watcher found the linear table unrecorded, but before it writes, an apply that
    attaches a new SSD in place of the linear mapping has recorded the cache as building:
    the apply's record is left as it wrote it."""
    from hotcache.provision.records import OnOrigin
    from hotcache.provision.tend.failover import record

    save(env, c1=entry(spec=dict(SPEC, mode="writethrough"), state="building"))
    record(env.state, "c1", OnOrigin(since="t", said="", device="hc-c1", table=LINEAR))
    assert mapping.load(env.state)["caches"]["c1"].on_origin is None
    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "writeback_ever": False})
    record(env.state, "c1", OnOrigin(since="t", said="", device="hc-c1", table=LINEAR))
    assert mapping.load(env.state)["caches"]["c1"].on_origin is not None


def test_the_watcher_raises_the_alarm_once_and_switches_nothing_with_dirty_data(env):
    save(env, c1=entry())       # writeback
    fake, said = dm("writeback"), []
    w = watcher(env, fake, said)
    for _ in range(3):
        (got,) = w.check()
        assert got.decision.action == failover.ALARM and got.switched is None
    assert fake.tables["hc-c1"] == TABLE.format(mode="writeback")
    assert mapping.load(env.state)["caches"]["c1"].on_origin is None
    assert len(said) == 1 and "not switched to the origin" in said[0], said
    assert "unknown amount of dirty data" in said[0]


def test_a_status_read_that_hangs_is_bounded_and_not_read_twice(env):
    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "writeback_ever": False})
    fake, said = dm(), []
    fake.hold = threading.Event()
    w = watcher(env, fake, said, timeout=0.2)
    try:
        (got,) = w.check()
        assert got.decision.action == failover.UNANSWERED and got.switched is None
        assert "did not answer within 0.2 s" in got.decision.said
        (again,) = w.check()        # the first read is still stuck: no second one
        assert again.decision.action == failover.UNANSWERED
        assert [c for c in fake.calls if c[1] == "status"] == [["dmsetup", "status", "hc-c1"]]
    finally:
        fake.hold.set()
    assert fake.tables["hc-c1"] == TABLE.format(mode="writethrough")
    fake.hold = None
    for thread in threading.enumerate():
        if thread.name == "read hc-c1":
            thread.join(5)
    (done,) = w.check()            # answered again: the verdict is the kernel's
    assert done.switched is not None and done.switched.done


def test_bounded_reads_say_why_a_status_is_missing():
    fake = dm()
    fake.tables.pop("hc-c1")
    table, line, why = BoundedReads(Host(fake), 1.0).read("hc-c1")
    assert table is None and line is None and "dmsetup table hc-c1" in why


# --- a cache on its origin: status, metrics, a boot ----------------------------------------

ON_ORIGIN = {"since": "2025-01-02T03:04:05+00:00", "said": "dm-cache reports Fail: the "
             "kernel stopped using the cache after I/O errors", "device": "hc-c1",
             "table": LINEAR}


def test_status_says_the_cache_runs_on_its_origin(host, env):
    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "on_origin": ON_ORIGIN})
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    data = mapping.load(env.state)
    row = status.cache_status("c1", data["caches"]["c1"], host.runner, None, host=host)
    (found,) = [f for f in row["findings"] if f["code"] == "CACHE_FAILED"]
    assert found["message"].startswith(
        "running on the origin since 2025-01-02T03:04:05+00:00: cache failed (dm-cache "
        "reports Fail")
    assert row["cache_failed"] and row["cache_failed"]["dirty_bytes"] == 0
    assert not [c for c in host.runner.recorded if c[:2] == ["dmsetup", "status"]]
    from prometheus_client import generate_latest

    text = generate_latest(registry_for([row], env.state)).decode()
    assert 'hotcache_cache_on_origin{cache="c1"} 1.0' in text, text
    assert 'hotcache_cache_on_origin_since_seconds{cache="c1"} 1.735787045e+09' in text


def test_a_boot_mounts_a_cache_on_its_origin_from_the_origin_alone(host, env):
    """No table on the failed SSD: the origin, found by identity, is mounted directly."""
    save(env, c1={**entry(spec=dict(SPEC, mode="writethrough")), "on_origin": ON_ORIGIN})
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    plan = plan_restore(env, ["c1"])
    assert argvs(plan) == [["mkdir", "--parents", "/mnt/c1"],
                           ["mount", "-t", "xfs", "-o", "noatime,nosuid,nodev", "/dev/vdc",
                            "/mnt/c1"]]
    assert not [c for c in host.runner.recorded if "/dev/vda" in c]


def test_the_watchers_service_runs_the_watch_after_the_local_filesystems(tmp_path):
    from hotcache.provision.engine import failoverunit

    text = failoverunit.unit_text(tmp_path / "mappings.yaml", "/opt/hotcache/bin/hotcache")
    assert f"\nExecStart=/opt/hotcache/bin/hotcache failover --watch --state " \
           f"{tmp_path}/mappings.yaml\n" in text
    for line in ("After=local-fs.target", "Restart=always", "WantedBy=multi-user.target"):
        assert f"\n{line}\n" in text, line

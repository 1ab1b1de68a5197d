"""A flush makes progress or says why, and a cache that stops
being live mid-flush fails the teardown (clock and sysfs injected; no kernel needed)."""

from __future__ import annotations

import pytest

from hotcache.provision.backends import bcache
from hotcache.provision.block.host import Host
from hotcache.provision.backends import dmcache
from hotcache.provision.backends.parts import dmflush
from hotcache.provision.errors import ExitCode, FlushIncomplete, WaitTimeout
from hotcache.provision.system.runner import Result, Runner
from hotcache.provision.system.waits import wait_drained

STATUS = ("0 974848 cache 8 15/2048 128 13/1088 92 20 3 1 0 7 {dirty} 1 writeback "
          "2 migration_threshold {mt} {policy} 0 rw - ")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def drain(counts, clock, **kw):
    said = []
    it = iter(counts)
    wait_drained("the flush", lambda: (c := next(it), f"{c} dirty"), timeout=kw.pop("timeout", 600),
                 diagnose=lambda: "HELD BY THE ORIGIN", hint="run it again", clock=clock,
                 sleep=clock.sleep, say=said.append, **kw)
    return said


def test_a_stalled_flush_says_what_holds_it_instead_of_repeating_the_count():
    clock = Clock()
    with pytest.raises(WaitTimeout) as err:
        drain([324] * 1000, clock, timeout=300)
    assert "HELD BY THE ORIGIN" in str(err.value)
    assert err.value.exit_code == ExitCode.TIMEOUT


def test_stall_is_reported_once_a_minute_and_progress_resets_it():
    clock = Clock()
    said = drain([324] * 70 + [300] * 70 + [0], clock)
    held = [s for s in said if "HELD BY THE ORIGIN" in s]
    assert len(held) == 2, said                     # at 60 s, and 60 s after 300 appeared
    assert "no progress for 60s (324 dirty)" in held[0]
    assert "no progress for 60s (300 dirty)" in held[1]
    assert not any("waiting for the flush: 324 dirty (6" in s for s in said)   # not past 60 s


def test_a_draining_flush_never_reports_a_stall():
    clock = Clock()
    said = drain(list(range(500, 0, -1)) + [0], clock)
    assert not any("HELD" in s for s in said) and any("waiting for the flush" in s for s in said)


class Dm(Runner):
    def __init__(self, mt: int, policy="cleaner", sticky=False):
        super().__init__(dry_run=True)
        self.mt, self.policy, self.sticky = mt, policy, sticky

    def run(self, argv, **kw):
        argv = [str(a) for a in argv]
        self.recorded.append(argv)
        if argv[:2] == ["dmsetup", "message"] and not self.sticky:
            self.mt = int(argv[-1])
        if argv[:2] == ["dmsetup", "status"]:
            return Result(argv, 0, STATUS.format(dirty=324, mt=self.mt, policy=self.policy), "")
        return Result(argv, 0, "", "")


def test_a_zero_migration_threshold_is_raised_in_place_and_read_back():
    runner, said = Dm(0), []
    dmflush.ensure_writeback("hc-c1", runner, say=said.append)
    assert ["dmsetup", "message", "hc-c1", "0", "migration_threshold", "2048"] in runner.recorded
    assert runner.recorded[-1] == ["dmsetup", "status", "hc-c1"]     # read back
    assert "was 0 sectors" in said[0]


def test_a_threshold_that_does_not_take_or_a_policy_not_cleaner_is_an_error():
    with pytest.raises(FlushIncomplete, match="stays 0"):
        dmflush.ensure_writeback("hc-c1", Dm(0, sticky=True), say=lambda s: None)
    with pytest.raises(FlushIncomplete, match="runs policy smq"):
        dmflush.ensure_writeback("hc-c1", Dm(2048, policy="smq"), say=lambda s: None)
    runner = Dm(4096)
    dmflush.ensure_writeback("hc-c1", runner, say=lambda s: None)
    assert not any(a[1] == "message" for a in runner.recorded)


def test_a_dm_cache_that_vanishes_mid_flush_fails_the_wait():
    class Gone(Runner):
        def run(self, argv, **kw):
            from hotcache.provision.errors import CommandFailed
            raise CommandFailed(argv, 1, "Device does not exist.")
    with pytest.raises(FlushIncomplete) as err:
        dmflush.wait_clean("hc-c1", Gone())
    assert "stopped being live" in str(err.value) and "kept" in str(err.value)


@pytest.fixture
def host(tmp_path):
    """A host whose sysfs is the test's folder (bdev fills it)."""
    return Host(Runner(dry_run=True), tmp_path)


@pytest.fixture
def bdev(tmp_path):
    d = tmp_path / "sys" / "class" / "block" / "vdc" / "bcache"
    d.mkdir(parents=True)
    for name, value in (("state", "dirty"), ("dirty_data", "69.0M"), ("writeback_running", "0"),
                        ("detach", ""), ("writeback_rate", "4.0k")):
        (d / name).write_text(value + "\n")
    cset = tmp_path / "sys" / "fs" / "bcache" / "cset1"
    cset.mkdir(parents=True)
    (d / "cache").symlink_to(cset)
    (cset / "bdev0").symlink_to(d)
    (cset / "unregister").write_text("")
    return d


def test_bcache_device_stopping_during_the_detach_fails_the_teardown(bdev, host):
    import shutil

    clock = Clock()

    def stop(seconds):          # the failing origin stops the bcache device
        clock.sleep(seconds)
        shutil.rmtree(bdev)
    with pytest.raises(FlushIncomplete) as err:
        bcache.detach(host, "/dev/vdc", clock=clock, sleep=stop, say=lambda s: None)
    assert "stopped before its dirty data was written back" in str(err.value)
    assert "cset1" in str(err.value)


def test_bcache_detach_turns_writeback_on_and_waits_for_no_cache(bdev, host):
    clock = Clock()

    def detached(seconds):
        clock.sleep(seconds)
        (bdev / "state").write_text("no cache\n")
    bcache.detach(host, "/dev/vdc", clock=clock, sleep=detached, say=lambda s: None)
    assert (bdev / "writeback_running").read_text() == "1"
    assert (bdev / "detach").read_text() == "1"


def test_a_cache_set_with_a_backing_device_attached_is_never_unregistered(bdev, host):
    with pytest.raises(FlushIncomplete, match="bdev0"):
        bcache.unregister_set(host, "cset1")
    assert host.path("/sys/fs/bcache/cset1/unregister").read_text() == ""


def test_bcache_device_vanishing_while_its_sysfs_is_read_fails_the_teardown(bdev, host,
                                                                            monkeypatch):
    """Seen in the guest kernel: the origin failed, bcache stopped the device, and the
    read of dirty_data itself failed with ENODEV."""
    real = bcache._get

    def read(path):
        if path.name == "dirty_data":
            raise OSError(19, "No such device")
        return real(path)
    monkeypatch.setattr(bcache, "_get", read)
    with pytest.raises(FlushIncomplete, match="stopped before"):
        bcache.detach(host, "/dev/vdc", clock=Clock(), sleep=lambda s: None, say=lambda s: None)


def test_dmsetup_table_of_a_missing_device_reads_as_absent_in_either_wording():
    """Debian 12's dmsetup: 'table ioctl on NAME failed: No such device or address'."""
    class Missing(Runner):
        def __init__(self, stderr):
            super().__init__(dry_run=True)
            self.stderr = stderr

        def query(self, argv, *, check=True):
            return Result(argv, 1, "", self.stderr)
    for stderr in ("Device hc-c1 does not exist.\nCommand failed.\n",
                   "device-mapper: table ioctl on hc-c1 failed: No such device or address\n"
                   "Command failed.\n"):
        assert dmcache.live_table("hc-c1", Missing(stderr)) is None
    with pytest.raises(Exception, match=r"dmsetup table hc-c1. failed \(exit 1\)"):
        dmcache.live_table("hc-c1", Missing("Permission denied\nCommand failed.\n"))


def test_lvmcache_does_not_need_the_cleaner_named_but_still_gets_a_usable_threshold():
    """lvm2 may leave the table naming mq after --cachepolicy cleaner (seen in the guest
    kernel); lvmcache's flush then still needs a threshold that lets writeback run."""
    runner, said = Dm(0, policy="mq"), []
    dmflush.ensure_writeback("hc-lv", runner, say=said.append, need_cleaner=False)
    assert ["dmsetup", "message", "hc-lv", "0", "migration_threshold", "2048"] in runner.recorded
    with pytest.raises(FlushIncomplete, match="runs policy mq"):
        dmflush.ensure_writeback("hc-lv", Dm(2048, policy="mq"), say=lambda s: None)

"""dm-cache tables and status lines as the kernel prints them (taken from a 6.1 guest)."""

from __future__ import annotations

import dataclasses

import pytest

from hotcache.provision.backends.parts.dmtable import cache_stats, parse_status, parse_table

STATUS = ("0 974848 cache 8 15/2048 128 13/1088 92 20 3 1 0 7 5 2 metadata2 writeback "
          "2 migration_threshold 2048 smq 0 rw - ")
TABLE = "0 974848 cache 253:3 253:2 253:4 128 2 metadata2 writethrough smq 0"


def test_status_gives_every_key_warm_and_the_exporter_read():
    stats = cache_stats(parse_status(STATUS))
    assert stats == {
        "mode": "writeback", "policy": "smq", "state": "dirty", "hits": 95, "misses": 21,
        "hit_ratio": round(95 / 116, 4), "dirty_bytes": 5 * 128 * 512,
        "cache_used_bytes": 13 * 128 * 512, "cache_total_bytes": 1088 * 128 * 512,
        "promotions": 7, "demotions": 0,
    }


def test_status_flags_metadata_needing_a_check():
    st = parse_status(STATUS.replace("rw - ", "ro needs_check"))
    assert cache_stats(st)["state"] == "needs_check"


def test_table_round_trips_and_changes_mode_in_place():
    table = parse_table(TABLE)
    assert (table.mode, table.policy, table.block, table.features) == \
        ("writethrough", "smq", 128, ["metadata2"])
    assert table.render() == TABLE
    changed = dataclasses.replace(table, mode="writeback", policy="cleaner")
    assert changed.render() == "0 974848 cache 253:3 253:2 253:4 128 2 metadata2 writeback cleaner 0"


def test_table_without_mode_is_writeback_the_kernel_default():
    assert parse_table("0 8 cache 1:1 1:2 1:3 64 0 smq 2 migration_threshold 4096").mode == \
        "writeback"


def test_not_a_cache_table_is_rejected():
    with pytest.raises(ValueError):
        parse_table("0 155648 linear 254:2 2048")


class _Answers:
    """A runner that answers `dmsetup table` the way dmsetup did in the guest."""

    def __init__(self, rc: int, stderr: str, stdout: str = ""):
        self.rc, self.stderr, self.stdout = rc, stderr, stdout

    def query(self, argv, *, check=True):
        from hotcache.provision.system.runner import Result

        return Result(list(argv), self.rc, self.stdout, self.stderr)


@pytest.mark.parametrize("stderr", ["Command failed.\n", "Device does not exist.\nCommand failed.\n",
                                    "device-mapper: table ioctl on hc-x  failed: No such device "
                                    "or address\nCommand failed.\n"])
def test_a_table_that_is_not_loaded_reads_as_absent(stderr):
    from hotcache.provision.backends.dmcache import live_table

    assert live_table("hc-x", _Answers(1, stderr)) is None
    assert live_table("hc-x", _Answers(0, "", TABLE + "\n")) == TABLE


def test_any_other_dmsetup_failure_fails_closed():
    from hotcache.provision.backends.dmcache import live_table
    from hotcache.provision.errors import ProbeFailed

    denied = "/dev/mapper/control: open failed: Permission denied\nFailure to communicate " \
             "with kernel device-mapper driver.\nCommand failed.\n"
    with pytest.raises(ProbeFailed):
        live_table("hc-x", _Answers(1, denied))

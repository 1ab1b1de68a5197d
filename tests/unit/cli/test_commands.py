"""`hotcache status`'s own decisions, without a host: which options a status of one cache
refuses, and what it prints for the rows the engine proved."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotcache.provision.cli.commands import _refuse_whole_host_options, _status_lines
from hotcache.provision.errors import ExitCode, UsageError

STATE = Path("/var/lib/hotcache/state.json")


def row(**over) -> dict:
    base = {"name": "c1", "backend": "dmcache", "mode": "writethrough", "ok": True,
            "cached_device": "/dev/mapper/hc-c1", "mountpoint": "/mnt/c1", "mounted": True,
            "noatime": True, "size_bytes": 0, "used_bytes": 0, "free_bytes": 0,
            "working_set": {"sizing": None, "activity": None}, "problems": []}
    return {**base, **over}


@pytest.mark.parametrize("labels,push,refused", [
    (Path("/etc/features"), False, "--node-labels describes the whole host"),
    (None, True, "--slurm-push describes the whole host"),
    (Path("/etc/features"), True, "--node-labels"),          # the first option is named
])
def test_one_cache_cannot_publish_for_the_whole_host(labels, push, refused):
    with pytest.raises(UsageError, match=refused) as exc:
        _refuse_whole_host_options("c1", node_labels=labels, slurm_push=push)
    assert "not only cache 'c1'" in str(exc.value)
    assert exc.value.exit_code == ExitCode.BAD_INPUT


@pytest.mark.parametrize("name,labels,push", [
    (None, Path("/etc/features"), True),     # the whole host: both are fine
    ("c1", None, False),
])
def test_the_whole_host_or_no_publishing_passes(name, labels, push):
    _refuse_whole_host_options(name, node_labels=labels, slurm_push=push)


def test_no_caches_says_how_to_build_one():
    assert _status_lines([], [], STATE) == [
        f"no caches in {STATE}; `hotcache apply SPEC` builds one"]


def test_a_cache_waiting_for_an_ssd_is_listed_first_and_not_as_empty():
    waiting = [{"name": "c2", "backend": "dmcache", "message": "its SSD was taken off"}]
    lines = _status_lines([row()], waiting, STATE)
    assert lines[0] == "[bold]c2[/] (dmcache): [yellow]no cache[/]: its SSD was taken off"
    assert lines[1] == "[bold]c1[/] (dmcache, mode writethrough): [green]ok[/]"
    assert not any("no caches in" in line for line in _status_lines([], waiting, STATE))


def test_a_healthy_cache_without_space_figures():
    assert _status_lines([row()], [], STATE) == [
        "[bold]c1[/] (dmcache, mode writethrough): [green]ok[/]",
        "  device /dev/mapper/hc-c1 mounted on /mnt/c1: yes, noatime: yes"]


def test_a_drifted_cache_says_each_fact_in_order():
    r = row(ok=False, cached_device=None, mounted=False, noatime=False,
            size_bytes=4 << 30, used_bytes=1 << 30, free_bytes=3 << 30,
            cache={"hit_ratio": 0.5},
            working_set={"sizing": {"message": "fits"}, "activity": {"message": "thrashing"}},
            problems=["not mounted at /mnt/c1", "no fstab entry"])
    lines = _status_lines([r], [], STATE)
    assert lines[0] == "[bold]c1[/] (dmcache, mode writethrough): [red]DRIFT[/]"
    assert lines[1] == "  device - mounted on /mnt/c1: no, noatime: no"
    assert lines[2] == "  used 1.0 GiB of 4.0 GiB, free 3.0 GiB"
    assert lines[3:] == ["  hit_ratio: 0.5", "  sizing: fits", "  working set: thrashing",
                         "  [red]problem[/]: not mounted at /mnt/c1",
                         "  [red]problem[/]: no fstab entry"]


def test_advice_that_is_not_there_prints_nothing():
    r = row(working_set={"sizing": None, "activity": {"message": "thrashing"}})
    assert _status_lines([r], [], STATE)[2:] == ["  working set: thrashing"]


def test_an_empty_filesystem_still_says_its_space():
    r = row(size_bytes=4 << 30, used_bytes=0, free_bytes=4 << 30)
    assert _status_lines([r], [], STATE)[2] == "  used 0 B of 4.0 GiB, free 4.0 GiB"

"""One device, one owner, across the spec and the mapping (issue 11, cases 4 and 7): a
device the mapping records for another cache is refused even without any signature on
it, such as a dm-cache SSD whose tables are not loaded (after a boot, before restore)."""

from __future__ import annotations

import os

from hotcache.provision.engine import owners
from hotcache.provision.engine.spec import HostSpec
from tests.helpers import entry_record


def test_a_recorded_dm_cache_ssd_without_signature_is_refused_for_a_new_cache(tmp_path):
    ssd = tmp_path / "ssd.img"
    ssd.write_bytes(b"\0" * 4096)           # dm-cache metadata: no blkid signature
    link = tmp_path / "by-id-nvme-SSD_1234"
    link.symlink_to(ssd)
    state = {"caches": {"a": entry_record("a", backend="dm-cache", devices={
        "origin": {"node": str(tmp_path / "gone-hdd"), "size": 2**30},
        "cache": {"node": "/dev/nvme9n9-moved", "size": 2**30, "by_id": [str(link)]}})}}
    new = HostSpec.model_validate({"caches": [{
        "name": "b", "backend": "none",
        "origin": {"loop": {"file": str(ssd), "size": "1G"}, "wipe": True},
        "filesystem": {"mountpoint": "/mnt/b"}}]})
    problems = owners.conflicts(new, state)
    assert len(problems) == 1
    assert "b.origin" in problems[0] and "records for cache a" in problems[0]
    assert "`hotcache teardown a`" in problems[0]
    # The same cache naming its own recorded device again is no conflict.
    same = HostSpec.model_validate({"caches": [{**new.caches[0].model_dump(), "name": "a"}]})
    assert owners.conflicts(same, state) == []


def test_a_stale_kernel_name_counts_only_when_no_by_id_link_is_left(tmp_path):
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"x")
    elsewhere = tmp_path / "real-ssd"
    elsewhere.write_bytes(b"y")
    link = tmp_path / "by-id-ssd"
    link.symlink_to(elsewhere)
    new = HostSpec.model_validate({"caches": [{
        "name": "b", "backend": "none", "origin": {"loop": {"file": str(disk), "size": "1G"}},
        "filesystem": {"mountpoint": "/mnt/b"}}]})
    # The recorded node is now another device's name, but the by-id link still finds
    # the recorded SSD elsewhere: the spec's device is not that cache's.
    named = {"caches": {"a": entry_record("a", devices={
        "cache": {"node": str(disk), "size": 1, "by_id": [str(link)]}})}}
    assert owners.conflicts(new, named) == []
    os.unlink(link)        # the SSD is gone: fall back to the recorded node, fail closed
    assert len(owners.conflicts(new, named)) == 1


def test_a_recorded_loop_node_that_now_serves_another_image_is_no_claim(tmp_path):
    mine, theirs = tmp_path / "b.img", tmp_path / "a.img"
    mine.write_bytes(b"b")
    theirs.write_bytes(b"a")
    new = HostSpec.model_validate({"caches": [{
        "name": "b", "backend": "none", "origin": {"loop": {"file": str(mine), "size": "1G"}},
        "filesystem": {"mountpoint": "/mnt/b"}}]})
    # After a boot, cache a's old /dev/loop node may be the one b's image is attached to.
    state = {"caches": {"a": entry_record("a", devices={
        "origin": {"node": str(mine), "size": 1, "loop_file": str(theirs)}})}}
    assert owners.conflicts(new, state) == []
    state["caches"]["a"].devices["origin"].loop_file = str(mine)
    assert len(owners.conflicts(new, state)) == 1

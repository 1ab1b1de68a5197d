"""One device, one owner, across the spec and the mapping (docs/safety.md): a
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


def test_a_recorded_cache_whose_kernel_names_moved_claims_its_devices_by_identity(tmp_path):
    """As in the guest-kernel tier's reboot: disks came up in another order, so the kernel
    names the recorded spec of `c2` gives (its restore re-applies that spec) now name the
    SSD partitions of caches `a` and `b`. c2's devices are where its by-id links lead;
    restoring c2 claims those, not the devices that took its old names. With its links
    gone, the old names count again (fail closed) and the restore is refused."""
    files = {n: tmp_path / f"{n}.dev" for n in ("a-ssd", "b-ssd", "c2-origin", "c2-ssd")}
    for path in files.values():
        path.write_bytes(path.name.encode())
    links = {n: tmp_path / f"by-id-{n}" for n in files}
    for n, link in links.items():
        link.symlink_to(files[n])
    state = {"caches": {
        "a": entry_record("a", devices={"cache": {"node": "/dev/vda1", "size": 1,
                                                  "by_id": [str(links["a-ssd"])]}}),
        "b": entry_record("b", devices={"cache": {"node": "/dev/vda2", "size": 1,
                                                  "by_id": [str(links["b-ssd"])]}}),
        "c2": entry_record("c2", devices={
            "origin": {"node": "/dev/vdc1", "size": 1, "by_id": [str(links["c2-origin"])]},
            "cache": {"node": "/dev/vdc2", "size": 1, "by_id": [str(links["c2-ssd"])]}})}}
    # The recorded spec names c2's devices by their old names, which now lead to a's and
    # b's SSDs (image files stand in for the partitions).
    restore = HostSpec.model_validate({"caches": [{
        "name": "c2", "backend": "dm-cache",
        "origin": {"loop": {"file": str(files["a-ssd"]), "size": "1G"}},
        "cache": {"loop": {"file": str(files["b-ssd"]), "size": "1G"}},
        "filesystem": {"mountpoint": "/mnt/c2"}}]})
    assert owners.conflicts(restore, state) == []
    for name in ("c2-origin", "c2-ssd"):
        os.unlink(links[name])
    problems = owners.conflicts(restore, state)
    assert len(problems) == 2 and "records for cache a" in problems[0], problems
    # A new cache naming a's SSD by any name is still refused.
    new = HostSpec.model_validate({"caches": [{
        "name": "d", "backend": "none", "origin": {"loop": {"file": str(files["a-ssd"]), "size": "1G"}},
        "filesystem": {"mountpoint": "/mnt/d"}}]})
    assert any("records for cache a" in p for p in owners.conflicts(new, state))


def _dm_spec(tmp_path, *names: str) -> HostSpec:
    return HostSpec.model_validate({"caches": [{
        "name": n, "backend": "dm-cache",
        "origin": {"loop": {"file": str(tmp_path / f"{n}-hdd.img"), "size": "1G"}},
        "cache": {"loop": {"file": str(tmp_path / f"{n}-ssd.img"), "size": "256M"}},
        "filesystem": {"mountpoint": f"/mnt/{n}"}} for n in names]})


def test_dm_cache_names_that_would_share_a_device_mapper_name_are_refused(tmp_path):
    """Cache `x-cache` would take hc-x-cache, cache `x`'s cache device (and `x-meta`,
    `x-data` its maps): refused in one spec, and against a cache the mapping records."""
    (problem,) = owners.conflicts(_dm_spec(tmp_path, "x", "x-cache"), {})
    assert "caches x and x-cache would both use the device-mapper name hc-x-cache " \
        "(dm-cache names its devices after the cache)" in problem
    state = {"caches": {"x": entry_record("x", backend="dm-cache", backend_state={
        "names": {"cache": "hc-x", "meta": "hc-x-meta", "data": "hc-x-data"},
        "data_sectors": 8})}}
    (problem,) = owners.conflicts(_dm_spec(tmp_path, "x-meta"), state)
    assert "hc-x-meta" in problem
    assert owners.conflicts(_dm_spec(tmp_path, "x", "xy"), {}) == []
    assert owners.conflicts(_dm_spec(tmp_path, "x"), state) == []


def test_a_recorded_cache_of_a_backend_this_hotcache_does_not_know_names_nothing(tmp_path):
    """A newer hotcache's cache in the mapping: its device names are not known here, and
    planning another cache beside it goes on instead of failing on the unknown backend."""
    state = {"caches": {"x-cache": entry_record("x-cache", backend="future-cache")}}
    assert owners.dm_name_clashes(_dm_spec(tmp_path, "x"), state) == []

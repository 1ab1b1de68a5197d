"""Storage safety, boot 2 of 2 (issue 11, guest tier (a) and (b)): the disks came up in
another order (by, hdd, ssd, ssd2 -> vda, vdb, vdc, vdd), so /dev/vda1 and /dev/vda2, the
SSD partitions the spec named, are now the bystander's ext4 partitions, and /dev/vdc1 and
/dev/vdc2, the second dm-cache's origin and SSD, are bcache's SSD and the first dm-cache's
SSD. Nothing is loaded yet: the dm-caches still hold dirty blocks only their metadata
describes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml
from guest_safety import BYSTANDER, CACHE_BY_ID, CACHES, device_sum
from vmlib import MOUNTS, PERSIST, checksums, hotcache, sh, status


def bystander_unchanged() -> bool:
    sums = json.loads((PERSIST / "bystander.json").read_text())
    return all(device_sum(f"{BYSTANDER}-part{n}") == sums[str(n)] for n in (1, 2))


def test_disks_changed_order():
    assert os.path.realpath("/dev/disk/by-id/virtio-by") == "/dev/vda"
    assert os.path.realpath("/dev/disk/by-id/virtio-ssd") == "/dev/vdc"
    assert os.path.realpath("/dev/disk/by-id/virtio-ssd2") == "/dev/vdd"
    assert sh("blkid", "-o", "value", "-s", "TYPE", "/dev/vda1").stdout.strip() == "ext4"


def test_teardown_of_a_cache_not_loaded_is_refused():
    """Guest tier (b): a writeback dm-cache whose tables a reboot removed, dirty blocks
    on its SSD: teardown is refused with the fix and changes nothing."""
    before = (PERSIST / "mappings.yaml").read_bytes()
    for name in ("sdmcache", "sdmcache2"):
        res = hotcache("teardown", name, "--yes")
        assert res.code == 3, res.out
        assert "not live" in res.out and f"hotcache restore {name}" in res.out, res.out
    assert (PERSIST / "mappings.yaml").read_bytes() == before
    loaded = sh("dmsetup", "ls").stdout
    assert "hc-sdmcache" not in loaded, loaded          # nothing was loaded or built
    assert bystander_unchanged()


def test_restore_finds_each_cache_by_identity():
    for name in CACHES:
        res = hotcache("restore", name, "--yes", "--json")
        assert res.code == 0, res.out
        argvs = [a for s in res.json["steps"] for a in (s["argv"] or [])]
        # the bystander (/dev/vda*) and the other caches' devices (some under this
        # cache's old names) appear in no command, nor in a dm table
        others = ["/dev/vda", "/dev/vda1", "/dev/vda2"] + [os.path.realpath(f"/dev/disk/by-id/{link}")
                                 for other in CACHES if other != name
                                 for link in (CACHE_BY_ID[other], CACHES[other][4])]
        assert not [a for a in argvs for o in others if re.search(rf"{o}(?!\d)", a)], argvs
        assert not {"wipefs", "make-bcache", "dd", "mkfs.xfs"} & set(argvs), argvs
        st = status(name)
        assert st["mounted"] and st["fs_uuid_matches"], st["problems"]
        for role, link in (("cache", CACHE_BY_ID[name]), ("origin", CACHES[name][4])):
            assert st["devices"][role]["node"] == os.path.realpath(f"/dev/disk/by-id/{link}"), \
                (name, role, st["devices"])
        sums = json.loads((PERSIST / f"sums-{name}.json").read_text())
        assert checksums(MOUNTS / name / "data", "s") == sums
    assert bystander_unchanged()
    for name in ("sdmcache", "sdmcache2"):          # each loaded its own metadata: still dirty
        assert status(name)["cache"]["dirty_bytes"] > 0


def test_teardown_after_restore_puts_every_file_on_the_origin():
    """(b), continued: the dirty blocks restore brought back reach each bare origin."""
    for name in ("sdmcache", "sdmcache2"):
        want = json.loads((PERSIST / f"sums-{name}.json").read_text())
        res = hotcache("teardown", name, "--yes")
        assert res.code == 0, res.out
        mp = Path(f"/tmp/hcvm-bare-{name}")
        mp.mkdir(exist_ok=True)
        sh("mount", "-o", "ro", f"/dev/disk/by-id/{CACHES[name][4]}", mp)
        try:
            assert checksums(mp / "data", "s") == want
        finally:
            sh("umount", mp)
    assert bystander_unchanged()


def test_lvmcache_records_its_pv_vg_and_lv_uuids():
    """On ssd2, free again: an lvmcache records the PV UUIDs of the PVs it made and the
    VG and LV UUIDs (what restore and teardown check), as lvm2 itself reports them."""
    from hotcache.provision.backends import lvmcache
    from hotcache.provision.block.host import Host

    origin, cache = (os.path.realpath(f"/dev/disk/by-id/virtio-ssd2-part{n}") for n in (1, 2))
    spec = PERSIST / "spec-slvm.yaml"
    spec.write_text(json.dumps({"version": 1, "caches": [{
        "name": "slvm", "backend": "lvmcache", "mode": "writeback",
        "origin": {"path": "/dev/disk/by-id/virtio-ssd2-part1", "wipe": True},
        "cache": {"path": "/dev/disk/by-id/virtio-ssd2-part2", "wipe": True},
        "filesystem": {"mountpoint": str(MOUNTS / "slvm")}}]}))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    st = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"]["slvm"]["backend_state"]
    host = Host()
    pv = {role: lvmcache.report(host, "pvs", "pv_name,pv_uuid", node)[0]["pv_uuid"]
          for role, node in (("origin", origin), ("cache", cache))}
    lv = lvmcache.report(host, "lvs", "vg_uuid,lv_uuid", "hc_slvm/data")[0]
    assert st["pv_uuids"] == pv, (st, pv)
    assert (st["vg_uuid"], st["lv_uuid"]) == (lv["vg_uuid"], lv["lv_uuid"])
    for role, node in (("origin", origin), ("cache", cache)):   # what blkid shows, too
        assert sh("blkid", "-o", "value", "-s", "UUID", node).stdout.strip() == pv[role]
    res = hotcache("restore", "slvm", "--yes", "--json")
    assert res.code == 0 and res.json["changed"] is False, res.out
    res = hotcache("teardown", "slvm", "--yes")
    assert res.code == 0, res.out
    assert bystander_unchanged()

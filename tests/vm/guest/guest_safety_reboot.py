"""Storage safety, boot 2 of 2 (docs/safety.md): the disks came up in
another order (by, hdd, ssd, ssd2 -> vda, vdb, vdc, vdd), so /dev/vda1 and /dev/vda2, the
SSD partitions the spec named, are now the bystander's ext4 partitions, and /dev/vdc1 and
/dev/vdc2, the second dm-cache's origin and SSD, are bcache's SSD and the first dm-cache's
SSD. Nothing is loaded yet: the dm-caches still hold dirty blocks only their metadata
describes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import yaml
from guest_safety import (BYSTANDER, CACHE_BY_ID, CACHES, device_sum, dirty,
                          failed_ssd_named, fails_over_under_the_mounted_filesystem,
                          lvmcache_on_a_wrapped_ssd, new_ssd_attached)
from vmlib import (MOUNTS, PERSIST, behind_header, checksums, dm_ssd, drop_caches,
                   hotcache, partition_ssd2, poll, sh, status, write_files)


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
        loop = behind_header(f"/dev/disk/by-id/{CACHES[name][4]}")
        assert loop, "no hotcache header on the origin"
        sh("mount", "-o", "ro", loop, mp)
        try:
            assert checksums(mp / "data", "s") == want
        finally:
            sh("umount", mp)
            sh("losetup", "--detach", loop)
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
    assert bystander_unchanged()


def test_lvmcache_lv_renamed_between_boots_is_refused_and_nothing_is_wiped():
    """The cached LV renamed while it was down, its PVs still in the recorded VG: restore
    refuses naming the missing LV (it used to plan wipefs, pvcreate, vgcreate, lvcreate
    and lvconvert on both disks); renamed back, restore brings every file back."""
    cfg = ["--config", "devices { use_devicesfile=0 }"]
    want = write_files(MOUNTS / "slvm" / "data", 10, 128 * 1024, "r")
    pvs = {n: sh("blkid", "-o", "value", "-s", "UUID",
                 f"/dev/disk/by-id/virtio-ssd2-part{n}").stdout for n in (1, 2)}
    sh("umount", MOUNTS / "slvm")
    sh("timeout", "60", "lvchange", *cfg, "--activate", "n", "hc_slvm/data")
    sh("timeout", "60", "lvrename", *cfg, "hc_slvm", "data", "renamed")
    res = hotcache("restore", "slvm", "--yes")
    assert res.code == 3, res.out
    assert "hc_slvm/data" in res.out and "is not found" in res.out, res.out
    assert "lvrename hc_slvm NEW-NAME data" in res.out, res.out
    assert {n: sh("blkid", "-o", "value", "-s", "UUID",
                  f"/dev/disk/by-id/virtio-ssd2-part{n}").stdout for n in (1, 2)} == pvs
    lvs = sh("timeout", "60", "lvs", *cfg, "--noheadings", "-o", "lv_name,segtype",
             "hc_slvm").stdout.split()
    assert "renamed" in lvs and "cache" in lvs, lvs          # still the cached LV
    sh("timeout", "60", "lvrename", *cfg, "hc_slvm", "renamed", "data")
    res = hotcache("restore", "slvm", "--yes")
    assert res.code == 0, res.out
    assert checksums(MOUNTS / "slvm" / "data", "r") == want
    res = hotcache("teardown", "slvm", "--yes")
    assert res.code == 0, res.out
    assert bystander_unchanged()


# Two equal-size "slots" whose identity (a dm UUID, as a QEMU SATA or libvirt SCSI serial)
# stays with the slot while the media behind them swap. Free again by now: ssd parts 2
# and 4 (the first dm-cache's and boot 1's failing-origin dm-cache's), hdd parts 2 and 4.
SLOTS = {"swa": ("SLOT-A", 2), "swb": ("SLOT-B", 4)}
SLOT_MIB = 72


def slots(order: dict[str, int]) -> None:
    """(Re)create each slot on the SSD partition `order` names."""
    for name, (slot, _) in SLOTS.items():
        if os.path.exists(f"/dev/mapper/{slot}"):
            sh("dmsetup", "remove", "--retry", slot)
        part = os.path.realpath(f"/dev/disk/by-id/virtio-ssd-part{order[name]}")
        sh("dmsetup", "create", slot, "--uuid", f"HOTCACHE-TEST-{slot}",
           "--table", f"0 {SLOT_MIB * 2048} linear {part} 0")
    sh("udevadm", "settle")


def remove_tables(name: str) -> None:
    """What a reboot does to a raw dm-cache: its tables are gone."""
    for part in ("", "-cache", "-data", "-meta"):      # the top device first
        sh("dmsetup", "remove", "--retry", f"hc-{name}{part}")


def test_swapped_equal_size_ssds_are_never_mixed_up_and_a_failed_restore_mounts_nothing():
    """Guest tier: two writeback dm-caches with dirty blocks on equal-size SSDs whose
    identity stays with the slot while the disks swap. Each restore refuses (hotcache's
    header on each SSD names the other cache) and loads nothing; the restore is reported
    failed, the mountpoint stays empty, and systemd would not mount the fstab entry (it
    requires the restore unit). With the disks back in their slots, restore brings every
    file back from each cache's own metadata."""
    from hotcache.provision.engine import bootunit, restorelog
    from hotcache.provision.observe import doctor
    from hotcache.provision import mapping

    home = {name: n for name, (_, n) in SLOTS.items()}
    slots(home)
    caches = [{"name": name, "backend": "dm-cache", "mode": "writeback",
               "tunables": {"migration_threshold": 64},
               "origin": {"path": f"/dev/disk/by-id/virtio-hdd-part{n}", "wipe": True},
               "cache": {"path": f"/dev/disk/by-id/dm-uuid-HOTCACHE-TEST-{slot}", "wipe": True},
               "filesystem": {"mountpoint": str(MOUNTS / name)}}
              for name, (slot, n) in SLOTS.items()]
    spec = PERSIST / "spec-swap.yaml"
    spec.write_text(yaml.safe_dump({"version": 1, "caches": caches}))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    sums = {}
    for name in SLOTS:
        folder = MOUNTS / name / "data"
        write_files(folder, 12, 128 * 1024, "w")
        for _ in range(4):
            drop_caches()
            checksums(folder, "w")
        for i in range(12):
            with open(folder / f"w{i:04d}.bin", "r+b") as f:
                f.write(os.urandom(128 * 1024))
        sh("sync")
        sums[name] = checksums(folder, "w")
        assert poll(f"dirty blocks in {name}", lambda: dirty(name), timeout=20) > 0
        sh("umount", MOUNTS / name)
        remove_tables(name)

    slots({"swa": home["swb"], "swb": home["swa"]})     # the media swapped, the slots did not
    before = {n: device_sum(f"/dev/disk/by-id/virtio-ssd-part{n}") for n in home.values()}
    # What systemd makes of hotcache's fstab at boot: its own generator, on that file.
    generated = Path("/tmp/hcvm-generated")
    generated.mkdir(exist_ok=True)
    subprocess.run(["timeout", "60", "/lib/systemd/system-generators/systemd-fstab-generator",
                    generated, generated, generated], check=True, capture_output=True,
                   env={"SYSTEMD_FSTAB": str(PERSIST / "fstab"), "SYSTEMD_PROC_CMDLINE": "",
                        "PATH": os.environ["PATH"]})
    for name in SLOTS:
        res = hotcache("restore", name, "--yes")
        assert res.code == 3, res.out
        assert "hotcache wrote hotcache" in res.out, res.out
        unit = (generated / bootunit.mount_unit(str(MOUNTS / name))).read_text()
        assert f"\nRequires=hotcache-restore-{name}.service\n" in unit, unit
        assert f"\nAfter=hotcache-restore-{name}.service\n" in unit, unit
        assert restorelog.failure(name), "the failed restore is recorded for this boot"
        found = doctor.check_restore_failed(mapping.load(PERSIST / "mappings.yaml")["caches"],
                                            doctor.Runner())
        assert name in [f.subject for f in found if f.code == "RESTORE_FAILED"], found
        assert not os.path.ismount(MOUNTS / name)
    assert "hc-sw" not in sh("dmsetup", "ls").stdout          # nothing loaded
    assert {n: device_sum(f"/dev/disk/by-id/virtio-ssd-part{n}") for n in home.values()} \
        == before                                               # nothing written

    slots(home)                                                 # back in their slots
    for name in SLOTS:
        res = hotcache("restore", name, "--yes")
        assert res.code == 0, res.out
        assert restorelog.failure(name) is None
        assert checksums(MOUNTS / name / "data", "w") == sums[name]
        assert dirty(name) > 0                                  # its own dirty blocks
    for name in SLOTS:
        res = hotcache("teardown", name, "--yes")
        assert res.code == 0, res.out
    for slot, _ in SLOTS.values():
        sh("dmsetup", "remove", "--retry", slot)
    assert bystander_unchanged()


def test_a_cache_on_its_origin_is_mounted_from_the_origin_after_the_reboot():
    """Boot 1 left `fo` switched to its origin (its second SSD dead): the boot's restore
    never loads a table on the failed SSD; it mounts the filesystem from the origin alone,
    and every file is right. Then a new SSD: `apply` alone attaches a new cache to the
    same filesystem (the origin unmounted for a moment, the cache device mounting it)."""
    name = "fo"
    sums = json.loads((PERSIST / f"sums-{name}.json").read_text())
    res = hotcache("restore", name, "--yes")
    assert res.code == 0, res.out
    hdd = os.path.realpath("/dev/disk/by-id/virtio-hdd-part6")
    mounted = {line.split()[1]: line.split()[0] for line in open("/proc/mounts")}
    # the filesystem starts past hotcache's header: the top device maps it, on a linear
    # mapping of the whole origin (no table on the failed SSD)
    assert os.path.realpath(mounted[str(MOUNTS / name)]) == \
        os.path.realpath(f"/dev/mapper/hc-{name}"), mounted
    hdd_num = open(f"/sys/class/block/{os.path.basename(hdd)}/dev").read().strip()
    assert sh("dmsetup", "table", f"hc-{name}-cache").stdout.split()[2:4] == \
        ["linear", hdd_num]
    assert sh("blkid", "--probe", "--output", "export", hdd, check=False).stdout.find(
        "TYPE=xfs") < 0, "the bare origin shows the filesystem"
    drop_caches()
    assert checksums(MOUNTS / name / "data", "f") == sums
    row = status(name)
    assert any(f["message"].startswith("running on the origin since")
               for f in row["findings"]), row["findings"]

    ssd = "/dev/disk/by-id/virtio-ssd-part4"
    new = "fonew"
    dm_ssd(ssd, new)
    fs_uuid = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name][
        "filesystem"]["uuid"]
    spec = PERSIST / f"spec-{name}.yaml"
    spec.write_text(spec.read_text().replace("/dev/mapper/fonew1", f"/dev/mapper/{new}"))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    assert "warm-up starts over" in res.out, res.out
    entry = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name]
    assert entry["filesystem"]["uuid"] == fs_uuid and "on_origin" not in entry
    assert sh("dmsetup", "table", f"hc-{name}-cache").stdout.split()[2] == "cache"
    drop_caches()
    assert checksums(MOUNTS / name / "data", "f") == sums


def test_lvmcache_on_its_origin_is_mounted_from_its_lv_after_the_reboot():
    """Boot 1 (the fault chain's) left lvmcache `lo` switched to its origin sub-LV, then
    its SSD went for good: the boot's restore never activates the cache on it. lvm2
    takes the cache volume off the inactive LV, the missing PV leaves the VG, and the LV,
    now on the origin alone, is mounted: every file right, status saying where it runs."""
    name = "lo"
    sums = json.loads((PERSIST / f"sums-{name}.json").read_text())
    res = hotcache("restore", name, "--yes")
    assert res.code == 0, res.out
    st = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name][
        "backend_state"]
    lv = f"{st['vg']}/{st['origin_lv']}"
    mounted = {line.split()[1]: line.split()[0] for line in open("/proc/mounts")}
    assert os.path.realpath(mounted[str(MOUNTS / name)]) == os.path.realpath(f"/dev/{lv}"), \
        mounted
    cfg = ["--config", "devices { use_devicesfile=0 }"]
    segtype = sh("lvs", *cfg, "--noheadings", "-o", "segtype", lv).stdout.strip()
    assert segtype == "linear", segtype         # the cache volume is off the LV
    drop_caches()
    assert checksums(MOUNTS / name / "data", "o") == sums
    row = status(name)
    assert any(f["message"].startswith("running on the origin since")
               for f in row["findings"]), row["findings"]


def test_lvmcache_failed_ssd_named_torn_down_and_a_new_one_attached(monkeypatch, tmp_path):
    """lvmcache in writethrough on ssd2, its SSD a dm-linear device with a dm
    UUID, switched to the error target after the data was read through the cache. LVM is
    shown the wrapper only (a global_filter hides the partition under it, which would
    show the same PV twice). status names the failure within a bounded time; `teardown
    --cache-failed` ends with exit 0, the entry, unit and fstab line gone, every file on
    the LV, now the origin alone; then a new SSD is attached with `hotcache apply`, the
    filesystem kept, and every file reads back through the new cache. That SSD dies in
    turn, under the mounted filesystem: the cache fails over to its origin in place, and
    `teardown --cache-failed` then leaves every file on the LV."""
    # The fault chain's boots leave ssd2 unused: its partitions are made here.
    partition_ssd2()
    dm, name = "lvmfail", "lf"
    part, sectors, spec, folder, sums = lvmcache_on_a_wrapped_ssd(
        name, dm, "ssd2-part2", "ssd2-part1", "l", tmp_path, monkeypatch)
    fs_uuid = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name][
        "filesystem"]["uuid"]
    sh("dmsetup", "suspend", "--noflush", dm)
    sh("dmsetup", "load", dm, "--table", f"0 {sectors} error")
    sh("dmsetup", "resume", dm)

    failed_ssd_named(name)

    res = hotcache("teardown", name, "--cache-failed", "--yes")
    assert res.code == 0, res.out
    mapping = yaml.safe_load((PERSIST / "mappings.yaml").read_text())
    assert name not in mapping["caches"] and name in mapping["detached"]
    assert not (PERSIST / "units" / f"hotcache-restore-{name}.service").exists()
    assert fs_uuid not in (PERSIST / "fstab").read_text()
    sh("udevadm", "settle")
    sh("mount", "-o", "noatime", f"UUID={fs_uuid}", MOUNTS / name)
    assert checksums(folder, "l") == sums

    # A new SSD: the same partition, zeroed (the stale PV label goes), a new dm UUID.
    sh("dmsetup", "remove", dm)
    new = "lvmnew"
    sectors = dm_ssd(part, new)
    entry = new_ssd_attached(name, spec, dm, new, fs_uuid)
    assert set(entry["backend_state"]["pv_uuids"]) == {"origin", "cache"}
    drop_caches()
    assert checksums(folder, "l") == sums
    row = status(name)
    assert row["ok"] and row["cache"]["mode"] == "writethrough", row
    fails_over_under_the_mounted_filesystem(name, new, sectors, folder, sums, "l")
    res = hotcache("teardown", name, "--cache-failed", "--yes")
    assert res.code == 0, res.out
    sh("udevadm", "settle")
    sh("mount", "-o", "noatime", f"UUID={fs_uuid}", MOUNTS / name)
    assert checksums(folder, "l") == sums
    sh("umount", MOUNTS / name)
    sh("dmsetup", "remove", new)

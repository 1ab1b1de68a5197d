"""A new SSD for a cache whose failed SSD `teardown --cache-failed` took off, planned
against a fake host: the teardown records the origin (by identity), the filesystem and
what the backend keeps; `hotcache apply` with a new SSD in the spec attaches a new cache
to that filesystem without formatting it, for bcache, dm-cache and lvmcache, and says that
warm-up starts over. An origin that no longer carries that filesystem, or is mounted
somewhere else, is refused before anything runs, even with `wipe: true` in the spec."""

from __future__ import annotations

import shutil
import uuid

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.engine import bootunit, reattach
from hotcache.provision.engine.apply import plan_apply
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.engine.spec import HostSpec
from hotcache.provision.errors import RefusedError
from hotcache.provision.plan import RunContext
from hotcache.provision.records import HotCopy
from hotcache.provision.system import fstab
from hotcache.provision.system.runner import Runner

from tests.unit.backends.test_plans import (BACKING, BCACHE_STATE, DM_STATE, FS, HDD_MIB,
                                            MKDIR, MP, NOFILE, READY, UNIT, cached_device,
                                            checked, fstab_write, mount, recorded, steps,
                                            watcher)
from tests.unit.backends.test_plans import fake  # noqa: F401  (the fixture)

NEW_CSET = "55555555-5555-4555-8555-555555555555"
NEW_SSD = "/dev/vdd"
BUILDING = f"record c1 in the mapping as building (filesystem UUID {FS})"


def spec(backend: str) -> HostSpec:
    """c1's spec, the failed SSD replaced by a new one (vdd); `wipe: true` stays on both."""
    return HostSpec.model_validate({"caches": [{
        "name": "c1", "backend": backend, "mode": "writethrough",
        "origin": {"path": "/dev/vdb", "wipe": True}, "cache": {"path": NEW_SSD, "wipe": True},
        "filesystem": {"mountpoint": MP}}]})


def detach(fake, backend: str, backend_state: dict, kept: dict) -> None:
    """c1 as `teardown --cache-failed` leaves it: its entry gone, the origin recorded as
    waiting for a new SSD (with `kept`, the backend's surviving facts), the new SSD in."""
    recorded(fake, backend, backend_state, "/dev/whatever", mounted=False)
    fstab.set_entry(fake.env_.fstab, "c1", None, FS, [MP])      # the teardown removed
    shutil.rmtree(bootunit.unit_dir())                          # its line and its unit
    data = mapping.load(fake.env_.state)
    entry = data["caches"].pop("c1")
    entry.hot_copies = {"/mnt/c1/imagenet": HotCopy(name="imagenet", verify_ok=True)}
    reattach.record(data, "c1", entry, kept)
    mapping.save(fake.env_.state, data)
    fake.disk("vdd", "ssd2", 256)


def apply(fake, backend: str):
    return plan_apply(spec(backend), fake.env_)


def run_step(plan, starts: str) -> None:
    """Run hotcache's own step (a mapping edit) for real; the fake runner runs nothing."""
    step = next(s for s in plan.steps if s.summary.startswith(starts))
    step.action(RunContext(Runner(dry_run=False)))


WARM_NOTE = f"warm-up starts over (`hotcache warm {MP}`)"


# --- dm-cache ---------------------------------------------------------------------------

def dm_detached(fake, *, mounted_at: str | None = MP) -> None:
    detach(fake, "dm-cache", DM_STATE, {})
    fake.fs("vdb", "xfs", FS)           # the origin alone shows the filesystem
    if mounted_at:
        fake.mount("/dev/vdb", mounted_at, "noatime")


def test_dm_cache_new_ssd_gets_new_tables_over_the_origin_which_is_never_formatted(fake):
    dm_detached(fake)
    plan = apply(fake, "dm-cache")
    assert steps(plan) == [
        ["umount", MP],
        BUILDING,
        ["wipefs", "--all", NEW_SSD],
        "write hotcache's header (cache c1, a new UUID) in the first 4 KiB of the SSD: it "
        "proves which cache the SSD is, where serials can follow the slot",
        ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vdd 8"],
        ["dmsetup", "create", "hc-c1-data", "--table", "0 515968 linear /dev/vdd 8200"],
        ["dd", "if=/dev/zero", "of=/dev/mapper/hc-c1-meta", "bs=4096", "count=1",
         "oflag=direct"],
        ["dmsetup", "create", "hc-c1", "--table",
         "0 2097152 cache /dev/mapper/hc-c1-meta /dev/mapper/hc-c1-data /dev/vdb 128 1 "
         "writethrough smq 0"],
        "record the dm-cache geometry and table names in the mapping",
        UNIT.format(units=bootunit.unit_dir()),
        watcher(),
        checked("/dev/mapper/hc-c1"), MKDIR, mount("/dev/mapper/hc-c1"),
        fstab_write(fake), READY,
    ]
    assert not any(s.argv and s.argv[0] == "mkfs.xfs" for s in plan.steps)
    assert any(WARM_NOTE in n for n in plan.notes), plan.notes


def test_dm_cache_origin_mounted_elsewhere_is_refused(fake):
    dm_detached(fake, mounted_at="/srv/data")
    with pytest.raises(RefusedError, match="its filesystem is mounted at /srv/data"):
        apply(fake, "dm-cache")


@pytest.mark.parametrize("backend", ["dm-cache", "bcache", "lvmcache"])
def test_an_origin_that_lost_the_filesystem_is_refused_and_never_wiped(fake, backend):
    """The origin now shows another filesystem (someone reformatted it): the spec still
    says `wipe: true`, yet nothing is planned, neither a wipe of it nor of the new SSD."""
    state = {"dm-cache": DM_STATE, "bcache": BCACHE_STATE,
             "lvmcache": {"vg": "hc_c1", "origin_lv": "data", "adopted": False}}[backend]
    detach(fake, backend, state, {"bcache": {"backing_uuid": BACKING}}.get(backend, {}))
    fake.fs("vdb", "ext4", "someone-elses")
    with pytest.raises(RefusedError, match="no longer carries what the failed cache left") \
            as err:
        apply(fake, backend)
    assert "hotcache teardown c1 --forget" in str(err.value)


# --- bcache -----------------------------------------------------------------------------

def test_bcache_new_ssd_becomes_a_new_cache_set_attached_to_the_running_backing_device(
        fake, monkeypatch):
    """The backing device runs without a cache, its bcache device mounted: a new cache
    set is made on the new SSD and attached in place, with no unmount and no mkfs."""
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(NEW_CSET))
    detach(fake, "bcache", BCACHE_STATE, {"backing_uuid": BACKING})
    fake.fs("vdb", "bcache", BACKING)
    fake.sysfs_file("/sys/class/block/vdb/bcache/state", "no cache")
    cached_device(fake, "bcache0", f"/dev/bcache/by-uuid/{BACKING}")
    fake.mount(f"/dev/bcache/by-uuid/{BACKING}", MP, "noatime", "nosuid", "nodev")
    plan = apply(fake, "bcache")
    assert steps(plan) == [
        BUILDING,
        ["wipefs", "--all", NEW_SSD],
        ["make-bcache", "-C", "--bucket", "256k", "--block", "4k", "--cset-uuid", NEW_CSET,
         NEW_SSD],
        "record the cache set and backing device UUIDs in the mapping",
        "register /dev/vdd and /dev/vdb with the kernel (udev may have done it already)",
        f"attach the backing device to cache set {NEW_CSET}",
        "wait for udev's /dev/bcache/by-uuid link",
        "set bcache cache_mode to writethrough",
        "set bcache sequential_cutoff to 0",
        "set bcache congested_read_threshold_us to 0",
        "set bcache congested_write_threshold_us to 0",
        UNIT.format(units=bootunit.unit_dir()),
        fstab_write(fake), READY,
    ]
    assert any(WARM_NOTE in n for n in plan.notes), plan.notes


# --- lvmcache ---------------------------------------------------------------------------

LV_KEPT = {"vg": "hc_c1", "origin_lv": "data", "adopted": False, "vg_uuid": "VG-1",
           "lv_uuid": "LV-1", "pv_uuids": {"origin": "pv-vdb"}}


def test_lvmcache_new_ssd_joins_the_vg_and_is_attached_to_the_lv_in_place(fake):
    """The LV, on the origin alone since the failed cache was taken off, is mounted: the
    new SSD becomes a PV of the same VG and a cache volume attached to the LV online; its
    PV UUID joins the recorded ones."""
    detach(fake, "lvmcache", {**LV_KEPT, "pv_uuids": {"origin": "pv-vdb", "cache": "pv-old"}},
           LV_KEPT)
    fake.fs("vdb", "LVM2_member", "pv-vdb")
    fake.pvs["/dev/vdb"] = "hc_c1"
    fake.lvs["hc_c1/data"] = {"lv_name": "data", "lv_attr": "-wi-ao----", "segtype": "linear",
                              "cache_mode": "", "cache_policy": "", "kernel_cache_settings": "",
                              "vg_uuid": "VG-1", "lv_uuid": "LV-1"}
    cached_device(fake, "dm-0", "/dev/hc_c1/data")
    fake.mount("/dev/hc_c1/data", MP, "noatime", "nosuid", "nodev")
    plan = apply(fake, "lvmcache")
    assert steps(plan) == [
        BUILDING,
        ["wipefs", "--all", NEW_SSD],
        ["pvcreate", *NOFILE, "--yes", NEW_SSD],
        ["vgextend", *NOFILE, "--yes", "hc_c1", NEW_SSD],
        ["lvcreate", *NOFILE, "--yes", "--name", "data_hccache", "--extents", "100%PVS",
         "hc_c1", NEW_SSD],
        ["lvconvert", *NOFILE, "--yes", "--type", "cache", "--cachevol", "hc_c1/data_hccache",
         "--cachemode", "writethrough", "--cachepolicy", "smq", "hc_c1/data"],
        "record the PV, VG and LV UUIDs in the mapping (a later restore or teardown "
        "checks them)",
        UNIT.format(units=bootunit.unit_dir()),
        watcher(),
        fstab_write(fake), READY,
    ]
    # The recorded VG and LV are proven: another VG under the name stops the plan.
    fake.lvs["hc_c1/data"]["vg_uuid"] = "VG-other"
    with pytest.raises(RefusedError, match="UUID is VG-other, recorded VG-1"):
        apply(fake, "lvmcache")


# --- the record: written by the teardown, dropped once the new cache is ready ---------------

def test_teardown_cache_failed_records_the_origin_waiting_for_a_new_ssd(fake):
    """Running the teardown's mapping step: the entry is gone, the origin (and only the
    origin) is recorded with the filesystem and what the backend keeps."""
    recorded(fake, "bcache", BCACHE_STATE, f"/dev/bcache/by-uuid/{BACKING}", mounted=False)
    fake.fs("vdb", "bcache", BACKING)
    fake.sysfs_file("/sys/class/block/vdb/bcache/state", "no cache")
    fake.sysfs_file("/sys/class/block/vdb/bcache/dirty_data", "0.0k")
    plan = plan_teardown("c1", fake.env_, cache_failed=True)
    assert any("run `hotcache apply SPEC`: the new cache is attached to this filesystem"
               in n for n in plan.notes), plan.notes
    run_step(plan, "remove c1 from the mapping")
    data = mapping.load(fake.env_.state)
    assert "c1" not in data["caches"]
    kept = reattach.detached(data)["c1"]
    assert list(kept.devices) == ["origin"] and kept.filesystem.uuid == FS
    assert kept.state == "building" and kept.backend_state.dump() == {"backing_uuid": BACKING}


def test_a_detached_cache_is_not_torn_down_and_forget_drops_the_record(fake):
    detach(fake, "dm-cache", DM_STATE, {})
    with pytest.raises(RefusedError, match="its failed SSD was taken off") as err:
        plan_teardown("c1", fake.env_)
    assert "hotcache apply SPEC" in err.value.hint
    plan = plan_teardown("c1", fake.env_, forget=True)
    assert steps(plan) == ["forget that c1 waits for a new SSD (the origin and its "
                           "filesystem stay as they are)"]
    run_step(plan, "forget that c1")
    assert "detached" not in yaml.safe_load(fake.env_.state.read_text())


def test_ready_record_drops_the_detached_one_and_keeps_the_hot_copies(fake):
    dm_detached(fake)
    plan = apply(fake, "dm-cache")
    run_step(plan, "record c1 in the mapping as building")
    data = mapping.load(fake.env_.state)
    assert data["caches"]["c1"].state == "building" and "c1" in reattach.detached(data)
    fake.disk("dm-0", None, HDD_MIB, type="xfs", uuid=FS)
    fake.link("/dev/mapper/hc-c1", "/dev/dm-0")
    run_step(plan, READY)
    data = mapping.load(fake.env_.state)
    entry = data["caches"]["c1"]
    assert entry.state == "ready" and set(entry.devices) == {"origin", "cache"}
    assert entry.hot_copies["/mnt/c1/imagenet"].verify_ok is True
    assert "detached" not in data


def test_a_detached_origin_is_not_given_to_another_cache(fake):
    """Another cache's spec naming the origin that waits for a new SSD (with wipe: true)
    is refused: that origin still holds c1's filesystem."""
    dm_detached(fake, mounted_at=None)
    other = HostSpec.model_validate({"caches": [{
        "name": "c2", "backend": "dm-cache", "origin": {"path": "/dev/vdb", "wipe": True},
        "cache": {"path": NEW_SSD, "wipe": True}, "filesystem": {"mountpoint": "/mnt/c2"}}]})
    with pytest.raises(RefusedError, match="the mapping records for cache c1"):
        plan_apply(other, fake.env_)


def test_status_says_which_cache_waits_for_a_new_ssd(fake):
    """`hotcache status` (and `status NAME`, and --json) names the cache whose failed SSD
    was taken off, the origin that keeps its filesystem, and the way forward."""
    import json

    from tests.helpers import hotcache

    detach(fake, "dm-cache", DM_STATE, {})
    env = {"HOTCACHE_STATE": str(fake.env_.state), "HOTCACHE_FSTAB": str(fake.env_.fstab)}
    for args in (["status"], ["status", "c1"]):
        proc = hotcache(*args, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "c1 (dm-cache): no cache" in proc.stdout and "hotcache apply SPEC" in proc.stdout
        assert "virtio-hdd1" in proc.stdout and FS in proc.stdout
    doc = json.loads(hotcache("status", "--json", env=env).stdout)
    assert doc["caches"] == [] and doc["ok"] is True
    assert [(w["name"], w["filesystem_uuid"]) for w in doc["waiting_for_ssd"]] == [("c1", FS)]


def test_doctor_warns_of_a_cache_waiting_for_a_new_ssd(fake):
    """doctor's finding is a warning (the data is readable, without a cache) whose fix is
    the apply that attaches a new SSD; a failed cache's advice leads there too."""
    from hotcache.provision.engine.status import Code as Drift
    from hotcache.provision.observe import doctor

    detach(fake, "dm-cache", DM_STATE, {})
    (found,) = doctor.check_waiting_for_ssd(mapping.load(fake.env_.state))
    assert (found.severity, found.code, found.subject) == ("warning", "WAITING_FOR_SSD", "c1")
    assert FS in found.message and "virtio-hdd1" in found.message
    assert "`hotcache apply SPEC`" in found.fix and "teardown c1 --forget" in found.fix
    assert "hotcache apply SPEC` attaches a new cache" in doctor.advice(Drift.CACHE_FAILED,
                                                                          name="c1")


def test_lvmcache_origin_must_be_the_recorded_pv(fake):
    """Another PV of the recorded VG named as the origin (its PV UUID is not the one
    recorded) is not what the failed cache left: refused before anything runs."""
    detach(fake, "lvmcache", LV_KEPT, LV_KEPT)
    fake.fs("vdb", "LVM2_member", "pv-someone-else")
    fake.pvs["/dev/vdb"] = "hc_c1"
    with pytest.raises(RefusedError, match="no longer carries what the failed cache left"):
        apply(fake, "lvmcache")


def test_a_normal_teardown_of_an_unfinished_reattach_drops_the_record_and_never_wipes(fake):
    """The new SSD's apply died after recording the cache as building: a teardown with
    --wipe is refused (the origin holds the kept filesystem); `--forget` drops the
    waiting record with the entry."""
    dm_detached(fake)
    plan = apply(fake, "dm-cache")
    run_step(plan, "record c1 in the mapping as building")
    with pytest.raises(RefusedError, match="--wipe would erase it"):
        plan_teardown("c1", fake.env_, wipe=True)
    plan = plan_teardown("c1", fake.env_, forget=True)    # its tables never loaded
    run_step(plan, "remove c1 from the mapping")
    data = mapping.load(fake.env_.state)
    assert "c1" not in data["caches"] and "detached" not in data

"""A new SSD for a cache the fail-over watcher switched to its origin, planned against a
fake host: `hotcache apply` with the new SSD in the spec attaches a new cache to the
filesystem the origin carries, with no teardown first. While the switched device is
still live (the same boot), dm-cache's new cache table is loaded in place of the linear
mapping, under the mounted filesystem: no unmount, no mount, no format. After a boot
(the filesystem mounted from the origin alone) the origin is unmounted for a moment, as
after `teardown --cache-failed`. A spec that still names the failed SSD, and a backend
that cannot take the failed cache off under a mounted filesystem (lvmcache), are
refused before anything runs, each naming what works."""

from __future__ import annotations

import pytest

from hotcache.provision import mapping
from hotcache.provision.engine import bootunit
from hotcache.provision.engine.apply import plan_apply
from hotcache.provision.engine.spec import HostSpec
from hotcache.provision.errors import RefusedError
from hotcache.provision.plan import RunContext
from hotcache.provision.records import HotCopy, OnOrigin
from hotcache.provision.system.runner import Runner

from tests.unit.backends.test_plans import (DM_TABLE, FS, MKDIR, MP, UNIT, checked,
                                            dm_built, lvm_built, mount, steps)
from tests.unit.backends.test_plans import fake  # noqa: F401  (the fixture)
from tests.unit.engine.test_reattach import NEW_SSD, WARM_NOTE, spec

BUILDING = f"record c1 in the mapping as building (filesystem UUID {FS})"
READY = "record c1 in the mapping as ready"
LINEAR = "0 2097152 linear 254:16 0"        # the whole origin (vdb), as the switch loads it
HEADER = ("write hotcache's header (cache c1, a new UUID) in the first 4 KiB of the SSD: it "
          "proves which cache the SSD is, where serials can follow the slot")
NEW_TABLE = ("0 2097152 cache /dev/mapper/hc-c1-meta /dev/mapper/hc-c1-data /dev/vdb 128 1 "
             "writethrough smq 0")
NEW_MAPS = [
    ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vdd 8"],
    ["dmsetup", "create", "hc-c1-data", "--table", "0 515968 linear /dev/vdd 8200"],
]
ZERO = ["dd", "if=/dev/zero", "of=/dev/mapper/hc-c1-meta", "bs=4096", "count=1",
        "oflag=direct"]
GEOMETRY = "record the dm-cache geometry and table names in the mapping"
RESUME = ("switch to it under the mounted filesystem (no unmount); if the kernel refuses, "
          "the linear mapping runs on, never a suspended device")


def on_origin(fake, backend: str = "dm-cache") -> None:
    """c1's entry as the watcher leaves it once it switched the top device; the new SSD
    (vdd) is in, and one hot copy is recorded."""
    data = mapping.load(fake.env_.state)
    entry = data["caches"]["c1"]
    entry.on_origin = OnOrigin(since="2026-12-05T10:00:00+00:00",
                               said="dm-cache reports Fail", device="hc-c1", table=LINEAR,
                               replaced=DM_TABLE.format(mode="writethrough"))
    entry.hot_copies = {"/mnt/c1/imagenet": HotCopy(name="imagenet", verify_ok=True)}
    mapping.save(fake.env_.state, data)
    fake.disk("vdd", "ssd2", 256)


def switched(fake) -> None:
    """A built dm-cache whose top device the watcher switched: the linear table live,
    the failed SSD's maps still loaded, the filesystem mounted on the top device."""
    dm_built(fake)
    fake.tables["hc-c1"] = LINEAR
    on_origin(fake)


def test_dm_cache_new_ssd_is_attached_under_the_mounted_filesystem(fake):
    switched(fake)
    plan = plan_apply(spec("dm-cache"), fake.env_)
    assert steps(plan) == [
        BUILDING,
        ["wipefs", "--all", NEW_SSD],
        HEADER,
        ["dmsetup", "remove", "--force", "--retry", "hc-c1-meta"], NEW_MAPS[0],
        ["dmsetup", "remove", "--force", "--retry", "hc-c1-data"], NEW_MAPS[1],
        ZERO,
        GEOMETRY,           # before the cache goes live: a rerun never zeroes it then
        ["dmsetup", "reload", "hc-c1", "--table", NEW_TABLE],
        RESUME,
        UNIT.format(units=bootunit.unit_dir()),     # it waits for the new SSD at boot
        READY,
    ]
    assert not any(s.argv and s.argv[0] in ("umount", "mount", "mkfs.xfs") for s in plan.steps)
    assert any(WARM_NOTE in n for n in plan.notes), plan.notes


def test_the_new_cache_is_recorded_without_the_fail_over_and_keeps_the_hot_copies(fake):
    switched(fake)
    plan = plan_apply(spec("dm-cache"), fake.env_)
    for summary in (BUILDING, READY):
        step = next(s for s in plan.steps if s.summary.startswith(summary))
        step.action(RunContext(Runner(dry_run=False)))
        entry = mapping.load(fake.env_.state)["caches"]["c1"]
        assert entry.on_origin is None and entry.backend_state.data_sectors is None
        assert entry.hot_copies["/mnt/c1/imagenet"].verify_ok is True
    assert entry.state == "ready" and entry.devices["cache"].node == NEW_SSD
    assert entry.devices["origin"].node == "/dev/vdb"


def test_dm_cache_after_a_boot_the_origin_is_unmounted_for_the_attach(fake):
    """A boot restored c1 on its origin alone (no table loaded; the origin mounted on the
    mountpoint): the new cache device is created over the origin and mounts it again."""
    dm_built(fake, loaded=False)
    on_origin(fake)
    fake.mount("/dev/vdb", MP, "noatime", "nosuid", "nodev")
    plan = plan_apply(spec("dm-cache"), fake.env_)
    assert steps(plan) == [
        ["umount", MP],
        BUILDING,
        ["wipefs", "--all", NEW_SSD],
        HEADER, *NEW_MAPS, ZERO,
        ["dmsetup", "create", "hc-c1", "--table", NEW_TABLE],
        GEOMETRY,
        UNIT.format(units=bootunit.unit_dir()),
        checked("/dev/mapper/hc-c1"), MKDIR, mount("/dev/mapper/hc-c1"), READY,
    ]


def with_cache(path: str) -> HostSpec:
    doc = spec("dm-cache").model_dump(mode="json")
    doc["caches"][0]["cache"]["path"] = path
    return HostSpec.model_validate(doc)


def test_the_spec_as_it_was_is_never_consent_to_attach_whatever_its_name_shows(fake):
    """A routine apply (Ansible's, every play) of the spec as it was before the SSD
    failed: even where that kernel name now shows another disk, with `wipe: true` in the
    spec, nothing is planned."""
    switched(fake)
    fake.unplug("vdc")                      # the failed SSD pulled; vdc now another disk
    fake.disk("vdc", "data7", 256)
    with pytest.raises(RefusedError, match=r"still names the cache device it was built on "
                                           r"\(/dev/vdc\)"):
        plan_apply(with_cache("/dev/vdc"), fake.env_)


def test_a_spec_that_names_the_failed_ssd_another_way_is_refused(fake):
    switched(fake)
    with pytest.raises(RefusedError, match=r"c1.cache \(/dev/disk/by-id/virtio-ssd1\): "
                                           r"that is the SSD that failed \(/dev/vdc\)"):
        plan_apply(with_cache("/dev/disk/by-id/virtio-ssd1"), fake.env_)


def test_lvmcache_on_its_origin_is_refused_naming_the_teardown_that_works(fake):
    lvm_built(fake)
    on_origin(fake, "lvmcache")
    with pytest.raises(RefusedError, match=r"`hotcache teardown c1 --cache-failed` does "
                                           r"that, then `hotcache apply SPEC`"):
        plan_apply(spec("lvmcache"), fake.env_)


def test_doctor_tells_a_cache_on_its_origin_to_apply_a_new_ssd_not_to_take_it_apart():
    from hotcache.provision.observe import doctor

    def fix(since):
        failed = {"device": "/dev/vdc", "kernel": "Fail", "dirty_bytes": 0,
                  "message": "cache failed", "on_origin_since": since}
        row = {"ok": False, "mountpoint": MP, "cache_failed": failed,
               "findings": [{"code": "CACHE_FAILED", "message": "cache failed"}]}
        (found,) = doctor.check_drift({"c1": row})
        return found.code, found.fix
    code, moved = fix("2026-12-05T10:00:00+00:00")
    assert code == "CACHE_FAILED" and moved.startswith("c1 runs on its origin"), moved
    assert "`hotcache apply SPEC` attaches a new cache" in moved
    assert "takes the cache apart" in fix(None)[1]


def test_after_a_teardown_too_the_spec_as_it_was_attaches_nothing(fake):
    """The same after `teardown --cache-failed`: its record keeps how the spec named the
    failed SSD, and a routine apply of that spec plans nothing, `wipe: true` or not."""
    from tests.unit.engine.test_reattach import dm_detached

    dm_detached(fake)
    fake.unplug("vdc")
    fake.disk("vdc", "data7", 256)
    with pytest.raises(RefusedError, match=r"its SSD failed, and the spec still names the "
                                           r"cache device it was built on \(/dev/vdc\)"):
        plan_apply(with_cache("/dev/vdc"), fake.env_)
    assert steps(plan_apply(spec("dm-cache"), fake.env_))      # a new SSD named: planned


def test_a_built_cache_found_linear_without_the_record_is_refused_never_put_back(fake):
    """The watcher switched the device but its record never reached the mapping (the
    entry still `ready`, with the failed SSD's geometry): a routine apply must not load
    a cache table on the failed SSD's maps, whose metadata is older than the origin."""
    dm_built(fake)
    fake.tables["hc-c1"] = LINEAR
    with pytest.raises(RefusedError, match=r"maps its origin linearly, as the fail-over "
                                           r"leaves a cache whose SSD failed, but the "
                                           r"mapping does not record that"):
        plan_apply(spec("dm-cache").__class__.model_validate(
            {"caches": [{**spec("dm-cache").caches[0].model_dump(mode="json"),
                         "cache": {"path": "/dev/vdc", "wipe": True}}]}), fake.env_)


def test_an_attach_stopped_after_recording_the_new_geometry_goes_on_without_zeroing(fake):
    """Stopped after the new SSD's geometry was recorded (state `building`) and before
    the cache table was loaded: the rerun loads it; nothing is wiped or zeroed again."""
    switched(fake)
    plan = plan_apply(spec("dm-cache"), fake.env_)
    for summary in (BUILDING, GEOMETRY):     # hotcache's own steps (the header's writes a device)
        step = next(s for s in plan.steps if s.summary.startswith(summary))
        step.action(RunContext(Runner(dry_run=False)))
    fake.tables["hc-c1-meta"] = "0 8192 linear 254:64 8"        # the new SSD's maps
    fake.tables["hc-c1-data"] = "0 515968 linear 254:64 8200"
    fake.sysfs_file("/sys/class/block/dm-5/dm/name", "hc-c1-meta")
    fake.sysfs_file("/sys/class/block/vdd/holders/dm-5", "")
    again = steps(plan_apply(spec("dm-cache"), fake.env_))
    assert not any(isinstance(s, list) and s[0] in ("wipefs", "dd") for s in again), again
    assert ["dmsetup", "reload", "hc-c1", "--table", NEW_TABLE] in again and RESUME in again


def test_a_linear_table_over_part_of_the_origin_is_refused_naming_it(fake):
    dm_built(fake)
    fake.tables["hc-c1"] = "0 1024 linear 254:16 0"
    on_origin(fake)
    with pytest.raises(RefusedError, match=r"holds `0 1024 linear 254:16 0`, neither the "
                                           r"cache table hotcache loads nor a linear"):
        plan_apply(spec("dm-cache"), fake.env_)


def test_a_kernel_that_refuses_the_new_table_leaves_the_linear_mapping_running():
    """The resume of the new cache table fails (a new SSD failing at once): the loaded
    table is dropped and the linear one resumed, never a suspended device."""
    from hotcache.provision.backends.dmcache import _resume_or_back
    from hotcache.provision.errors import CommandFailed, HotcacheError
    from hotcache.provision.system.runner import Result

    calls = []

    class Dm(Runner):
        def run(self, argv, *, check=True, input=None, timeout=None):
            calls.append(list(argv))
            if argv[1] == "resume" and len(calls) == 1:
                raise CommandFailed(argv, 1, "device-mapper: resume ioctl failed")
            return Result(argv, 0, "", "")
    with pytest.raises(HotcacheError, match="the linear mapping of the origin runs on"):
        _resume_or_back(RunContext(Dm(dry_run=False)), "hc-c1")
    assert calls == [["dmsetup", "resume", "hc-c1"], ["dmsetup", "clear", "hc-c1"],
                     ["dmsetup", "resume", "hc-c1"]]

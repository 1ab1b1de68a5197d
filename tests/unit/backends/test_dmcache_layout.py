"""Raw dm-cache keeps the filesystem off the bare origin: hotcache's header takes the
origin's first MiB, the cache target (hc-c1-cache) covers the whole origin, and the top
device hc-c1 maps the filesystem from 1 MiB in. Planned against the fake host: restore,
the header as the origin's proof, teardown (plain, --wipe, --cache-failed), a new SSD
under a switched cache, and a boot's restore of a cache on its origin. A cache built
before the header keeps its own layout (test_plans.py's DM_STATE, test_reattach*.py)."""

from __future__ import annotations

import pytest

from hotcache.provision import mapping
from hotcache.provision.block import header
from hotcache.provision.engine.apply import plan_apply
from hotcache.provision.engine.restore import plan_restore
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.errors import RefusedError
from hotcache.provision.plan import RunContext
from hotcache.provision.records import EntryState, OnOrigin
from hotcache.provision.system.runner import Runner

from tests.unit.backends.test_plans import (FS, MKDIR, MP, READY, cached_device, checked,
                                            mount, plan, recorded, steps)
from tests.unit.backends.test_plans import fake  # noqa: F401  (the fixture)
from tests.unit.engine.test_reattach import NEW_SSD, spec as new_ssd_spec

SSD_UUID = "aaaaaaaa-0000-4000-8000-00000000000a"
ORIGIN_UUID = "bbbbbbbb-0000-4000-8000-00000000000b"
NAMES = {"top": "hc-c1", "cache": "hc-c1-cache", "meta": "hc-c1-meta", "data": "hc-c1-data"}
STATE = {"block_sectors": 128, "meta_sectors": 8192, "data_sectors": 515968,
         "header_sectors": 8, "header_uuid": SSD_UUID, "fs_offset": 2048,
         "origin_header_uuid": ORIGIN_UUID, "names": NAMES}
ORIGIN_SECTORS = 1024 * 2048
CACHE_TABLE = ("0 2097152 cache /dev/mapper/hc-c1-meta /dev/mapper/hc-c1-data /dev/vdb 128 1 "
               "writethrough smq 0")
TOP = ["dmsetup", "create", "hc-c1", "--table",
       f"0 {ORIGIN_SECTORS - 2048} linear /dev/mapper/hc-c1-cache 2048"]
META = ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vdc 8"]
DATA = ["dmsetup", "create", "hc-c1-data", "--table", "0 515968 linear /dev/vdc 8200"]
LINEAR = f"0 {ORIGIN_SECTORS} linear 254:16 0"     # the whole origin (vdb), as switched


def stamp(fake, name: str, uuid: str, **more) -> None:
    fake.path(f"/dev/{name}").write_bytes(header.render("c1", "dm-cache", uuid, **more))


def layered(fake, *, loaded: bool = True, mounted: bool | None = None) -> None:
    """c1 built with the origin header. `loaded`: its four tables are (the SSD held by
    the meta and data maps, the origin by the cache device)."""
    stamp(fake, "vdc", SSD_UUID)
    stamp(fake, "vdb", ORIGIN_UUID, role="origin", filesystem_offset_bytes=2048 * 512)
    fake.disks["vdb"].inner = {2**20: {"TYPE": "xfs", "UUID": FS}}
    if loaded:
        fake.tables["hc-c1-cache"] = CACHE_TABLE
        cached_device(fake, "dm-3", "/dev/mapper/hc-c1-cache", formatted=False)
        minor = fake.path("/sys/class/block/dm-3/dev").read_text().strip()
        fake.tables["hc-c1"] = f"0 {ORIGIN_SECTORS - 2048} linear {minor} 2048"
        fake.tables["hc-c1-meta"] = "0 8192 linear 254:32 8"
        fake.tables["hc-c1-data"] = "0 515968 linear 254:32 8200"
        for i, part in ((1, "meta"), (2, "data")):
            fake.sysfs_file(f"/sys/class/block/dm-{i}/dm/name", NAMES[part])
            fake.sysfs_file(f"/sys/class/block/vdc/holders/dm-{i}", "")
        fake.sysfs_file("/sys/class/block/dm-3/dm/name", "hc-c1-cache")
        fake.sysfs_file("/sys/class/block/vdb/holders/dm-3", "")
        cached_device(fake, "dm-0", "/dev/mapper/hc-c1")
    recorded(fake, "dm-cache", STATE, "/dev/mapper/hc-c1",
             mounted=loaded if mounted is None else mounted)


def test_a_first_build_puts_the_filesystem_past_a_header_on_the_origin(fake):
    got = plan(fake, "dm-cache")
    assert got[:2] == ["record c1 in the mapping as building (filesystem UUID "
                       "11111111-1111-4111-8111-111111111111)",
                       "write hotcache's header (cache c1, a new UUID) in the first 1 MiB of "
                       "the origin, before the filesystem: the bare origin never shows a "
                       "filesystem to mount without the cache, and the UUID proves which "
                       "cache the origin is"]
    create = [s for s in got if isinstance(s, list) and s[:2] == ["dmsetup", "create"]]
    assert create[2:] == [["dmsetup", "create", "hc-c1-cache", "--table", CACHE_TABLE], TOP]
    mkfs = next(s for s in got if isinstance(s, list) and s[0] == "mkfs.xfs")
    assert mkfs[-1] == "/dev/mapper/hc-c1"          # the top device, never the origin


def test_the_origin_header_is_a_mebibyte_with_the_offset_in_it(fake, tmp_path):
    """What the header step writes: the magic line and JSON (role, where the filesystem
    starts) in front, the rest of the first MiB zeroed, anything after left alone; the
    UUID it drew is recorded as the origin's proof."""
    from hotcache.provision.backends.dmcache import DmCache
    from hotcache.provision.engine.apply import Planner
    from hotcache.provision.plan import Plan

    fake.path("/dev/vdb").write_bytes(b"\xff" * (2 * 2**20))
    mapping.save(fake.env_.state, {"caches": {}})
    recorded(fake, "dm-cache", {}, "/dev/mapper/hc-c1", state="building", mounted=False)
    p = Planner(fake.env_, "c1", Plan())
    DmCache(fake)._write_header(p, "c1", str(fake.path("/dev/vdb")), role="origin",
                                offset=2048)
    p.plan.steps[0].action(RunContext(Runner(dry_run=False)))
    data = fake.path("/dev/vdb").read_bytes()
    fields = header.parse(data[:header.SIZE])
    assert fields["role"] == "origin" and fields["filesystem_offset_bytes"] == 2**20
    assert data[header.SIZE:2**20] == bytes(2**20 - header.SIZE)
    assert data[2**20:] == b"\xff" * 2**20
    st = mapping.load(fake.env_.state)["caches"]["c1"].backend_state
    assert (st.origin_header_uuid, st.fs_offset) == (fields["uuid"], 2048)


def test_built_and_loaded_a_second_apply_plans_nothing(fake):
    layered(fake)
    assert plan(fake, "dm-cache") == []


def test_after_a_reboot_restore_loads_the_cache_and_then_the_top_device(fake):
    """The origin is proven by its header (blkid sees no filesystem on it)."""
    layered(fake, loaded=False)
    assert steps(plan_restore(fake.env_)) == [
        META, DATA, ["dmsetup", "create", "hc-c1-cache", "--table", CACHE_TABLE], TOP,
        checked("/dev/mapper/hc-c1"), MKDIR, mount("/dev/mapper/hc-c1"), READY,
    ]


@pytest.mark.parametrize("found", [None, "cccccccc-0000-4000-8000-00000000000c"])
def test_an_origin_without_its_header_is_refused_and_nothing_loaded(fake, found):
    """Zeroed, or another cache's header: not this cache's origin, whatever its serial."""
    layered(fake, loaded=False)
    if found:
        stamp(fake, "vdb", found, role="origin")
    else:
        fake.path("/dev/vdb").write_bytes(bytes(4096))
    with pytest.raises(RefusedError) as err:
        plan_restore(fake.env_)
    assert f"hotcache wrote hotcache {ORIGIN_UUID}" in str(err.value), str(err.value)
    assert not [a for a in fake.runner.recorded if a[:2] == ["dmsetup", "create"]]


def test_teardown_removes_the_top_device_first_and_says_where_the_filesystem_is(fake):
    layered(fake)
    plan = plan_teardown("c1", fake.env_)
    removed = [s.argv[-1] for s in plan.steps if s.argv and s.argv[:2] == ["dmsetup", "remove"]]
    assert removed == ["hc-c1", "hc-c1-cache", "hc-c1-data", "hc-c1-meta"]
    cleaner = next(s.argv for s in plan.steps if s.argv and s.argv[1] == "reload")
    assert cleaner[2] == "hc-c1-cache" and " cleaner 0" in cleaner[-1]
    assert any("losetup --find --show --offset 1048576 /dev/vdb" in n for n in plan.notes)
    assert not any("(--wipe)" in s.summary for s in plan.steps)


def test_teardown_wipe_erases_the_origin_header_and_the_superblock_behind_it(fake):
    layered(fake)
    body = fake.path("/dev/vdb").read_bytes()[:header.SIZE].ljust(2**20, b"\0")
    fake.path("/dev/vdb").write_bytes(body + b"XFSB" * 2**18 + b"data" * 2**18)
    plan = plan_teardown("c1", fake.env_, wipe=True)
    step = next(s for s in plan.steps if s.summary.startswith(
        "erase hotcache's header (this cache's UUID) from the origin device /dev/vdb"))
    step.action(RunContext(Runner(dry_run=False)))
    assert header.read(fake, "/dev/vdb") is None
    data = fake.path("/dev/vdb").read_bytes()
    assert data[:2**21] == bytes(2**21) and data[2**21:] == b"data" * 2**18


def test_a_filesystem_behind_where_the_header_goes_needs_wipe(fake):
    """An origin that shows nothing at its start but a filesystem 1 MiB in (an earlier
    cache's, its header erased): refused without `wipe: true`, nothing run; with it, the
    new top device is wiped before the format (mkfs.xfs would refuse otherwise)."""
    from hotcache.provision.engine.spec import HostSpec
    from tests.unit.backends.test_plans import spec

    fake.disks["vdb"].inner = {2**20: {"TYPE": "xfs", "UUID": FS}}
    body = spec("dm-cache").model_dump(mode="json", exclude_none=True)
    body["caches"][0]["origin"] = {"path": "/dev/vdb"}
    with pytest.raises(RefusedError) as err:
        plan_apply(HostSpec.model_validate(body), fake.env_)
    assert "c1.origin (/dev/vdb): it carries signatures (xfs 1 MiB in" in str(err.value)
    assert fake.runner.recorded == [] and not fake.env_.state.exists()
    got = plan(fake, "dm-cache")
    wipe, mkfs = (got.index(["wipefs", "--all", "/dev/mapper/hc-c1"]),
                  next(i for i, s in enumerate(got) if isinstance(s, list) and s[0] == "mkfs.xfs"))
    assert got.index(TOP) < wipe < mkfs


def test_cache_failed_maps_the_origin_past_its_header(fake):
    """The failed SSD's tables go without a flush; the origin is mapped as the fail-over
    leaves it, so the filesystem stays readable (and a new SSD attaches under it)."""
    layered(fake)
    fake.statuses["hc-c1-cache"] = "0 2097152 cache Fail"
    plan = plan_teardown("c1", fake.env_, cache_failed=True, accept_loss="all")
    argv = [s.argv for s in plan.steps if s.argv]
    assert argv[0] == ["umount", MP]
    assert argv[1:7] == [
        *(["dmsetup", "remove", "--force", "--retry", n] for n in
          ("hc-c1", "hc-c1-cache", "hc-c1-data", "hc-c1-meta")),
        ["dmsetup", "create", "hc-c1-cache", "--table", f"0 {ORIGIN_SECTORS} linear /dev/vdb 0"],
        TOP]
    assert any("is on /dev/mapper/hc-c1" in n for n in plan.notes), plan.notes
    assert any("dmsetup create hc-c1-cache --table '0 2097152 linear "
               "/dev/disk/by-id/virtio-hdd1 0'` and then `dmsetup create hc-c1 --table "
               f"'0 {ORIGIN_SECTORS - 2048} linear /dev/mapper/hc-c1-cache 2048'"
               in n for n in plan.notes), plan.notes


def on_origin(fake) -> None:
    data = mapping.load(fake.env_.state)
    data["caches"]["c1"].on_origin = OnOrigin(
        since="2026-12-05T10:00:00+00:00", said="dm-cache reports Fail",
        device="hc-c1-cache", table=LINEAR, replaced=CACHE_TABLE)
    mapping.save(fake.env_.state, data)
    fake.disk("vdd", "ssd2", 256)


def test_a_new_ssd_is_attached_under_the_top_device_without_an_unmount(fake):
    layered(fake)
    fake.tables["hc-c1-cache"] = LINEAR
    on_origin(fake)
    plan = plan_apply(new_ssd_spec("dm-cache"), fake.env_)
    argv = [s.argv for s in plan.steps if s.argv]
    assert ["dmsetup", "reload", "hc-c1-cache", "--table", CACHE_TABLE] in argv
    assert not any(a[0] in ("umount", "mount", "mkfs.xfs") for a in argv), argv
    assert not any(a[:3] == ["dmsetup", "create", "hc-c1"] for a in argv), argv
    assert not any("of the origin, before the filesystem" in s.summary for s in plan.steps)
    assert any(a[:3] == ["wipefs", "--all", NEW_SSD] for a in argv)
    assert not any(NEW_SSD not in a and a[0] == "wipefs" for a in argv)


def test_a_boot_restores_a_cache_on_its_origin_through_the_top_device(fake):
    """No table on the failed SSD: the whole origin mapped linearly, the top device on
    it, mounted; then apply attaches a new SSD as under a switched cache."""
    layered(fake, loaded=False)
    on_origin(fake)
    assert steps(plan_restore(fake.env_)) == [
        ["dmsetup", "create", "hc-c1-cache", "--table", f"0 {ORIGIN_SECTORS} linear /dev/vdb 0"],
        TOP, MKDIR,
        ["mount", "-t", "xfs", "-o", "noatime,nosuid,nodev", "/dev/mapper/hc-c1", MP],
    ]


def detached(fake) -> None:
    """What `teardown --cache-failed` left, after a boot: no table, the origin with its
    header and the filesystem behind it, recorded as waiting for a new SSD."""
    from hotcache.provision.backends.dmcache import DmCache
    from hotcache.provision.engine import reattach

    layered(fake, loaded=False, mounted=False)
    data = mapping.load(fake.env_.state)
    entry = data["caches"].pop("c1")
    reattach.record(data, "c1", entry, DmCache(fake).surviving_state(entry))
    mapping.save(fake.env_.state, data)
    fake.disk("vdd", "ssd2", 256)


def test_after_a_boot_a_new_ssd_is_built_over_the_origin_and_formats_nothing(fake):
    detached(fake)
    got = steps(plan_apply(new_ssd_spec("dm-cache"), fake.env_))
    argv = [s for s in got if isinstance(s, list)]
    assert ["dmsetup", "create", "hc-c1-cache", "--table", CACHE_TABLE] in argv
    assert TOP in argv and mount("/dev/mapper/hc-c1") in argv
    assert not any(a[0] == "mkfs.xfs" or a[0] == "wipefs" and a[-1] == "/dev/vdb"
                   for a in argv), argv
    assert not any("of the origin, before the filesystem" in s for s in got
                   if isinstance(s, str))


def test_a_first_build_stopped_after_the_origin_header_formats_the_top_device(fake):
    """The header was written and recorded, the format never ran: the origin shows
    nothing behind its header, so the rerun formats (and never writes the header again)."""
    layered(fake, loaded=False, mounted=False)
    fake.disks["vdb"].inner = {}
    data = mapping.load(fake.env_.state)
    entry = data["caches"]["c1"]
    entry.state = EntryState.BUILDING
    entry.backend_state = type(entry.backend_state).model_validate(
        {"fs_offset": 2048, "origin_header_uuid": ORIGIN_UUID})
    mapping.save(fake.env_.state, data)
    got = plan(fake, "dm-cache")
    assert ["mkfs.xfs", "-L", "c1", "-m", f"uuid={FS}", "-s", "size=4096",
            "/dev/mapper/hc-c1"] in got
    assert not any("of the origin, before the filesystem" in s for s in got
                   if isinstance(s, str))


def test_the_origin_header_is_written_only_on_the_disk_planned_for(fake):
    """The header zeroes the origin's first MiB: a destructive step, whose device is
    proven again right before it runs (disks renamed while the plan waited)."""
    from hotcache.provision.engine.spec import HostSpec
    from tests.unit.backends.test_plans import spec

    steps_ = plan_apply(HostSpec.model_validate(spec("dm-cache").model_dump(
        mode="json", exclude_none=True)), fake.env_).steps
    step = next(s for s in steps_ if "in the first 1 MiB of the origin" in s.summary)
    assert step.destructive and step.check is not None
    step.check(RunContext(Runner(dry_run=False)))          # the same disk: goes on
    fake.path("/sys/class/block/vdb/serial").write_text("another-disk\n")
    with pytest.raises(RefusedError, match="vdb"):
        step.check(RunContext(Runner(dry_run=False)))


def test_a_kept_origin_image_of_a_torn_down_cache_needs_wipe(tmp_path, monkeypatch):
    """A loop-backed cache torn down keeps its origin image: hotcache's header, and the
    filesystem 1 MiB in, which neither wipefs nor blkid sees at the file's start. An
    apply naming that image again (not attached) is refused without `wipe: true`. Real
    files, blkid and wipefs; the planner is told the kernel has device-mapper (this host
    has none), since the refusal comes before any device-mapper step."""
    import subprocess

    from hotcache.provision.backends.dmcache import DmCache

    monkeypatch.setattr(DmCache, "unavailable", lambda self: None)

    from hotcache.provision.engine.apply import Env, plan_apply
    from hotcache.provision.engine.spec import HostSpec
    from hotcache.provision.system.runner import Runner

    fs = tmp_path / "fs.img"
    subprocess.run(["truncate", "--size", "320M", fs], check=True)
    subprocess.run(["mkfs.xfs", "-q", fs], check=True)
    hdd = tmp_path / "hdd.img"
    with open(hdd, "wb") as f:
        f.write(header.render("c1", "dm-cache", ORIGIN_UUID, role="origin",
                              filesystem_offset_bytes=2**20).ljust(2**20, b"\0"))
        f.write(fs.read_bytes()[:2**20])
        f.truncate(1024 * 2**20)
    body = {"caches": [{
        "name": "c1", "backend": "dm-cache",
        "origin": {"loop": {"file": str(hdd), "size": "1G"}},
        "cache": {"loop": {"file": str(tmp_path / "ssd.img"), "size": "256M"}},
        "filesystem": {"mountpoint": str(tmp_path / "mnt")}}]}
    env = Env(Runner(dry_run=True), tmp_path / "mappings.yaml", tmp_path / "fstab")
    with pytest.raises(RefusedError) as err:
        plan_apply(HostSpec.model_validate(body), env)
    said = str(err.value)
    assert "c1.origin" in said and "hotcache header of cache c1" in said, said
    assert "xfs 1 MiB in" in said, said
    assert not (tmp_path / "ssd.img").exists() and not env.state.exists()


def test_a_top_device_mapped_by_hand_is_refused_not_built_under(fake):
    """After a boot an administrator mapped the filesystem straight off the origin as
    hc-c1: a new SSD's cache built beside it would never be read. Refused, nothing run."""
    detached(fake)
    fake.tables["hc-c1"] = f"0 {ORIGIN_SECTORS - 2048} linear 254:16 2048"
    with pytest.raises(RefusedError) as err:
        plan_apply(new_ssd_spec("dm-cache"), fake.env_)
    assert "hc-c1 holds `0 2095104 linear 254:16 2048`, not the mapping hotcache loads" \
        in str(err.value), str(err.value)
    assert fake.runner.recorded == [] or all(a[0] in ("dmsetup", "blkid", "wipefs")
                                             and a[1] != "create" for a in fake.runner.recorded)

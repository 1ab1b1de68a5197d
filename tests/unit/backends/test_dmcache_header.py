"""Proof beyond serials for raw dm-cache: hotcache's header on the SSD (block/header.py).

Two equal-size SSDs whose serials follow the slot (QEMU SATA, libvirt SCSI, cloned
disks) while the disks swap: the serials still "match", but each SSD's header names the
other cache, so no restore loads one cache's metadata as the other's."""

from __future__ import annotations

import pytest

from hotcache.provision.block import header, identity
from hotcache.provision.engine.restore import plan_restore
from hotcache.provision.errors import RefusedError

from tests.unit.block.test_identity_plans import FS, SPEC, dev, entry, env, host, save  # noqa: F401

UA, UB = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"


def stamp(host, name: str, cache: str, uuid: str) -> None:
    host.path(f"/dev/{name}").write_bytes(header.render(cache, "dm-cache", uuid))


def two_caches(host, env):
    """c1 on SSD slot ssd1 (header UA), c2 on slot ssd2 (header UB), equal sizes."""
    host.disk("vda", "ssd1", 64)
    host.disk("vdb", "ssd2", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    host.disk("vdd", "hdd2", 1024, type="xfs", uuid=FS.replace("1", "7"))
    geometry = {"block_sectors": 128, "meta_sectors": 8192, "data_sectors": 122880,
                "header_sectors": 8}
    c1 = entry(backend_state={**geometry, "header_uuid": UA,
                              "names": {"cache": "hc-c1", "meta": "hc-c1-meta",
                                        "data": "hc-c1-data"}})
    c2 = entry("c2", spec=dict(SPEC, origin={"path": "/dev/vdd"}, cache={"path": "/dev/vdb"}),
               devices={"origin": dev("/dev/vdd", "hdd2", 1024),
                        "cache": dev("/dev/vdb", "ssd2", 64)}, fs=FS.replace("1", "7"),
               backend_state={**geometry, "header_uuid": UB,
                              "names": {"cache": "hc-c2", "meta": "hc-c2-meta",
                                        "data": "hc-c2-data"}})
    save(env, c1=c1, c2=c2)


def test_each_ssd_in_its_own_slot_is_proven_by_its_header(host, env):
    two_caches(host, env)
    stamp(host, "vda", "c1", UA)
    stamp(host, "vdb", "c2", UB)
    argv = [[str(a) for a in s.argv] for s in plan_restore(env).steps if s.argv]
    assert ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vda 8"] in argv
    assert ["dmsetup", "create", "hc-c2-meta", "--table", "0 8192 linear /dev/vdb 8"] in argv


def test_swapped_ssds_whose_serials_stay_with_the_slot_are_refused(host, env):
    two_caches(host, env)
    stamp(host, "vda", "c2", UB)          # the disks swapped; the serials did not
    stamp(host, "vdb", "c1", UA)
    with pytest.raises(RefusedError) as err:
        plan_restore(env)
    said = str(err.value)
    assert f"hotcache {UB}, hotcache wrote hotcache {UA}" in said, said
    assert f"hotcache {UA}, hotcache wrote hotcache {UB}" in said, said
    assert host.runner.recorded == []


def test_an_ssd_whose_header_is_gone_is_not_proven_by_its_serial_alone(host, env):
    two_caches(host, env)
    stamp(host, "vdb", "c2", UB)          # vda: zeroed, or another disk in the slot
    with pytest.raises(RefusedError, match=f"no signature, hotcache wrote hotcache {UA}"):
        plan_restore(env, ["c1"])


def test_the_header_is_what_identity_reads_where_blkid_sees_nothing(host):
    host.disk("vda", "ssd1", 64)
    assert identity.probe("vda", host).sig_type is None
    stamp(host, "vda", "c1", UA)
    seen = identity.probe("vda", host)
    assert (seen.sig_type, seen.sig_uuid) == ("hotcache", UA)
    assert header.parse(b"\0" * 4096) is None
    assert header.parse(header.MAGIC + b"not json\n") is None
    assert len(header.render("c1", "dm-cache", UA)) == header.SIZE


def test_an_ssd_with_another_caches_header_is_refused_without_wipe(host, env):
    """The mapping that knew it is gone (another host's SSD, a reinstalled host): blkid
    and wipefs see nothing, the header still says whose it is."""
    from hotcache.provision.engine.apply import plan_apply
    from hotcache.provision.engine.spec import HostSpec

    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024)
    stamp(host, "vda", "old", UA)
    spec = {"caches": [dict(SPEC, origin={"path": "/dev/vdc", "wipe": True},
                            cache={"path": "/dev/vda"})]}
    with pytest.raises(RefusedError, match="hotcache header of cache old"):
        plan_apply(HostSpec.model_validate(spec), env)
    assert host.runner.recorded == []


def test_restore_of_a_partition_ssd_with_its_own_header_is_no_conflict(host, env):
    """blkid's low-level probe shows a partition's PART_ENTRY_* keys even where no
    filesystem is: the SSD's own header must not read as a foreign signature (seen in
    the guest kernel, on GPT partitions)."""
    two_caches(host, env)
    stamp(host, "vda", "c1", UA)
    stamp(host, "vdb", "c2", UB)
    for name in ("vda", "vdb"):
        host.disks[name].sig = {"PART_ENTRY_UUID": f"{name}-partuuid", "PART_ENTRY_NUMBER": "2"}
    argv = [[str(a) for a in s.argv] for s in plan_restore(env).steps if s.argv]
    assert ["dmsetup", "create", "hc-c1-meta", "--table", "0 8192 linear /dev/vda 8"] in argv


def _live(host, name="c1"):
    host.tables[f"hc-{name}"] = ("0 2097152 cache 254:1 254:2 254:3 128 1 writeback smq 2 "
                                 "migration_threshold 0")
    host.tables[f"hc-{name}-meta"] = "0 8192 linear 254:0 8"
    host.tables[f"hc-{name}-data"] = "0 122880 linear 254:0 8200"


def _erase_step(plan):
    from hotcache.provision.plan import RunContext
    from hotcache.provision.system.runner import Runner

    step = next(s for s in plan.steps if s.summary.startswith("erase hotcache's header"))
    return lambda host: step.run(RunContext(Runner()))    # a real run (the fake records)


def test_teardown_erases_its_own_header_so_the_ssd_can_be_built_on_again(host, env):
    """Left behind, the header would claim the SSD for a cache that no longer exists: the
    next apply on it reads another cache's header and refuses (seen in the guest kernel)."""
    from hotcache.provision.engine.teardown import plan_teardown

    two_caches(host, env)
    stamp(host, "vda", "c1", UA)
    stamp(host, "vdb", "c2", UB)
    _live(host)
    other = host.path("/dev/vdb").read_bytes()
    plan = plan_teardown("c1", env)
    summaries = [s.summary for s in plan.steps]
    erase = next(i for i, s in enumerate(summaries) if s.startswith("erase hotcache's header"))
    assert erase > summaries.index("remove the cache device")   # only once the cache is gone
    _erase_step(plan)(host)
    assert header.read(host, "/dev/vda") is None
    assert host.path("/dev/vdb").read_bytes() == other             # c2's SSD: not touched


def test_teardown_leaves_a_header_that_is_not_its_own(host, env):
    """The step checks the header's UUID when it runs: a header that names another cache
    (the SSD changed after the plan) is left byte for byte."""
    from hotcache.provision.engine.teardown import plan_teardown

    two_caches(host, env)
    stamp(host, "vda", "c1", UA)
    _live(host)
    plan = plan_teardown("c1", env)
    stamp(host, "vda", "c9", UB)
    before = host.path("/dev/vda").read_bytes()
    _erase_step(plan)(host)
    assert host.path("/dev/vda").read_bytes() == before

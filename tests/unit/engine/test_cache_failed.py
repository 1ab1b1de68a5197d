"""A cache whose SSD failed, planned against a fake host: status names the failure as the
kernel reports it (never "unproven" or "another filesystem"), doctor and the metrics say
so, and `teardown --cache-failed` takes it apart without a flush, only with the loss of
dirty data acknowledged."""

from __future__ import annotations

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.engine import status
from hotcache.provision.engine.teardown import plan_teardown
from hotcache.provision.errors import RefusedError, UsageError
from hotcache.provision.observe import doctor
from hotcache.provision.records import CacheEntry

from tests.unit.block.test_identity_plans import FS, SPEC, argvs, entry, env, host, save  # noqa: F401

LIVE = "0 2097152 cache 8 33/1024 128 900/960 10 2 3 4 0 5 {dirty} 1 {mode} 2 " \
       "migration_threshold 2048 smq 0 rw -"


def dm_cache(host, env, *, mode="writethrough", status_line=None, dirty=0,
             writeback_ever: bool | None = False, live: str | None = None):
    """`mode`: the recorded one; `live`: the live table's (default the same)."""
    host.disk("vda", "ssd1", 64)
    host.disk("vdc", "hdd1", 1024, type="xfs", uuid=FS)
    host.tables["hc-c1"] = f"0 2097152 cache 254:1 254:2 254:3 128 1 {live or mode} smq 0"
    host.tables["hc-c1-meta"] = "0 8192 linear 254:0 0"
    host.tables["hc-c1-data"] = "0 122880 linear 254:0 8192"
    host.statuses["hc-c1"] = status_line or LIVE.format(dirty=dirty, mode=live or mode)
    save(env, c1={**entry(spec=dict(SPEC, mode=mode)),
                  **({} if writeback_ever is None else {"writeback_ever": writeback_ever})})


def row(host, env) -> dict:
    data = mapping.load(env.state)
    return status.cache_status("c1", data["caches"]["c1"], host.runner, None, host=host)


def test_a_healthy_cache_is_not_failed(host, env):
    dm_cache(host, env)
    got = row(host, env)
    assert got["cache_failed"] is None
    assert "CACHE_FAILED" not in [f["code"] for f in got["findings"]]


@pytest.mark.parametrize("line, said", [
    ("0 2097152 cache Fail", "dm-cache reports Fail"),
    (LIVE.format(dirty=0, mode="writethrough").replace(" rw -", " ro -"), "read-only"),
    (LIVE.format(dirty=0, mode="writethrough").replace(" rw -", " rw needs_check"),
     "needs_check"),
])
def test_status_names_the_kernels_verdict(host, env, line, said):
    dm_cache(host, env, status_line=line)
    host.unplug("vda")      # the SSD is gone too: one finding says why, not DEVICE_MISSING
    got = row(host, env)
    codes = [f["code"] for f in got["findings"]]
    assert codes.count("CACHE_FAILED") == 1 and "DEVICE_MISSING" not in codes, codes
    message = next(f["message"] for f in got["findings"] if f["code"] == "CACHE_FAILED")
    assert message.startswith("cache failed: /dev/disk/by-id/virtio-ssd1: ") and said in message
    assert "no dirty data at risk" in message          # writethrough
    assert got["cache_failed"]["dirty_bytes"] == 0


@pytest.mark.parametrize("how", ["ran in writeback", "history unknown", "table says writeback"])
def test_a_silent_kernel_is_dirty_data_unknown_unless_nothing_could_be_dirty(host, env, how):
    """Fail reports no counters. Only a cache whose live table is writethrough and that
    never ran in writeback has nothing at risk; the recorded mode alone never says so."""
    dm_cache(host, env, status_line="0 2097152 cache Fail",
             writeback_ever={"ran in writeback": True, "history unknown": None}.get(how, False),
             live="writeback" if how == "table says writeback" else None)
    got = row(host, env)
    assert got["cache_failed"]["dirty_bytes"] is None, got["cache_failed"]
    assert "dirty data at risk: unknown" in got["cache_failed"]["message"]
    with pytest.raises(RefusedError, match="--accept-loss all"):
        plan_teardown("c1", env, cache_failed=True)


def test_the_kernels_dirty_count_wins_over_the_recorded_mode(host, env):
    """Switched from writeback to writethrough, the dirty blocks drain in the background:
    the kernel still counts them, and they are at risk."""
    dm_cache(host, env, status_line=LIVE.format(dirty=7, mode="writethrough").replace(
        " rw -", " ro -"), writeback_ever=True)
    got = row(host, env)
    assert got["cache_failed"]["dirty_bytes"] == 7 * 128 * 512
    with pytest.raises(RefusedError, match="--accept-loss 458752"):
        plan_teardown("c1", env, cache_failed=True)


def test_doctor_leads_to_the_way_out(host, env):
    dm_cache(host, env, status_line="0 2097152 cache Fail")
    got = row(host, env)
    found = doctor.check_drift({"c1": got})
    failed = next(f for f in found if f.code == "CACHE_FAILED")
    assert "hotcache teardown c1 --cache-failed" in failed.fix
    assert "another filesystem" not in failed.fix and "put the recorded disk" not in failed.fix


def test_metrics_report_the_failure(host, env, tmp_path):
    from prometheus_client import generate_latest

    from hotcache.provision.observe.metrics import registry_for

    dm_cache(host, env, mode="writeback", status_line="0 2097152 cache Fail")
    text = generate_latest(registry_for([row(host, env)], env.state)).decode()
    assert 'hotcache_cache_failed{cache="c1"} 1.0' in text
    host.statuses["hc-c1"] = LIVE.format(dirty=0, mode="writeback")
    text = generate_latest(registry_for([row(host, env)], env.state)).decode()
    assert 'hotcache_cache_failed{cache="c1"} 0.0' in text


def test_teardown_cache_failed_removes_the_tables_without_a_flush(host, env):
    dm_cache(host, env, status_line="0 2097152 cache Fail")
    plan = plan_teardown("c1", env, cache_failed=True)
    assert argvs(plan) == [["dmsetup", "remove", "--force", "--retry", "hc-c1"],
                           ["dmsetup", "remove", "--force", "--retry", "hc-c1-data"],
                           ["dmsetup", "remove", "--force", "--retry", "hc-c1-meta"]]
    summaries = [s.summary for s in plan.steps]
    assert summaries[-1].startswith("remove c1 from the mapping")
    assert any(f"UUID={FS}" in n for n in plan.notes)


def test_teardown_cache_failed_of_a_healthy_cache_is_refused(host, env):
    dm_cache(host, env)
    with pytest.raises(RefusedError, match="nothing wrong with the SSD"):
        plan_teardown("c1", env, cache_failed=True)
    assert host.runner.recorded == []


def test_dirty_data_lost_needs_an_acknowledgement_that_covers_it(host, env):
    """Writeback with 3 dirty blocks of 64 KiB on an SSD whose metadata went read-only:
    nothing goes ahead without --accept-loss of at least 196608 bytes."""
    line = LIVE.format(dirty=3, mode="writeback").replace(" rw -", " ro -")
    dm_cache(host, env, mode="writeback", status_line=line)
    with pytest.raises(RefusedError) as err:
        plan_teardown("c1", env, cache_failed=True)
    assert "196608 bytes" in str(err.value) and "--accept-loss 196608" in err.value.hint
    with pytest.raises(RefusedError):
        plan_teardown("c1", env, cache_failed=True, accept_loss="100K")
    with pytest.raises(UsageError, match="--accept-loss lots"):
        plan_teardown("c1", env, cache_failed=True, accept_loss="lots")
    plan = plan_teardown("c1", env, cache_failed=True, accept_loss="192K")
    assert argvs(plan)[0] == ["dmsetup", "remove", "--force", "--retry", "hc-c1"]
    assert any("xfs_repair -n" in n for n in plan.notes)


def test_unknown_dirty_data_needs_accept_loss_all(host, env):
    dm_cache(host, env, mode="writeback", status_line="0 2097152 cache Fail")
    for given in (None, "1T"):
        with pytest.raises(RefusedError, match="an unknown amount"):
            plan_teardown("c1", env, cache_failed=True, accept_loss=given)
    assert plan_teardown("c1", env, cache_failed=True, accept_loss="all").steps
    assert "c1" in yaml.safe_load(env.state.read_text())["caches"]     # plans change nothing


# --- lvmcache: the cache PV missing or failed --------------------------------------------

LVM = ["--config", "devices { use_devicesfile=0 }"]    # the fake host has no devices file
LV_STATE = {"vg": "hc_c1", "origin_lv": "data", "adopted": False, "vg_uuid": "VG-1",
            "lv_uuid": "LV-1", "pv_uuids": {"origin": "PV-hdd", "cache": "PV-ssd"}}


def lvm_cache(host, env, *, mode="writethrough", health="partial", active=True,
              status_line=None, ssd_gone=True):
    """A built lvmcache c1 (hc_c1/data on the HDD, its cache volume on the SSD) whose SSD
    LVM reports `health` (partial: its PV is missing; `ssd_gone`: the disk is gone too)."""
    host.disk("vda", "ssd1", 64, type="LVM2_member", uuid="PV-ssd")
    host.disk("vdc", "hdd1", 1024, type="LVM2_member", uuid="PV-hdd")
    host.pvs["/dev/vdc"] = "hc_c1"
    host.lvs["hc_c1/data"] = {
        "lv_name": "data", "lv_attr": "Cwi-" + ("a" if active else "-") + "-C-p-",
        "segtype": "cache", "cache_mode": mode, "cache_policy": "smq",
        "kernel_cache_settings": "", "vg_uuid": "VG-1", "lv_uuid": "LV-1",
        "lv_health_status": health}
    host.vgs["hc_c1"] = {"vg_name": "hc_c1",
                         "vg_missing_pv_count": "1" if health == "partial" else "0"}
    if active:
        host.disk("dm-0", None, 1024, type="xfs", uuid=FS)
        host.link("/dev/hc_c1/data", "/dev/dm-0")
        host.statuses[host.devnum("/dev/hc_c1/data")] = status_line or \
            LIVE.format(dirty=0, mode=mode)
        host.tables[host.devnum("/dev/hc_c1/data")] = \
            f"0 2097152 cache 254:1 254:2 254:3 128 1 {mode} smq 0"
    if ssd_gone:
        host.unplug("vda")
    save(env, c1={**entry(spec=dict(SPEC, backend="lvmcache", mode=mode),
                          backend_state=LV_STATE), "writeback_ever": mode == "writeback"})


def test_lvmcache_status_names_the_missing_pv(host, env):
    lvm_cache(host, env)
    got = row(host, env)
    codes = [f["code"] for f in got["findings"]]
    assert codes.count("CACHE_FAILED") == 1 and "DEVICE_MISSING" not in codes, codes
    message = next(f["message"] for f in got["findings"] if f["code"] == "CACHE_FAILED")
    assert "LVM reports hc_c1/data partial (a PV of its volume group is missing)" in message
    assert "no dirty data at risk" in message


def test_lvmcache_teardown_cache_failed_drops_the_cache_from_the_lv(host, env):
    """The one command: the LV deactivated, the cache taken off it without a flush,
    the missing PV out of the VG, the LV (the origin alone) active again, the unit and
    the mapping entry gone; the plan says where the filesystem is."""
    lvm_cache(host, env)
    plan = plan_teardown("c1", env, cache_failed=True)
    assert argvs(plan) == [
        ["lvchange", *LVM, "--yes", "--activate", "n", "hc_c1/data"],
        ["lvconvert", *LVM, "--yes", "--force", "--uncache", "hc_c1/data"],
        ["vgreduce", *LVM, "--yes", "--removemissing", "hc_c1"],
        ["lvchange", *LVM, "--yes", "--activate", "y", "hc_c1/data"]]
    lvm_steps = [s for s in plan.steps if s.argv]
    assert [s.destructive for s in lvm_steps] == [False, True, True, False]
    assert all(s.check is not None for s in lvm_steps)      # each proves the LV again
    assert plan.steps[-1].summary.startswith("remove c1 from the mapping")
    assert any(f"is on /dev/hc_c1/data: `mount -o noatime UUID={FS} /mnt/c1`" in n
               for n in plan.notes), plan.notes
    assert "c1" in yaml.safe_load(env.state.read_text())["caches"]     # plans change nothing


@pytest.mark.parametrize("state", ["X", "d", "i"])
def test_lvmcache_lv_in_any_state_but_inactive_is_deactivated_first(host, env, state):
    """After a fail-over the LV's top device runs a linear table of its origin, which
    lvm2's report does not show as plainly active; lvconvert refuses an LV whose table is
    not the cache it expects, so it is deactivated first whatever its state reads."""
    lvm_cache(host, env)
    attr = host.lvs["hc_c1/data"]["lv_attr"]
    host.lvs["hc_c1/data"]["lv_attr"] = attr[:4] + state + attr[5:]
    assert argvs(plan_teardown("c1", env, cache_failed=True))[0] == \
        ["lvchange", *LVM, "--yes", "--activate", "n", "hc_c1/data"]


def test_lvmcache_inactive_lv_with_its_pv_present_is_not_deactivated_or_reduced(host, env):
    """Failed with the PV still there (its metadata needs a check) and the LV not
    active: nothing to deactivate, no missing PV to remove."""
    lvm_cache(host, env, health="failed", active=False, ssd_gone=False)
    host.pvs["/dev/vda"] = "hc_c1"
    assert argvs(plan_teardown("c1", env, cache_failed=True)) == [
        ["lvconvert", *LVM, "--yes", "--force", "--uncache", "hc_c1/data"],
        ["lvchange", *LVM, "--yes", "--activate", "y", "hc_c1/data"]]


def test_lvmcache_steps_stop_when_the_lv_or_the_origin_changed(host, env):
    """Between the plan (a prompt can wait for hours) and a step, the LV was replaced
    (another LV UUID) or the origin disk is another one: the step stops before its
    program runs."""
    from hotcache.provision.plan import RunContext

    lvm_cache(host, env)
    plan = plan_teardown("c1", env, cache_failed=True)
    uncache = next(s for s in plan.steps if "--uncache" in s.argv)
    uncache.check(RunContext(host.runner))                   # as planned: goes ahead
    host.lvs["hc_c1/data"]["lv_uuid"] = "LV-other"
    with pytest.raises(RefusedError, match="UUID is LV-other, recorded LV-1"):
        uncache.check(RunContext(host.runner))
    host.lvs["hc_c1/data"]["lv_uuid"] = "LV-1"
    host.fs("vdc", "LVM2_member", "PV-someone-else")
    with pytest.raises(RefusedError, match="(?s)stopped before .*PV-someone-else"):
        uncache.check(RunContext(host.runner))
    assert host.runner.recorded == []


def test_lvmcache_dirty_data_lost_needs_an_acknowledgement_that_covers_it(host, env):
    """Writeback, 3 dirty blocks of 64 KiB as the kernel still reports them: refused
    without --accept-loss of at least 196608 bytes, naming it."""
    lvm_cache(host, env, mode="writeback", status_line=LIVE.format(dirty=3, mode="writeback"))
    with pytest.raises(RefusedError) as err:
        plan_teardown("c1", env, cache_failed=True)
    assert "196608 bytes" in str(err.value) and "--accept-loss 196608" in err.value.hint
    with pytest.raises(RefusedError):
        plan_teardown("c1", env, cache_failed=True, accept_loss="100K")
    plan = plan_teardown("c1", env, cache_failed=True, accept_loss="192K")
    assert ["lvconvert", *LVM, "--yes", "--force", "--uncache", "hc_c1/data"] in argvs(plan)
    assert any("xfs_repair -n" in n for n in plan.notes)


def test_lvmcache_unknown_dirty_data_needs_accept_loss_all(host, env):
    lvm_cache(host, env, mode="writeback", status_line="0 2097152 cache Fail")
    for given in (None, "1T"):
        with pytest.raises(RefusedError, match="an unknown amount"):
            plan_teardown("c1", env, cache_failed=True, accept_loss=given)
    assert argvs(plan_teardown("c1", env, cache_failed=True, accept_loss="all"))


def test_lvmcache_healthy_cache_is_refused(host, env):
    lvm_cache(host, env, health="", ssd_gone=False)
    with pytest.raises(RefusedError, match="nothing wrong with the SSD"):
        plan_teardown("c1", env, cache_failed=True)
    assert host.runner.recorded == []


@pytest.mark.parametrize("state, dirty_data, want", [
    ("dirty", "0.0k", None),          # waiting for its dirty set: counted only once attached
    ("clean", "0.0k", 0),
    ("dirty", "64.0M", 64 * 2**20),
])
def test_bcache_backing_device_waiting_for_a_dirty_set_is_at_risk_not_clean(tmp_path, state,
                                                                             dirty_data, want):
    from hotcache.provision.backends.bcache import Bcache
    from hotcache.provision.records import CacheEntry
    from tests.helpers import recorded_entry
    from tests.unit.fakehost import FakeHost

    fake = FakeHost(tmp_path / "host")
    fake.disk("vdb", "hdd1", 1024)
    d = "/sys/class/block/vdb/bcache"
    for name, value in (("state", state), ("dirty_data", dirty_data),
                        ("cache_mode", "writethrough [writeback] writearound none")):
        fake.sysfs_file(f"{d}/{name}", value)
    entry = CacheEntry.model_validate({**recorded_entry("c1", backend="bcache"),
                                       "mode": "writeback",
                                       "backend_state": {"cset_uuid": "cset-1"}})
    verdict = Bcache(fake).failure(entry, {"origin": "/dev/vdb"})
    assert verdict is not None and verdict.dirty_bytes == want, verdict
    assert verdict.live_mode == "writeback"


@pytest.mark.parametrize("backend", ["dm-cache", "lvmcache"])
@pytest.mark.parametrize("writeback_ever", [False, None])
def test_a_plain_teardown_of_a_failed_cache_names_the_command_that_works(host, env, backend,
                                                                        writeback_ever):
    """The command an admin tries first used to answer "put the recorded disk back" or
    "restore, then teardown", neither of which can work with the SSD dead."""
    if backend == "dm-cache":
        dm_cache(host, env, status_line="0 2097152 cache Fail", writeback_ever=writeback_ever)
        host.unplug("vda")
    else:
        lvm_cache(host, env, health="partial", status_line="0 2097152 cache Fail")
        if writeback_ever is None:
            data = mapping.load(env.state)
            data["caches"]["c1"].writeback_ever = None
            mapping.save(env.state, data)
    with pytest.raises(RefusedError) as err:
        plan_teardown("c1", env)
    said = str(err.value)
    want = "hotcache teardown c1 --cache-failed" + (" --accept-loss all" if writeback_ever is None
                                                     else "`")
    assert want in said, said
    assert "restore" not in said and "put the recorded disk" not in said, said
    assert host.runner.recorded == [] or all(a[0] in ("dmsetup", "lvs", "pvs", "vgs", "blkid")
                                             for a in host.runner.recorded)


def mounted_from(host, env, tmp_path, node: str) -> dict:
    """dm-cache c1 with its filesystem mounted from `node` at a real folder (status reads
    its free space)."""
    dm_cache(host, env)
    host.disk("dm-0", None, 1024, type="xfs", uuid=FS)
    host.link("/dev/mapper/hc-c1", "/dev/dm-0")
    mp = tmp_path / "mp"
    mp.mkdir()
    data = mapping.load(env.state)
    data["caches"]["c1"].filesystem.mountpoint = str(mp)
    mapping.save(env.state, data)
    host.mount(node, str(mp), "noatime")
    return row(host, env)


def test_the_bare_origin_mounted_without_its_cache_is_flagged_and_published_nowhere(
        host, env, tmp_path):
    """`mount -a` or a rescue system mounts a raw dm-cache's origin (it shows the same
    XFS, UUID and all) while the cache's tables are not loaded: the UUID matches, the
    device does not; status flags it and no node label or feature is published."""
    from hotcache.provision.observe import nodelabels

    got = mounted_from(host, env, tmp_path, "/dev/vdc")
    codes = [f["code"] for f in got["findings"]]
    assert "ORIGIN_WITHOUT_CACHE" in codes, got["findings"]
    assert not got["ok"] and got["mounted"]
    assert not nodelabels.is_up(got)
    fix = next(f.fix for f in doctor.check_drift({"c1": got}) if f.code == "ORIGIN_WITHOUT_CACHE")
    assert "hotcache restore c1" in fix


def test_the_cache_device_mounted_is_not_flagged(host, env, tmp_path):
    from hotcache.provision.observe import nodelabels

    got = mounted_from(host, env, tmp_path, "/dev/mapper/hc-c1")
    assert "ORIGIN_WITHOUT_CACHE" not in [f["code"] for f in got["findings"]], got["findings"]
    assert nodelabels.is_up(got)


def test_bcache_detached_from_a_set_still_registered_is_no_ssd_failure(tmp_path):
    """The origin's own errors detach the backing device while the cache set (and the
    dirty data it holds for it) stays registered: not a failed SSD, whose set the kernel
    unregisters; `--cache-failed` would throw that dirty data away."""
    from hotcache.provision.backends.bcache import Bcache
    from hotcache.provision.records import CacheEntry
    from tests.helpers import recorded_entry
    from tests.unit.fakehost import FakeHost

    fake = FakeHost(tmp_path / "host")
    fake.disk("vdb", "hdd1", 1024)
    fake.sysfs_file("/sys/class/block/vdb/bcache/state", "no cache")
    fake.sysfs_file("/sys/class/block/vdb/bcache/dirty_data", "0.0k")
    fake.sysfs_file("/sys/fs/bcache/cset-1/cache_available_percent", "90")
    entry = CacheEntry.model_validate({**recorded_entry("c1", backend="bcache"),
                                       "mode": "writeback",
                                       "backend_state": {"cset_uuid": "cset-1"}})
    assert Bcache(fake).failure(entry, {"origin": "/dev/vdb"}) is None


def test_a_cache_device_that_is_also_the_recorded_origin_is_not_flagged(host, env, tmp_path):
    """An lvmcache that adopted an existing LV records that LV as its origin, and the LV,
    cached in place, is the device mounted: not a bare origin."""
    from hotcache.provision.observe import nodelabels

    dm_cache(host, env)
    mp = tmp_path / "mp"
    mp.mkdir()
    data = mapping.load(env.state)
    entry = data["caches"]["c1"]
    entry.filesystem.mountpoint = str(mp)
    entry.cached_device = "/dev/vdc"         # the origin's own node, cached in place
    mapping.save(env.state, data)
    host.mount("/dev/vdc", str(mp), "noatime")
    got = row(host, env)
    assert "ORIGIN_WITHOUT_CACHE" not in [f["code"] for f in got["findings"]], got["findings"]
    assert nodelabels.is_up(got)


@pytest.mark.parametrize("backend", ["bcache", "dm-cache"])
def test_dropping_a_failed_cache_without_its_origin_is_refused_naming_the_cache(tmp_path,
                                                                              backend):
    """The step that leaves the filesystem on the origin must name the origin: with none
    present it is a refusal naming the cache and the way out, and nothing is planned."""
    from hotcache.provision.backends import get
    from hotcache.provision.engine.apply import Planner
    from hotcache.provision.plan import Plan
    from hotcache.provision.records import CacheEntry
    from tests.helpers import recorded_entry
    from tests.unit.fakehost import FakeHost

    fake = FakeHost(tmp_path / "host")
    plan = Plan()
    p = Planner(fake.env(tmp_path), "c1", plan)
    entry = CacheEntry.model_validate(recorded_entry("c1", backend=backend))
    with pytest.raises(RefusedError) as err:
        get(backend, fake).drop_failed_cache(p, entry, {"origin": None})
    assert "c1: its origin device is not present" in str(err.value)
    assert "hotcache teardown c1 --forget" in str(err.value)
    assert plan.steps == []

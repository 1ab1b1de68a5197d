"""Mapping entries are typed records (provision/records.py): the file hotcache writes
loads and saves back unchanged, for every backend's shape and with keys a newer hotcache
added; an entry with a field deleted or mistyped by hand is refused, naming the file,
the cache, the field and the fix, and nothing is written."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from hotcache.provision import __version__, mapping
from hotcache.provision.errors import ExitCode, UsageError
from hotcache.provision.records import (BcacheState, CacheEntry, DmCacheState, EntryState,
                                        LvmCacheState, ValidationError)

FS = {"type": "xfs", "uuid": "3f1c0d2e-0000-4000-8000-000000000001", "label": "hc-c1",
      "mountpoint": "/srv/hot", "options": ["noatime", "nosuid", "nodev", "nofail"],
      "owner": None, "mode": None}


def device(node: str, serial: str, **more) -> dict:
    """A device as engine/apply._write_entry writes it (block/identity.record, then path)."""
    return {"node": node, "size": 8 * 2**30, "by_id": [f"/dev/disk/by-id/ata-{serial}"],
            "identity": {"wwn": f"0x5000{serial}", "serial": serial}, **more}


def entry(backend: str, backend_state: dict, *, cache: bool = True, **more) -> dict:
    """The entry engine/apply._write_entry writes, in its order, for a built cache."""
    devices = {"origin": device("/dev/sdb", "HDD1", path="/dev/disk/by-id/ata-HDD1")}
    if cache:
        devices["cache"] = device("/dev/nvme1n1", "SSD1", path="/dev/disk/by-id/ata-SSD1")
    return {"backend": backend, "state": "ready", "created": "2026-11-30T10:00:00+00:00",
            "updated": "2026-11-30T10:00:05+00:00", "mode": "writethrough",
            "tunables": {"sequential_cutoff": 0} if backend == "bcache" else {},
            "devices": devices, "cached_device": None if backend == "none" else "/dev/c1",
            "filesystem": dict(FS), "persist": {"fstab": "/etc/fstab"},
            "backend_state": backend_state,
            "hot_copies": {"/srv/hot/imagenet": {
                "name": "imagenet", "version": "2024", "files": 1281167, "bytes": 150 * 2**30,
                "copied_at": "2026-11-30T11:00:00+00:00", "verified_at": None,
                "verify_ok": True}},
            "spec": {"name": "c1", "backend": backend}, **more}


SHAPES = {
    "none": entry("none", {}, cache=False),
    "bcache": entry("bcache", {"cset_uuid": "cs-1", "cache_uuid": "cu-1",
                               "backing_uuid": "bu-1"}),
    "dm-cache": entry("dm-cache", {"block_sectors": 512, "meta_sectors": 8192,
                                   "data_sectors": 16_000_000,
                                   "names": {"cache": "hc-c1", "meta": "hc-c1-meta",
                                             "data": "hc-c1-data"},
                                   "table": "0 100 cache /dev/mapper/hc-c1-meta ..."}),
    "lvmcache": entry("lvmcache", {"vg": "hc-c1", "origin_lv": "origin", "adopted": False,
                                   "pv_uuids": {"origin": "PV-hdd", "cache": "PV-ssd"},
                                   "vg_uuid": "VG-1", "lv_uuid": "LV-1"}),
    "building": {**entry("bcache", {}), "state": "building", "cached_device": None},
    "loop": entry("none", {}, cache=False,
                  devices={"origin": {"node": "/dev/loop3", "size": 2**30, "by_id": [],
                                      "identity": {"backing_file": "/srv/hot.img"},
                                      "loop_file": "/srv/hot.img"}}),
    # Written before identities and hot copies were recorded (older hotcache).
    "old": {"backend": "none", "state": "ready", "mode": None,
            "devices": {"origin": {"node": "/dev/sdb", "size": 2**30}},
            "filesystem": {"uuid": "u-old", "mountpoint": "/mnt/old"}, "spec": {"name": "old"}},
}


def written(caches: dict, **top) -> str:
    """The file today's mapping.save writes for `caches` (its exact layout)."""
    return yaml.safe_dump({"schema_version": mapping.SCHEMA_VERSION, "tool_version": __version__,
                           "caches": caches, **top, "entries": len(caches),
                           "updated": "2026-11-30T12:00:00+00:00"},
                          sort_keys=False, default_flow_style=False)


def resaved(path) -> str:
    with mapping.editing(path):
        pass
    return path.read_text()


def without_updated(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("updated:")]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_recorded_shape_loads_and_saves_back_unchanged(tmp_path, shape):
    path = tmp_path / "mappings.yaml"
    path.write_text(written({"c1": SHAPES[shape]}))
    before = path.read_text()
    assert without_updated(resaved(path)) == without_updated(before)


def test_backend_state_is_typed_per_backend(tmp_path):
    path = tmp_path / "mappings.yaml"
    path.write_text(written({k: v for k, v in SHAPES.items() if k in
                             ("bcache", "dm-cache", "lvmcache", "none")}))
    caches = mapping.load(path)["caches"]
    assert isinstance(caches["bcache"].backend_state, BcacheState)
    assert caches["bcache"].backend_state.cset_uuid == "cs-1"
    assert isinstance(caches["dm-cache"].backend_state, DmCacheState)
    assert caches["dm-cache"].backend_state.data_sectors == 16_000_000
    assert isinstance(caches["lvmcache"].backend_state, LvmCacheState)
    assert caches["lvmcache"].backend_state.pv_uuids == {"origin": "PV-hdd", "cache": "PV-ssd"}
    assert caches["none"].devices["origin"].identity.serial == "HDD1"
    assert caches["none"].hot_copies["/srv/hot/imagenet"].files == 1281167


def test_keys_of_a_newer_hotcache_are_kept_where_they_were(tmp_path):
    """A newer hotcache's fields (at every level) survive an older one's save, in place."""
    newer = entry("bcache", {"cset_uuid": "cs-1", "journal": "on", "cache_uuid": "cu-1",
                             "backing_uuid": "bu-1"}, quota={"bytes": 5})
    newer = {"backend": newer.pop("backend"), "tier": "gold", **newer}
    newer["devices"]["cache"]["identity"]["nvme_eui"] = "eui.0025"
    newer["filesystem"]["reflink"] = True
    path = tmp_path / "mappings.yaml"
    path.write_text(written({"c1": newer}, fleet={"zone": "a"}))
    before = path.read_text()
    assert without_updated(resaved(path)) == without_updated(before)
    loaded = mapping.load(path)["caches"]["c1"]
    assert loaded.backend_state.cset_uuid == "cs-1" and loaded.tier == "gold"


def refusal(path) -> str:
    with pytest.raises(UsageError) as err:
        mapping.load(path)
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert "put the field back" in str(err.value.hint) and "backup" in str(err.value.hint)
    return str(err.value)


@pytest.mark.parametrize("field", [
    ("filesystem", "uuid"), ("filesystem", "mountpoint"), ("devices", "cache", "node"),
    ("devices", "origin", "size"), ("spec",), ("backend",), ("state",), ("devices",),
])
def test_a_required_field_deleted_by_hand_is_refused_naming_it(tmp_path, field):
    """The file is whole (ends with `entries:` and `updated:`), so only the record's
    type can tell that a field is missing: it is never read as "not recorded"."""
    broken = SHAPES["bcache"]
    broken = yaml.safe_load(yaml.safe_dump(broken))
    *parents, last = field
    holder = broken
    for key in parents:
        holder = holder[key]
    del holder[last]
    path = tmp_path / "mappings.yaml"
    path.write_text(written({"c1": SHAPES["none"], "c2": broken}))
    before = path.read_bytes()
    message = refusal(path)
    assert str(path) in message and "cache c2" in message
    assert f"caches.c2.{'.'.join(field)}: is missing" in message
    assert path.read_bytes() == before


@pytest.mark.parametrize("path_, value, said", [
    (("devices", "origin", "size"), "8G", "devices.origin.size: input should be a valid integer"),
    # a number written as text is refused too, not converted (it would be saved back as
    # another file)
    (("devices", "origin", "size"), "8589934592", "devices.origin.size: input should be a valid integer"),
    (("backend_state", "cset_uuid"), 42, "backend_state.cset_uuid: input should be a valid string"),
    (("devices", "cache", "identity"), "SSD1", "devices.cache.identity: input should be"),
    (("filesystem",), None, "filesystem: input should be"),
    # a state this hotcache does not know is refused, never read as "not built yet"
    (("state",), "rebuilding", "state: input should be 'building', 'ready' or 'kept'"),
    (("state",), 1, "state: input should be 'building', 'ready' or 'kept'"),
])
def test_a_field_of_the_wrong_type_is_refused_not_converted(tmp_path, path_, value, said):
    path = tmp_path / "mappings.yaml"
    path.write_text(written({"c2": edited(SHAPES["bcache"], path_, value)}))
    assert f"caches.c2.{said}" in refusal(path)


def edited(shape: dict, path_: tuple, value) -> dict:
    """A copy of entry `shape` with the field at `path_` set to `value`, as by hand."""
    broken = yaml.safe_load(yaml.safe_dump(shape))
    *parents, last = path_
    holder = broken
    for key in parents:
        holder = holder[key]
    holder[last] = value
    return broken


@pytest.mark.parametrize("shape, path_, value, said", [
    ("bcache", ("devices", "origin", "size"), -1, "devices.origin.size: input should be "
     "greater than or equal to 0"),
    ("bcache", ("devices", "cache", "identity", "partn"), 0, "devices.cache.identity.partn: "
     "input should be greater than or equal to 1"),
    ("bcache", ("hot_copies", "/srv/hot/imagenet", "files"), -3, "hot_copies./srv/hot/imagenet"
     ".files: input should be greater than or equal to 0"),
    ("bcache", ("hot_copies", "/srv/hot/imagenet", "inode"), -1, "hot_copies./srv/hot/imagenet"
     ".inode: input should be greater than or equal to 0"),
    ("dm-cache", ("backend_state", "data_sectors"), 0, "backend_state.data_sectors: input "
     "should be greater than 0"),
    ("dm-cache", ("backend_state", "fs_offset"), -2048, "backend_state.fs_offset: input "
     "should be greater than or equal to 0"),
])
def test_a_count_or_size_below_its_range_is_refused(tmp_path, shape, path_, value, said):
    """Sizes, sector counts, file counts and inode numbers edited by hand below their
    range are refused with their path: a dm-cache rebuilt from 0 data sectors, or a copy
    matched against inode -1, would be another cache or another copy."""
    path = tmp_path / "mappings.yaml"
    path.write_text(written({"c2": edited(SHAPES[shape], path_, value)}))
    before = path.read_bytes()
    assert f"caches.c2.{said}" in refusal(path)
    assert path.read_bytes() == before


def test_an_entry_hotcache_could_not_load_again_is_never_saved(tmp_path):
    path = tmp_path / "mappings.yaml"
    mapping.save(path, {"caches": {"c1": SHAPES["none"]}})
    before = path.read_bytes()
    with pytest.raises(Exception):
        with mapping.editing(path) as data:
            data["caches"]["c2"] = {"backend": "none"}
    assert path.read_bytes() == before


def test_records_are_attributes_not_keys(tmp_path):
    """A typo in a field name is an AttributeError, never a silent None."""
    record = CacheEntry.model_validate(SHAPES["bcache"])
    assert record.filesystem.uuid == FS["uuid"]
    assert record.state is EntryState.READY and record.dump()["state"] == "ready"
    with pytest.raises(AttributeError):
        record.filesystem.uiud      # noqa: B018


def test_the_old_shape_keeps_its_missing_fields_missing(tmp_path):
    path = tmp_path / "mappings.yaml"
    path.write_text(written({"old": SHAPES["old"]}))
    old = mapping.load(path)["caches"]["old"]
    assert old.devices["origin"].identity is None and old.backend_state is None
    text = resaved(path)
    assert "identity" not in text and "backend_state" not in text and "hot_copies" not in text
    assert textwrap.dedent("""\
        caches:
          old:
            backend: none
    """) in text


def test_backend_facts_are_merged_into_the_typed_state_in_the_order_written(tmp_path):
    """backends/state.remember, as lvmcache's first build runs it (the VG when it is
    made, the UUIDs once it is built): one LvmCacheState with both, in that order."""
    from hotcache.provision.backends.parts import state
    from hotcache.provision.engine.apply import Env, Planner, execute
    from hotcache.provision.plan import Plan
    from hotcache.provision.system.runner import Runner

    path = tmp_path / "mappings.yaml"
    building = {**SHAPES["lvmcache"], "state": "building", "backend_state": {}}
    mapping.save(path, {"caches": {"c1": building}})
    p = Planner(Env(Runner(), path, tmp_path / "fstab"), "c1", Plan())
    state.remember(p, "vg", lambda ctx: {"vg": "hc_c1", "origin_lv": "data", "adopted": False})
    state.remember(p, "uuids", lambda ctx: {"pv_uuids": {"cache": "PV-ssd"},
                                             "vg_uuid": "VG-1", "lv_uuid": "LV-1"})
    execute(p.plan, Runner())
    st = mapping.load(path)["caches"]["c1"].backend_state
    assert isinstance(st, LvmCacheState) and (st.vg, st.lv_uuid) == ("hc_c1", "LV-1")
    assert list(st.dump()) == ["vg", "origin_lv", "adopted", "pv_uuids", "vg_uuid", "lv_uuid"]
    before = path.read_bytes()
    p = Planner(Env(Runner(), path, tmp_path / "fstab"), "c1", Plan())
    state.remember(p, "a fact of the wrong type", lambda ctx: {"vg_uuid": 7})
    with pytest.raises(ValidationError):
        execute(p.plan, Runner())
    assert path.read_bytes() == before          # never written

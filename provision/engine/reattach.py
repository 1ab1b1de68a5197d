"""A cache whose SSD failed, taken apart, waiting for a new SSD.

`hotcache teardown NAME --cache-failed` leaves the origin with its filesystem (and, for
bcache, its backing superblock; for lvmcache, its VG and LV). It records what survives
under the mapping's `detached` key: the origin device by identity, the filesystem, the
spec, the hot copies and the backend's surviving facts (`Backend.surviving_state`). An
apply of a spec with that name then re-attaches a new SSD to that filesystem instead of
formatting the origin: the record is its seed (a first build whose origin is already
hotcache's), and it is forgotten once the cache is recorded ready.
"""

from __future__ import annotations

from typing import Any, TypedDict

from hotcache.provision.records import CacheEntry, EntryState, ValidationError

KEY = "detached"


class WaitingRow(TypedDict):
    """A cache waiting for a new SSD, as `hotcache status` and doctor show it."""
    name: str
    backend: str
    origin: str
    filesystem_uuid: str
    mountpoint: str
    message: str


def record(data: dict[str, Any], name: str, entry: CacheEntry,
           backend_state: dict[str, Any]) -> None:
    """Note in the mapping `data` that `name` lost its SSD and kept its origin."""
    data.setdefault(KEY, {})[name] = _surviving(entry, backend_state)


def seed(entry: CacheEntry, backend_state: dict[str, Any]) -> CacheEntry:
    """What a new SSD is attached to for a cache running on its origin since its SSD
    failed: the record a teardown would leave, without the teardown."""
    return CacheEntry.model_validate(_surviving(entry, backend_state))


def _surviving(entry: CacheEntry, backend_state: dict[str, Any]) -> dict[str, Any]:
    body = entry.dump()
    body.update(state=EntryState.BUILDING.value, devices={"origin": entry.devices["origin"].dump()},
                backend_state=backend_state)
    body.pop("cached_device", None)     # the cached device is gone with the cache
    body.pop("on_origin", None)         # the new cache runs on the new SSD
    was = entry.devices.get("cache")
    if was is not None:                 # how the spec named the SSD that failed
        body[FAILED_SSD] = {"path": was.path, "loop_file": was.loop_file}
    return body


FAILED_SSD = "failed_ssd"


def failed_ssd_named(entry: CacheEntry, path: str | None, loop_file: str | None) -> bool:
    """Whether a spec's cache device (its `path`, or its loop image's real path) is the
    one the failed cache was built on, as the spec named it then."""
    was = (entry.model_extra or {}).get(FAILED_SSD) or {}
    return bool(path and path == was.get("path") or loop_file and loop_file == was.get("loop_file"))


def detached(data: dict[str, Any]) -> dict[str, CacheEntry]:
    """Every cache waiting for a new SSD; a record hotcache cannot read is skipped (it
    is then never used to prove a device)."""
    out = {}
    for name, body in (data.get(KEY) or {}).items():
        try:
            out[str(name)] = CacheEntry.model_validate(body)
        except ValidationError:
            continue
    return out


def entry_for(data: dict[str, Any], name: str, backend: str) -> CacheEntry | None:
    """The record an apply of cache `name` with `backend` re-attaches to (None: none)."""
    found = detached(data).get(name)
    return found if found is not None and found.backend == backend else None


def forget(data: dict[str, Any], name: str) -> None:
    kept = data.get(KEY) or {}
    kept.pop(name, None)
    if not kept:
        data.pop(KEY, None)


def waiting(data: dict[str, Any]) -> list[WaitingRow]:
    """What `hotcache status` says of each cache waiting for a new SSD."""
    out: list[WaitingRow] = []
    for name, entry in detached(data).items():
        origin = entry.devices["origin"]
        shown = next(iter(origin.by_id or []), None) or origin.path or origin.loop_file \
            or origin.node
        out.append({
            "name": name, "backend": entry.backend, "origin": shown,
            "filesystem_uuid": entry.filesystem.uuid,
            "mountpoint": entry.filesystem.mountpoint,
            "message": f"its failed SSD was taken off; the origin {shown} keeps the "
                       f"filesystem {entry.filesystem.uuid}, without a cache. Name a "
                       f"new SSD as the cache device in {name}'s spec and run `hotcache "
                       f"apply SPEC` to attach a new cache to it (`hotcache teardown {name} "
                       "--forget` drops this record)",
        })
    return out

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

from hotcache.provision.records import CacheEntry, EntryState, ValidationError

KEY = "detached"


def record(data: dict, name: str, entry: CacheEntry, backend_state: dict) -> None:
    """Note in the mapping `data` that `name` lost its SSD and kept its origin."""
    data.setdefault(KEY, {})[name] = _surviving(entry, backend_state)


def seed(entry: CacheEntry, backend_state: dict) -> CacheEntry:
    """What a new SSD is attached to for a cache running on its origin since its SSD
    failed: the record a teardown would leave, without the teardown."""
    return CacheEntry.model_validate(_surviving(entry, backend_state))


def _surviving(entry: CacheEntry, backend_state: dict) -> dict:
    body = entry.dump()
    body.update(state=EntryState.BUILDING.value, devices={"origin": entry.devices["origin"].dump()},
                backend_state=backend_state)
    body.pop("cached_device", None)     # the cached device is gone with the cache
    body.pop("on_origin", None)         # the new cache runs on the new SSD
    return body


def detached(data: dict) -> dict[str, CacheEntry]:
    """Every cache waiting for a new SSD; a record hotcache cannot read is skipped (it
    is then never used to prove a device)."""
    out = {}
    for name, body in (data.get(KEY) or {}).items():
        try:
            out[str(name)] = CacheEntry.model_validate(body)
        except ValidationError:
            continue
    return out


def entry_for(data: dict, name: str, backend: str) -> CacheEntry | None:
    """The record an apply of cache `name` with `backend` re-attaches to (None: none)."""
    found = detached(data).get(name)
    return found if found is not None and found.backend == backend else None


def forget(data: dict, name: str) -> None:
    kept = data.get(KEY) or {}
    kept.pop(name, None)
    if not kept:
        data.pop(KEY, None)


def waiting(data: dict) -> list[dict]:
    """What `hotcache status` says of each cache waiting for a new SSD."""
    out = []
    for name, entry in detached(data).items():
        origin = entry.devices["origin"]
        shown = next(iter(origin.by_id or []), None) or origin.path or origin.loop_file \
            or origin.node
        out.append({
            "name": name, "backend": entry.backend, "origin": shown,
            "filesystem_uuid": entry.filesystem.uuid,
            "mountpoint": entry.filesystem.mountpoint,
            "message": f"its failed SSD was taken off; the origin {shown} keeps the "
                       f"filesystem {entry.filesystem.uuid}, read without a cache. Name a "
                       f"new SSD as the cache device in {name}'s spec and run `hotcache "
                       f"apply SPEC` to attach a new cache to it (`hotcache teardown {name} "
                       "--forget` drops this record)",
        })
    return out

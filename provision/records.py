"""The mapping's entries as typed records: what hotcache built for one cache.

`mapping.load` validates every entry into a `CacheEntry` and `mapping.save` writes it
back, so a field deleted or mistyped by hand is refused with its path instead of being
read as "not recorded". The file's format is the one hotcache always wrote:

- Fields older hotcache did not write are Optional; `model_dump(exclude_unset=True)`
  (`Record.dump`) writes back exactly the keys that were read, explicit nulls included.
- Keys this hotcache does not know (written by a newer one) are kept (`extra="allow"`)
  and written back in the order they were read: load then save loses nothing.
- `strict`: a value of the wrong type is an error, never converted (a "5" read as 5 would
  be written back as another file).

`backend_state` is typed per backend (`STATES`); a backend this hotcache does not know
keeps a `BackendState` with whatever keys it had.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, SerializeAsAny,
                      ValidationError, model_serializer, model_validator)
from pydantic_core import ErrorDetails, InitErrorDetails

from hotcache.provision.system.strenum import StrEnum

if TYPE_CHECKING:
    from pydantic import ModelWrapValidatorHandler, SerializerFunctionWrapHandler
    from typing_extensions import Self

__all__ = ["CacheEntry", "EntryState", "DeviceRecord", "Filesystem", "HotCopy", "OnOrigin",
           "ValidationError",
           "BackendState", "BcacheState", "DmCacheState", "LvmCacheState", "STATES"]


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    _order: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        record = handler(data)
        if isinstance(data, dict):
            record._order = list(data)
        return record

    @model_serializer(mode="wrap")
    def _in_read_order(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if not self._order or not isinstance(out, dict):
            return out
        first = {k: out[k] for k in self._order if k in out}
        return first | {k: v for k, v in out.items() if k not in first}

    def dump(self) -> dict[str, Any]:
        """The record as the mapping file holds it."""
        return self.model_dump(mode="json", exclude_unset=True)


class Identity(Record):
    """Who a device is (block/identity.py KEYS), as probed when it was recorded."""
    wwn: str | None = None
    serial: str | None = None
    partuuid: str | None = None
    partn: int | None = Field(None, ge=1)
    backing_file: str | None = None


class DeviceRecord(Record):
    """One device of a cache (`devices.<role>`): found again by identity, never by node."""
    node: str
    size: int = Field(ge=0)
    by_id: list[str] | None = None
    identity: Identity | None = None      # None: written before identities were recorded
    path: str | None = None               # the spec's `path:`
    loop_file: str | None = None          # the real path of a loop-backed image


class Filesystem(Record):
    type: str | None = None
    uuid: str
    label: str | None = None
    mountpoint: str
    options: list[str] | None = None
    owner: str | None = None
    mode: str | None = None


class Persist(Record):
    fstab: str | None = None


class HotCopy(Record):
    """A hot copy on the cache (hotcopy/catalog.RECORDED)."""
    name: str | None = None
    version: str | int | float | None = None
    files: int | None = Field(None, ge=0)
    bytes: int | None = Field(None, ge=0)
    copied_at: str | None = None
    verified_at: str | None = None
    verify_ok: bool | None = None
    # The published folder as hotcache made it: a folder found at that path later with
    # another inode or owner is not this copy (someone replaced it).
    dev: int | None = Field(None, ge=0)
    inode: int | None = Field(None, ge=0)
    uid: int | None = Field(None, ge=0)


class OnOrigin(Record):
    """A cache whose SSD failed, switched in place to a linear mapping of its origin
    (backends/parts/failover.py): the filesystem stayed mounted, reads go to the origin,
    and a boot restores it on the bare origin, never on the failed SSD."""
    since: str                          # when it was switched (system/clock.py)
    said: str                           # the kernel's verdict, in its words
    device: str                         # the device-mapper device switched
    table: str                          # the linear table loaded
    replaced: str | None = None         # the cache table it replaced


class BackendState(Record):
    """Backend facts a later apply, status, restore or teardown needs (backends/parts/state.py)."""


class BcacheState(BackendState):
    cset_uuid: str | None = None
    cache_uuid: str | None = None
    backing_uuid: str | None = None


class DmCacheState(BackendState):
    block_sectors: int | None = Field(None, gt=0)
    meta_sectors: int | None = Field(None, gt=0)
    data_sectors: int | None = Field(None, gt=0)
    names: dict[str, str] | None = None   # part (top, cache, meta, data) -> dm name
    table: str | None = None
    # hotcache's header at the start of the SSD (block/header.py): the sectors it keeps
    # (0 for a cache built before there was one) and the UUID that proves the SSD.
    header_sectors: int | None = Field(None, ge=0)
    header_uuid: str | None = None
    # Where the filesystem starts on the origin, in sectors: after hotcache's header on
    # the origin (its UUID proves the origin), so the bare origin never shows the
    # filesystem. 0 or None: a cache built before, its filesystem at the origin's start.
    fs_offset: int | None = Field(None, ge=0)
    origin_header_uuid: str | None = None


class LvmCacheState(BackendState):
    vg: str | None = None
    origin_lv: str | None = None
    adopted: bool | None = None
    pv_uuids: dict[str, str] | None = None
    vg_uuid: str | None = None
    lv_uuid: str | None = None


STATES: dict[str, type[BackendState]] = {
    "bcache": BcacheState, "dm-cache": DmCacheState, "lvmcache": LvmCacheState,
}


def _in_backend_state(error: ErrorDetails) -> InitErrorDetails:
    """A backend_state validation error, located in its mapping entry."""
    located: InitErrorDetails = {"type": error["type"], "input": error["input"],
                                 "loc": ("backend_state", *error["loc"])}
    if "ctx" in error:
        located["ctx"] = error["ctx"]
    return located


class EntryState(StrEnum):
    """How far a cache's build got, as the mapping records it."""
    BUILDING = "building"       # its first apply (or a reattach) has not finished
    READY = "ready"             # built: restore replays it, apply never makes it again
    KEPT = "kept"               # a taken-down cache's kept image (never saved as an entry)


class CacheEntry(Record):
    """`caches.<name>` of the mapping (engine/apply._write_entry writes it, in this order)."""
    backend: str
    # Read from YAML as its string (strict mode would take only a member); a state this
    # hotcache does not know is refused rather than read as "not built".
    state: EntryState = Field(strict=False)
    created: str | None = None
    updated: str | None = None
    mode: str | None = None
    # Whether the cache ever ran in writeback since it was built (None: not known, a
    # record older than this field): a writethrough cache that never did holds no dirty
    # block even when a failed kernel no longer reports the count.
    writeback_ever: bool | None = None
    tunables: dict[str, Any] | None = None
    devices: dict[str, DeviceRecord]
    cached_device: str | None = None
    filesystem: Filesystem
    persist: Persist | None = None
    backend_state: SerializeAsAny[BackendState] | None = None    # typed per backend
    hot_copies: dict[str, HotCopy] | None = None
    on_origin: OnOrigin | None = None     # switched to its origin after its SSD failed
    spec: dict[str, Any] = Field(description="the spec it was built from (restore replays it)")

    @model_validator(mode="before")
    @classmethod
    def _typed_state(cls, data: Any) -> Any:
        """backend_state read as its backend's record."""
        if isinstance(data, dict) and isinstance(data.get("backend_state"), dict):
            kind = STATES.get(data.get("backend") or "", BackendState)
            try:
                state = kind.model_validate(data["backend_state"])
            except ValidationError as exc:      # its errors, located in the entry
                raise ValidationError.from_exception_data(
                    cls.__name__, [_in_backend_state(e) for e in exc.errors()]) from None
            data = {**data, "backend_state": state}
        return data


def problems(exc: ValidationError) -> list[str]:
    """Each error of a record as `field.path: what is wrong`."""
    out = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(entry)"
        what = "is missing" if err["type"] == "missing" else err["msg"].lower()
        out.append(f"{where}: {what}")
    return out

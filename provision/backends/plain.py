"""Backend `none`: XFS straight on the SSD, no block cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hotcache.provision.backends.base import Backend, Signature

if TYPE_CHECKING:
    from hotcache.provision.backends.parts.contract import CacheSpec, Device, Planner
    from hotcache.provision.plan import Ref
    from hotcache.provision.records import CacheEntry


class Plain(Backend):
    name = "none"
    modes = ("none",)
    block_cache = False
    min_bytes = 300 * 2**20     # mkfs.xfs (xfsprogs >= 5.19) refuses smaller filesystems
    programs = ("mkfs.xfs", "mount", "umount", "wipefs", "blkid")

    def owns(self, entry: CacheEntry | None, dev: Device) -> bool:
        recorded = entry and entry.filesystem.uuid
        return dev.proven and bool(recorded) and dev.fs.get("UUID") == recorded

    def signature(self, entry: CacheEntry, role: str) -> Signature | None:
        return ("xfs", entry.filesystem.uuid)

    def build(self, p: Planner, spec: CacheSpec, entry: CacheEntry | None,
              devs: Mapping[str, Device]) -> str | Ref:
        return devs["origin"].node

"""Backend `none`: XFS straight on the SSD, no block cache."""

from __future__ import annotations

from hotcache.provision.backends.base import Backend


class Plain(Backend):
    name = "none"
    modes = ("none",)
    block_cache = False
    min_bytes = 300 * 2**20     # mkfs.xfs (xfsprogs >= 5.19) refuses smaller filesystems
    programs = ("mkfs.xfs", "mount", "umount", "wipefs", "blkid")

    def owns(self, entry, dev):
        recorded = entry and entry.filesystem.uuid
        return dev.proven and bool(recorded) and dev.fs.get("UUID") == recorded

    def signature(self, entry, role):
        return ("xfs", entry.filesystem.uuid)

    def build(self, p, spec, entry, devs):
        return devs["origin"].node

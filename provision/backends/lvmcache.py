"""Backend `lvmcache` (built in issue 3; for now it only reports availability)."""

from __future__ import annotations

from .base import Backend


class LvmCache(Backend):
    name = "lvmcache"
    programs = ("lvcreate", "lvconvert", "pvcreate", "vgcreate", "mkfs.xfs")

    def unavailable(self):
        from ..discover import kernel_has

        if not kernel_has("device-mapper"):
            return "the kernel has no device-mapper (`dmsetup version` cannot reach it)"
        return "not implemented yet"

"""Cache backends. Each builds the block device the filesystem goes on, reads its
statistics and takes it down; the engine does everything above the block device."""

from __future__ import annotations

from .base import Backend


def get(name: str) -> Backend:
    if name == "none":
        from .plain import Plain
        return Plain()
    if name == "bcache":
        from .bcache import Bcache
        return Bcache()
    if name == "dm-cache":
        from .dmcache import DmCache
        return DmCache()
    if name == "lvmcache":
        from .lvmcache import LvmCache
        return LvmCache()
    raise KeyError(name)

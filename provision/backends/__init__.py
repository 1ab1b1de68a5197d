"""Cache backends. Each builds the block device the filesystem goes on, reads its
statistics and takes it down; the engine does everything above the block device."""

from __future__ import annotations

from hotcache.provision.backends.base import Backend


def get(name: str) -> Backend:
    if name == "none":
        from hotcache.provision.backends.plain import Plain
        return Plain()
    if name == "bcache":
        from hotcache.provision.backends.bcache import Bcache
        return Bcache()
    if name == "dm-cache":
        from hotcache.provision.backends.dmcache import DmCache
        return DmCache()
    if name == "lvmcache":
        from hotcache.provision.backends.lvmcache import LvmCache
        return LvmCache()
    raise KeyError(name)

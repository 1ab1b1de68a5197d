"""Cache backends. Each builds the block device the filesystem goes on, reads its
statistics and takes it down; the engine does everything above the block device.

`BACKENDS` is the registry: every fact about a backend is declared on its class
(base.py), and spec validation, discover, doctor, restore, warm and the engine read them
from here. Adding one (Open CAS, say) is one module plus one entry below.
"""

from __future__ import annotations

from typing import TypedDict

from hotcache.provision.backends.base import Backend
from hotcache.provision.backends.bcache import Bcache
from hotcache.provision.backends.dmcache import DmCache
from hotcache.provision.backends.lvmcache import LvmCache
from hotcache.provision.backends.plain import Plain
from hotcache.provision.block.host import Host
from hotcache.provision.system.runner import PACKAGES

BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (Plain, Bcache, DmCache, LvmCache)}
PLAIN = Plain.name      # the backend without a block cache: the filesystem on the SSD itself


def block_cache(name: str | None) -> bool:
    """Whether backend `name` puts a block cache in front of an origin (False for the
    plain backend, and for a name this hotcache does not know)."""
    backend = BACKENDS.get(name or "")
    return backend is not None and backend.block_cache


def get(name: str, host: Host) -> Backend:
    """Backend `name` planning against `host`; KeyError if unknown."""
    return BACKENDS[name](host)


class BackendRow(TypedDict):
    backend: str
    available: bool
    why: str | None


def backend_report(host: Host | None = None) -> list[BackendRow]:
    """Each registered backend, whether this host can run it (its kernel's features, the
    programs it needs), and why not, with the packages that bring what is missing
    (`hotcache devices --backends`, and apply's hint for a spec naming one it cannot)."""
    host = host or Host()
    rows: list[BackendRow] = []
    for name in BACKENDS:
        backend = get(name, host)
        missing = [p for p in backend.programs if host.which(p) is None]
        why = backend.unavailable()
        if missing:
            pkgs = sorted({PACKAGES.get(p, p) for p in missing})
            why = (why + "; " if why else "") + f"missing programs {', '.join(missing)} " \
                  f"(apt-get install {' '.join(pkgs)})"
        rows.append({"backend": name, "available": why is None, "why": why})
    return rows

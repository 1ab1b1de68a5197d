"""`hotcache devices`: the host's block devices as udev knows them, and which backends
this kernel and these programs allow."""

from __future__ import annotations

import os

from hotcache.provision.block import blockdev
from hotcache.provision.system.runner import Runner, which

SKIP_PREFIXES = ("ram", "zram", "sr", "fd")


def discover(include_empty_loops: bool = False) -> list[dict]:
    import pyudev

    runner = Runner()
    roots = blockdev.root_devices()
    rows = []
    for dev in pyudev.Context().list_devices(subsystem="block"):
        name = dev.sys_name
        if name.startswith(SKIP_PREFIXES):
            continue
        node = dev.device_node
        if not node or not os.path.exists(node):
            continue
        if name.startswith("loop") and not blockdev.loop_backing_file(node) and not include_empty_loops:
            continue
        try:
            rep = blockdev.report(node, runner, roots=roots, strict=False)
        except (OSError, ValueError):
            continue
        rep.model = dev.properties.get("ID_MODEL") or rep.model
        rep.serial = dev.properties.get("ID_SERIAL_SHORT") or dev.properties.get("ID_SERIAL") or rep.serial
        row = rep.to_json()
        row["type"] = dev.device_type  # disk or partition
        rows.append(row)
    return sorted(rows, key=lambda r: r["node"])


def backend_report() -> list[dict]:
    from hotcache.provision.backends import get

    rows = []
    for name in ("none", "bcache", "dm-cache", "lvmcache"):
        backend = get(name)
        missing = [p for p in backend.programs if which(p) is None]
        why = backend.unavailable()
        if missing:
            from hotcache.provision.system.runner import PACKAGES

            pkgs = sorted({PACKAGES.get(p, p) for p in missing})
            why = (why + "; " if why else "") + f"missing programs {', '.join(missing)} " \
                  f"(apt-get install {' '.join(pkgs)})"
        rows.append({"backend": name, "available": why is None, "why": why})
    return rows

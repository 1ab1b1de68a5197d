"""`hotcache devices`: the host's block devices as udev knows them, and which backends
this kernel and these programs allow."""

from __future__ import annotations

import os
from typing import Any

import pyudev

from hotcache.provision.backends import backend_report as backend_report  # re-exported: devices --backends
from hotcache.provision.block import blockdev
from hotcache.provision.block.host import Host

SKIP_PREFIXES = ("ram", "zram", "sr", "fd")


def discover(include_empty_loops: bool = False) -> list[dict[str, Any]]:
    host = Host()
    roots = blockdev.root_devices(host)
    rows: list[dict[str, Any]] = []
    for dev in pyudev.Context().list_devices(subsystem="block"):
        name = dev.sys_name
        if name.startswith(SKIP_PREFIXES):
            continue
        node = dev.device_node
        if not node or not os.path.exists(node):
            continue
        if name.startswith("loop") and not blockdev.loop_backing_file(host, node) \
                and not include_empty_loops:
            continue
        try:
            rep = blockdev.report(host, node, roots=roots, strict=False)
        except (OSError, ValueError):
            continue
        rep.model = dev.properties.get("ID_MODEL") or rep.model
        rep.serial = dev.properties.get("ID_SERIAL_SHORT") or dev.properties.get("ID_SERIAL") or rep.serial
        row = rep.to_json()
        row["type"] = dev.device_type  # disk or partition
        rows.append(row)
    return sorted(rows, key=lambda r: r["node"])

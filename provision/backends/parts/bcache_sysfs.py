"""bcache's sysfs: where each attribute lives, and how to read its human-readable values.

A backing device's attributes are under /sys/class/block/<origin>/bcache/ (cache_mode,
sequential_cutoff, state, stats_total/...), a cache set's under /sys/fs/bcache/<set uuid>/.
bcache prints sizes rounded with a unit ("4.0M", "0.0k"), and choices as a list with the
current one in brackets ("[writethrough] writeback writearound none"). Paths here are the
host's; every read and write goes through a Host (block/host.py).
"""

from __future__ import annotations

import os
import re

from hotcache.provision.block.host import Host

SYS_FS = "/sys/fs/bcache"
BY_UUID = "/dev/bcache/by-uuid"
# Tunables of the backing device; the others are the cache set's.
SET_TUNABLES = {"congested_read_threshold_us", "congested_write_threshold_us"}
SIZE_TUNABLES = {"sequential_cutoff", "readahead"}
_UNITS = "kMGTPEZY"


def bdev_dir(host: Host, node: str) -> str:
    return f"{host.sysfs(node)}/bcache"


def set_dir(cset: str) -> str:
    return f"{SYS_FS}/{cset}"


def read(host: Host, path: str) -> str:
    """A sysfs attribute; FileNotFoundError when it cannot be read (the device went)."""
    value = host.read(path)
    if value is None:
        raise FileNotFoundError(f"cannot read {path}")
    return value


def selected(text: str) -> str:
    """'[writethrough] writeback' -> 'writethrough'."""
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text.strip()


def parse_human(text: str) -> int:
    """bcache's rounded sizes to bytes: '4.0M' -> 4194304, '0.0k' -> 0, '512' -> 512."""
    text = text.strip()
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * 1024 ** (_UNITS.index(text[-1]) + 1))
    return int(float(text or 0))


def same_value(key: str, current: str | None, want: int | str) -> bool:
    if current is None:
        return False
    if key in SIZE_TUNABLES:
        have = parse_human(current)
        return abs(have - int(want)) <= max(1, int(want) // 50)  # bcache rounds to 3 digits
    return current.strip() == str(want)


def tunable_path(host: Host, key: str, node: str, cset: str) -> str:
    return f"{set_dir(cset)}/{key}" if key in SET_TUNABLES else f"{bdev_dir(host, node)}/{key}"


def is_registered(host: Host, node: str) -> bool:
    return host.is_dir(bdev_dir(host, node))


def attached_set(host: Host, node: str) -> str | None:
    """The cache set a registered backing device is attached to, or None."""
    link = f"{bdev_dir(host, node)}/cache"
    return os.path.basename(host.realpath(link)) if host.exists(link) else None


def priority_stats(host: Host, cset: str) -> dict[str, int] | None:
    """The cache set's buckets by state, in percent: {'unused': 3, 'clean': 96, 'dirty': 0,
    'metadata': 1}, from priority_stats (how full the cache is, and with what)."""
    text = host.read(f"{set_dir(cset)}/cache0/priority_stats")
    if text is None:
        return None
    return {k.lower(): int(v) for k, v in re.findall(r"^(\w+):\s*(\d+)%", text, re.M)}


def unused_percent(host: Host, cset: str) -> int | None:
    prio = priority_stats(host, cset)
    return prio.get("unused") if prio else None

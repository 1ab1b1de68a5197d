"""bcache's sysfs: where each attribute lives, and how to read its human-readable values.

A backing device's attributes are under /sys/class/block/<origin>/bcache/ (cache_mode,
sequential_cutoff, state, stats_total/...), a cache set's under /sys/fs/bcache/<set uuid>/.
bcache prints sizes rounded with a unit ("4.0M", "0.0k"), and choices as a list with the
current one in brackets ("[writethrough] writeback writearound none").
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SYS_FS = Path("/sys/fs/bcache")
SYS_BLOCK = Path("/sys/class/block")
BY_UUID = Path("/dev/bcache/by-uuid")
# Tunables of the backing device; the others are the cache set's.
SET_TUNABLES = {"congested_read_threshold_us", "congested_write_threshold_us"}
SIZE_TUNABLES = {"sequential_cutoff", "readahead"}
_UNITS = "kMGTPEZY"


def bdev_dir(node: str) -> Path:
    return SYS_BLOCK / os.path.basename(os.path.realpath(node)) / "bcache"


def set_dir(cset: str) -> Path:
    return SYS_FS / cset


def read(path: Path) -> str:
    return path.read_text().strip()


def write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


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


def same_value(key: str, current: str, want: int | str) -> bool:
    if key in SIZE_TUNABLES:
        have = parse_human(current)
        return abs(have - int(want)) <= max(1, int(want) // 50)  # bcache rounds to 3 digits
    return current.strip() == str(want)


def tunable_path(key: str, node: str, cset: str) -> Path:
    return set_dir(cset) / key if key in SET_TUNABLES else bdev_dir(node) / key


def is_registered(node: str) -> bool:
    return bdev_dir(node).is_dir()


def attached_set(node: str) -> str | None:
    """The cache set a registered backing device is attached to, or None."""
    link = bdev_dir(node) / "cache"
    return os.path.basename(os.path.realpath(link)) if link.exists() else None


def priority_stats(cset: str) -> dict | None:
    """The cache set's buckets by state, in percent: {'unused': 3, 'clean': 96, 'dirty': 0,
    'metadata': 1}, from priority_stats (how full the cache is, and with what)."""
    stats = set_dir(cset) / "cache0" / "priority_stats"
    if not stats.exists():
        return None
    return {k.lower(): int(v)
            for k, v in re.findall(r"^(\w+):\s*(\d+)%", stats.read_text(), re.M)}


def unused_percent(cset: str) -> int | None:
    prio = priority_stats(cset)
    return prio.get("unused") if prio else None

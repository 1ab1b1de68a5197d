"""/proc/self/mountinfo, parsed: the kernel's own list of mounts, with the major:minor of
each source. Standard library only: the adapters read it inside training containers too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PATH = "/proc/self/mountinfo"
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    source_dev: str      # major:minor
    mountpoint: str
    fstype: str
    options: tuple[str, ...]   # per-mount options, then the superblock's
    source: str
    root: str = "/"            # the folder of the filesystem it shows (a bind mount's)


def unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo octal; everything else
    (UTF-8 names included) is left as it is."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse(text: str) -> list[Mount]:
    out = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts = left.split()
        if len(parts) < 6:
            continue
        fstype, source, super_opts = (right.split() + ["", "", ""])[:3]
        options = tuple(dict.fromkeys(parts[5].split(",") + super_opts.split(",")))
        out.append(Mount(parts[2], unescape(parts[4]), fstype, options, unescape(source),
                         unescape(parts[3])))
    return out


def read(path: str = PATH) -> list[Mount]:
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return parse(f.read())


def holding(mounts: list[Mount], path: str) -> Mount | None:
    """The mount whose mountpoint is the deepest prefix of `path` (the last one mounted
    wins when two are stacked on the same place)."""
    best = None
    for m in mounts:
        mnt = m.mountpoint
        if path == mnt or path.startswith(mnt.rstrip("/") + "/"):
            if best is None or len(mnt) >= len(best.mountpoint):
                best = m
    return best

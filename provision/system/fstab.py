"""Persistent mounts: one fstab line per cache, tagged with a `# hotcache:NAME` comment.

Entries mount by filesystem UUID with `nofail` and `x-systemd.device-timeout`, so a late
or missing cache device never drops the host into emergency mode at boot. The file is
HOTCACHE_FSTAB (or --fstab) when set, so tests and trials never touch /etc/fstab.
"""

from __future__ import annotations

import os
from pathlib import Path

from hotcache.provision.system.atomic import locked, write_atomic

DEFAULT_FSTAB = "/etc/fstab"


def fstab_path(option: str | None = None) -> Path:
    return Path(option or os.environ.get("HOTCACHE_FSTAB") or DEFAULT_FSTAB)


def marker(name: str) -> str:
    return f"# hotcache:{name}"


def entry(fs_uuid: str, mountpoint: str, fstype: str, options: list[str]) -> str:
    return f"UUID={fs_uuid} {_escape(mountpoint)} {fstype} {','.join(options)} 0 0"


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")


def read_entry(path: Path, name: str) -> str | None:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for i, line in enumerate(lines):
        if line.strip() == marker(name) and i + 1 < len(lines):
            return lines[i + 1]
    return None


def set_entry(path: Path, name: str, line: str | None) -> None:
    """Replace (or with None remove) the entry tagged for `name`; keep every other line."""
    with locked(path):
        try:
            old = path.read_text().splitlines()
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            old, mode = [], 0o644
        out, skip = [], False
        for current in old:
            if skip:
                skip = False
                continue
            if current.strip() == marker(name):
                skip = True
                continue
            out.append(current)
        if line is not None:
            out += [marker(name), line]
        write_atomic(path, "\n".join(out) + "\n" if out else "", mode)

"""Persistent mounts: one fstab line per cache, tagged with a `# hotcache:NAME` comment.

Entries mount by filesystem UUID with `nofail` and `x-systemd.device-timeout`, so a late
or missing cache device never drops the host into emergency mode at boot. The file is
HOTCACHE_FSTAB (or --fstab) when set, so tests and trials never touch /etc/fstab.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hotcache.provision.system.atomic import locked, write_atomic

DEFAULT_FSTAB = "/etc/fstab"


def fstab_path(option: str | os.PathLike[str] | None = None) -> Path:
    return Path(option or os.environ.get("HOTCACHE_FSTAB") or DEFAULT_FSTAB)


def marker(name: str) -> str:
    return f"# hotcache:{name}"


def entry(fs_uuid: str, mountpoint: str, fstype: str, options: list[str]) -> str:
    return f"UUID={fs_uuid} {_escape(mountpoint)} {fstype} {','.join(options)} 0 0"


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")


def is_entry(line: str, fs_uuid: str | None, mountpoints: Iterable[str | None]) -> bool:
    """True when `line` is the entry hotcache wrote for a cache: it mounts the cache's
    filesystem UUID on one of its mountpoints. A marker alone proves nothing: the line
    after an orphaned marker can be anyone's, even the one that mounts /."""
    fields = line.split()
    return (bool(fs_uuid) and len(fields) >= 2 and fields[0] == f"UUID={fs_uuid}"
            and os.path.normpath(_unescape(fields[1])) in
            {os.path.normpath(m) for m in mountpoints if m})


def read_entry(path: Path, name: str, fs_uuid: str | None,
               mountpoints: Iterable[str | None]) -> str | None:
    """The entry of cache `name`: the line after its marker, if marker, UUID and
    mountpoint all match."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for i, line in enumerate(lines):
        if line.strip() == marker(name) and i + 1 < len(lines) \
                and is_entry(lines[i + 1], fs_uuid, mountpoints):
            return lines[i + 1]
    return None


def has_marker(path: Path, name: str) -> bool:
    try:
        return any(line.strip() == marker(name) for line in path.read_text().splitlines())
    except FileNotFoundError:
        return False


def set_entry(path: Path, name: str, line: str | None, fs_uuid: str | None,
              mountpoints: Iterable[str | None]) -> None:
    """Replace (or with None remove) the entry of cache `name`; keep every other line.
    Every marker of `name` goes; the line after one goes only when it is the cache's own
    entry (is_entry), so an orphaned marker never takes a stranger's line with it."""
    with locked(path):
        try:
            old = path.read_text().splitlines()
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            old, mode = [], 0o644
        out, skip = [], False
        for i, current in enumerate(old):
            if skip:
                skip = False
                continue
            if current.strip() == marker(name):
                skip = i + 1 < len(old) and is_entry(old[i + 1], fs_uuid, mountpoints)
                continue
            out.append(current)
        if line is not None:
            out += [marker(name), line]
        write_atomic(path, "\n".join(out) + "\n" if out else "", mode)

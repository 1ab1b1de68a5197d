"""Who is using a mount: processes with their cwd, root, open files or maps under it."""

from __future__ import annotations

import os
from pathlib import Path


def users_of(mountpoint: str) -> list[str]:
    """'pid 123 (python3): cwd' lines for each process using anything under mountpoint."""
    root = os.path.realpath(mountpoint).rstrip("/") + "/"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        how = _how(proc, root)
        if how:
            try:
                comm = (proc / "comm").read_text().strip()
            except OSError:
                comm = "?"
            found.append(f"pid {proc.name} ({comm}): {how}")
    return found


def _under(path: str, root: str) -> bool:
    return (path.rstrip("/") + "/").startswith(root)


def _how(proc: Path, root: str) -> str | None:
    try:
        for link in ("cwd", "root", "exe"):
            target = os.readlink(proc / link)
            if _under(target, root) and not (link == "root" and target == "/"):
                return f"{link} {target}"
        for fd in (proc / "fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("/") and _under(target, root):
                return f"open file {target}"
        for line in (proc / "maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and _under(parts[5], root):
                return f"mapped {parts[5]}"
    except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
        return None
    return None


def other_namespaces_holding(devnum: str) -> list[str]:
    """'pid 123 (python3)': one process of each other mount namespace in which the
    filesystem on device MAJ:MIN is mounted. A namespace made while it was mounted keeps
    its own copy of the mount (containers with private bind mounts do), so the device
    stays in use after the host unmounts it, until those processes exit."""
    try:
        own = os.readlink("/proc/self/ns/mnt")
    except OSError:
        return []
    seen, found = {own}, []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ns = os.readlink(proc / "ns" / "mnt")
            if ns in seen:
                continue
            lines = (proc / "mountinfo").read_text().splitlines()
            comm = (proc / "comm").read_text().strip()
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        seen.add(ns)
        if any(line.split()[2] == devnum for line in lines if line.count(" ") > 2):
            found.append(f"pid {proc.name} ({comm})")
    return found

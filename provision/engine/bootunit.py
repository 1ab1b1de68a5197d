"""The boot-time restore unit apply installs for each block cache whose backend declares
`restores_at_boot`: ordered before the cache's mount unit, it runs `hotcache restore
NAME` (restore.py). Units go to HOTCACHE_UNIT_DIR (default /etc/systemd/system), so tests
and trials never touch the host's /etc."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from hotcache.provision.system.atomic import write_atomic

DEFAULT_UNIT_DIR = "/etc/systemd/system"


def unit_dir() -> Path:
    return Path(os.environ.get("HOTCACHE_UNIT_DIR") or DEFAULT_UNIT_DIR)


def unit_name(cache: str) -> str:
    return f"hotcache-restore-{cache}.service"


def mount_unit(mountpoint: str) -> str:
    """systemd's unit name for a mountpoint (what `systemd-escape --path --suffix=mount`
    prints)."""
    path = os.path.normpath(mountpoint).strip("/")
    if not path:
        return "-.mount"
    out = []
    for i, ch in enumerate(path):
        if ch == "/":
            out.append("-")
        elif re.fullmatch(r"[A-Za-z0-9:_]", ch) or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode()))
    return "".join(out) + ".mount"


def hotcache_program() -> str:
    """The hotcache next to the interpreter that runs apply, when root alone can change
    it, its interpreter and hotcache's code (system/units.py); else RefusedError with
    the fix. A boot unit runs it as root at every boot."""
    from hotcache.provision.system.units import trusted_program

    return trusted_program(Path(sys.executable).parent / "hotcache",
                           Path(__file__).resolve().parents[1])


def unit_text(cache: str, mountpoint: str, state: Path, fstab: Path,
              program: str | None = None) -> str:
    from hotcache.provision.system.units import command

    mount = mount_unit(mountpoint)
    start = command(program or hotcache_program(), "restore", cache, "--yes",
                    "--state", str(state), "--fstab", str(fstab))
    return f"""# Written by hotcache apply; removed by hotcache teardown.
[Unit]
Description=hotcache: restore block cache {cache} (tables, registration, tunables)
DefaultDependencies=no
After=systemd-udev-settle.service systemd-remount-fs.service local-fs-pre.target
Wants=systemd-udev-settle.service
Before={mount} local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={start}

[Install]
WantedBy=local-fs.target
"""


def plan_unit(p, spec) -> None:
    """Queue writing and enabling the restore unit of `spec` if it is not as it should be."""
    directory = unit_dir()
    unit = directory / unit_name(spec.name)
    want = unit_text(spec.name, spec.filesystem.mountpoint, p.env.state.absolute(),
                     p.env.fstab.absolute())
    wants = directory / "local-fs.target.wants" / unit.name
    try:
        current = unit.read_text()
    except FileNotFoundError:
        current = None
    if current == want and wants.is_symlink():
        return

    def install(ctx) -> None:
        if ctx.runner.dry_run:
            return
        write_atomic(unit, want, 0o644)
        wants.parent.mkdir(parents=True, exist_ok=True)
        if not wants.is_symlink():
            wants.symlink_to(unit)
    p.do(f"install and enable {unit} (restores the cache at boot, before its mount)", install)


def remove_unit(p, cache: str) -> None:
    directory = unit_dir()
    unit = directory / unit_name(cache)
    wants = directory / "local-fs.target.wants" / unit.name
    if not (unit.exists() or wants.is_symlink()):
        return

    def remove(ctx) -> None:
        if ctx.runner.dry_run:
            return
        for path in (wants, unit):
            if path.is_symlink() or path.exists():
                path.unlink()
    p.do(f"remove the boot-time restore unit {unit}", remove)

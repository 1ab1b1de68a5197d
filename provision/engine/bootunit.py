"""The boot-time restore unit apply installs for each block cache whose backend declares
`restores_at_boot`: ordered before the cache's mount unit, it runs `hotcache restore
NAME` (restore.py). Units go to HOTCACHE_UNIT_DIR (default /etc/systemd/system), so tests
and trials never touch the host's /etc.

The unit waits for the cache's own devices through their systemd device units
(`Wants=` and `After=` dev-disk-by\\x2did-....device), not for the deprecated
systemd-udev-settle.service, which waits for every device of the machine and still
promises nothing about these. The wait is bounded twice: systemd gives up on a device
unit after its job timeout (DefaultDeviceTimeoutSec, 90 s by default) and, `Wants=` being
weak, starts the restore anyway; restore then waits its own bounded time
(restore.DEVICE_WAIT) and fails loudly, naming the missing device."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hotcache.provision.system import units

if TYPE_CHECKING:
    from hotcache.provision.engine.spec import CacheSpec
    from hotcache.provision.plan import RunContext


# What the unit needs of the engine's Planner and Env, as protocols: apply imports this
# module, so it cannot name apply's classes (not even for the type checker).
class UnitEnv(Protocol):
    @property
    def state(self) -> Path: ...
    @property
    def fstab(self) -> Path: ...


class UnitPlanner(Protocol):
    @property
    def env(self) -> UnitEnv: ...

    def do(self, summary: str, action: Callable[[RunContext], None]) -> None: ...

DEFAULT_UNIT_DIR = "/etc/systemd/system"


def unit_dir() -> Path:
    return Path(os.environ.get("HOTCACHE_UNIT_DIR") or DEFAULT_UNIT_DIR)


def unit_name(cache: str) -> str:
    return f"hotcache-restore-{cache}.service"


def path_unit(path: str, suffix: str) -> str:
    """systemd's unit name for a path (what `systemd-escape --path --suffix=SUFFIX`
    prints): slashes become dashes, and every byte outside [A-Za-z0-9:_.] (a leading dot
    too) becomes \\xNN."""
    path = os.path.normpath(path).strip("/")
    if not path:
        return f"-.{suffix}"
    out = []
    for i, ch in enumerate(path):
        if ch == "/":
            out.append("-")
        elif re.fullmatch(r"[A-Za-z0-9:_]", ch) or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode()))
    return "".join(out) + f".{suffix}"


def mount_unit(mountpoint: str) -> str:
    """systemd's unit name for a mountpoint."""
    return path_unit(mountpoint, "mount")


def device_unit(node: str) -> str:
    """systemd's unit name for a device node or link (/dev/disk/by-id/...): active once
    udev has announced the device with that link."""
    return path_unit(node, "device")


def device_paths(spec: CacheSpec) -> list[str]:
    """The device paths the spec names for cache `spec` (what restore waits for). A
    loop-backed image has none: restore attaches it itself."""
    return sorted({ref.path for ref in spec.devices().values() if ref.path})


def hotcache_program() -> str:
    """The hotcache next to the interpreter that runs apply, when root alone can change
    it, its interpreter and hotcache's code (system/units.py); else RefusedError with
    the fix. A boot unit runs it as root at every boot."""
    return units.trusted_program(Path(sys.executable).parent / "hotcache",
                                 Path(__file__).resolve().parents[1])


def unit_text(cache: str, mountpoint: str, state: Path, fstab: Path,
              program: str | None = None, *, devices: Sequence[str] = ()) -> str:
    mount = mount_unit(mountpoint)
    waits = " ".join(device_unit(d) for d in devices)
    wait_lines = f"Wants={waits}\nAfter={waits}\n" if waits else ""
    program = program or hotcache_program()
    start = units.command(program, "restore", cache, "--yes",
                          "--state", str(state), "--fstab", str(fstab))
    needs = mounts_for(mountpoint, [program, str(state), str(fstab)])
    return f"""# Written by hotcache apply; removed by hotcache teardown.
[Unit]
Description=hotcache: restore block cache {cache} (tables, registration, tunables)
DefaultDependencies=no
After=systemd-remount-fs.service local-fs-pre.target
{wait_lines}Before={mount} local-fs.target
RequiresMountsFor={needs}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={start}

[Install]
WantedBy=local-fs.target
"""


def mounts_for(mountpoint: str, paths: Sequence[str]) -> str:
    """A RequiresMountsFor= value: the restore needs the filesystems its program, the
    mapping and fstab live on (a separate /opt or /var is mounted by then, or the
    restore would fail at every boot). A path beneath the cache's own mountpoint is left
    out: the restore runs before that mount, which it brings back. Quoted as systemd
    reads the list (whitespace in quotes, `%` doubled: specifiers are expanded there)."""
    mp = mountpoint.rstrip("/") + "/"
    out = []
    for path in dict.fromkeys(paths):
        if path.startswith(mp):
            continue
        text = path.replace("%", "%%")
        if any(c.isspace() or c in "\"'\\" for c in text):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        out.append(text)
    return " ".join(out)


def plan_unit(p: UnitPlanner, spec: CacheSpec) -> None:
    """Queue writing and enabling the restore unit of `spec` if it is not as it should be."""
    directory = unit_dir()
    unit = directory / unit_name(spec.name)
    want = unit_text(spec.name, spec.filesystem.mountpoint, p.env.state.absolute(),
                     p.env.fstab.absolute(), devices=device_paths(spec))
    wants = directory / "local-fs.target.wants" / unit.name
    if units.is_installed(unit, want, wants):
        return

    def install(ctx: RunContext) -> None:
        if not ctx.runner.dry_run:
            units.install(unit, want, wants)
    p.do(f"install and enable {unit} (restores the cache at boot, before its mount)", install)


def remove_unit(p: UnitPlanner, cache: str) -> None:
    directory = unit_dir()
    unit = directory / unit_name(cache)
    wants = directory / "local-fs.target.wants" / unit.name
    if not (unit.exists() or wants.is_symlink()):
        return

    def remove(ctx: RunContext) -> None:
        if ctx.runner.dry_run:
            return
        for path in (wants, unit):
            if path.is_symlink() or path.exists():
                path.unlink()
    p.do(f"remove the boot-time restore unit {unit}", remove)

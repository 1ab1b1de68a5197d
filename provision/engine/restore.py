"""Bring caches back after a boot: `hotcache restore`.

The kernel keeps neither raw dm-cache tables nor bcache's tunables (sequential_cutoff,
writeback_percent) across a reboot. The mapping records each cache's spec, so restoring
is an apply of those recorded specs: the plan looks at what the boot left (bcache already
registered by udev, LVs already active, dm tables gone) and does only what is missing.

apply installs one systemd unit per block cache, ordered before the cache's mount unit,
that runs `hotcache restore NAME`. Units go to HOTCACHE_UNIT_DIR (default
/etc/systemd/system), so tests and trials never touch the host's /etc.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from hotcache.provision.system.atomic import write_atomic

DEFAULT_UNIT_DIR = "/etc/systemd/system"
DEVICE_WAIT = 60.0     # seconds restore waits for a cache's devices to appear at boot


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


def recorded_spec(state_path: Path, names: list[str] | None = None):
    """The HostSpec made of the specs the mapping recorded (all caches, or `names`)."""
    from hotcache.provision import mapping
    from hotcache.provision.errors import UsageError
    from hotcache.provision.engine.spec import CacheSpec, HostSpec

    data = mapping.load(state_path)
    chosen = names or list(data["caches"])
    unknown = [n for n in chosen if n not in data["caches"]]
    if unknown:
        raise UsageError(f"no cache named {', '.join(unknown)} in the mapping {state_path} "
                         f"(known: {', '.join(data['caches']) or 'none'})")
    caches = []
    for name in chosen:
        recorded = data["caches"][name].get("spec")
        if not recorded:
            raise UsageError(f"{name}: the mapping {state_path} holds no spec for it; "
                             "run `hotcache apply SPEC` once")
        caches.append(CacheSpec.model_validate(without_wipe(recorded)))
    return HostSpec(caches=caches)


def without_wipe(spec: dict) -> dict:
    """`wipe: true` was consent for the first build; a restore never replays it."""
    out = dict(spec)
    for role in ("origin", "cache"):
        if isinstance(out.get(role), dict):
            out[role] = {k: v for k, v in out[role].items() if k != "wipe"}
    return out


def wait_for_devices(host) -> None:
    """At boot, disks (and udev's by-id links) can appear late: wait a bounded time."""
    from hotcache.provision.block import identity
    from hotcache.provision.system.waits import wait_until

    paths = [ref.path for c in host.caches for ref in c.devices().values() if ref.path]

    def present():
        missing = [p for p in paths if identity.kname(p) is None]
        return not missing, f"missing {', '.join(missing)}"
    wait_until("the cache devices to appear", present, timeout=DEVICE_WAIT, interval=1.0)


def plan_restore(env, names: list[str] | None = None):
    from hotcache.provision.engine.apply import plan_apply

    host = recorded_spec(env.state, names)
    wait_for_devices(host)
    _load_modules(env.runner, host)
    return plan_apply(host, env, restoring=True)


def _load_modules(runner, host) -> None:
    """Kernel modules the recorded backends need (a fresh boot may not have them yet)."""
    modules = {"bcache": ["bcache"], "dm-cache": ["dm-cache", "dm-cache-smq"],
               "lvmcache": ["dm-cache", "dm-cache-smq"]}
    wanted = sorted({m for c in host.caches for m in modules.get(c.backend, [])})
    if wanted and not runner.dry_run:
        runner.run(["modprobe", "-a", *wanted], check=False)

"""The fail-over watcher's systemd service, which apply installs beside the restore
units when a cache's backend can fail over to its origin (`Backend.failover_device`):
one service for the host, running `hotcache failover --watch` (tend/failover.py),
started at boot once the local filesystems (and so every restore unit) are up, and
restarted if it ever stops. Its file goes to HOTCACHE_UNIT_DIR like the restore units."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hotcache.provision.engine.bootunit import DEFAULT_UNIT_DIR, hotcache_program, unit_dir
from hotcache.provision.system import units

if TYPE_CHECKING:
    # apply imports this module: the backends' protocol of its Planner, not the class
    from hotcache.provision.backends.parts.contract import Planner
    from hotcache.provision.plan import RunContext

UNIT = "hotcache-failover.service"


def unit_text(state: Path, program: str | None = None) -> str:
    start = units.command(program or hotcache_program(), "failover", "--watch", "--state", str(state))
    return f"""# Written by hotcache apply.
[Unit]
Description=hotcache: switch a cache whose SSD failed to its origin, under the mounted filesystem
After=local-fs.target
Wants=local-fs.target

[Service]
Type=simple
ExecStart={start}
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def plan_unit(p: Planner) -> None:
    """Queue writing, enabling and (where systemd runs) starting the watcher's service,
    if it is not as it should be."""
    directory = unit_dir()
    unit = directory / UNIT
    want = unit_text(p.env.state.absolute())
    wants = directory / "multi-user.target.wants" / UNIT
    if units.is_installed(unit, want, wants):
        return

    def install(ctx: RunContext) -> None:
        if ctx.runner.dry_run:
            return
        units.install(unit, want, wants)
        if directory == Path(DEFAULT_UNIT_DIR) and Path("/run/systemd/system").is_dir():
            ctx.runner.run(["systemctl", "daemon-reload"])
            ctx.runner.run(["systemctl", "restart", UNIT])
    p.do(f"install, enable and start {unit} (switches a cache whose SSD failed to its "
         "origin, under the mounted filesystem)", install)


def plan_removal(p: Planner) -> None:
    """Queue stopping, disabling and removing the watcher's service (the teardown of the
    last cache that can fail over), if it is installed."""
    directory = unit_dir()
    unit = directory / UNIT
    wants = directory / "multi-user.target.wants" / UNIT
    if not (unit.exists() or wants.is_symlink()):
        return
    try:
        text = unit.read_text()
    except OSError:
        text = None
    if text is not None and text != unit_text(p.env.state.absolute()):
        return      # it watches another mapping (another --state): not this one's to remove

    def remove(ctx: RunContext) -> None:
        if ctx.runner.dry_run:
            return
        systemd = directory == Path(DEFAULT_UNIT_DIR) and Path("/run/systemd/system").is_dir()
        if systemd:
            ctx.runner.run(["systemctl", "stop", UNIT], check=False)
        for path in (wants, unit):
            if path.is_symlink() or path.exists():
                path.unlink()
        if systemd:
            ctx.runner.run(["systemctl", "daemon-reload"])
    p.do(f"stop and remove {unit} (no cache left that can fail over to its origin)", remove)

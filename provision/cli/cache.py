"""CLI commands for block-cache upkeep (restore after boot): registered on the main app."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hotcache.provision.cli.common import (DryRunOpt, FstabOpt, JsonOpt, StateOpt, YesOpt,
                                           carry_out, holding_state, make_env, need_root,
                                           refresh_index)
from hotcache.provision.errors import HotcacheError


def register(app: typer.Typer) -> None:
    app.command()(restore)


def restore(
    names: Optional[List[str]] = typer.Argument(None, help="Caches to restore (default: all)."),
    yes: bool = YesOpt, dry_run: bool = DryRunOpt, as_json: bool = JsonOpt,
    state: Optional[Path] = StateOpt, fstab: Optional[Path] = FstabOpt,
) -> None:
    """Bring the caches in the mapping back after a boot: recreate dm-cache tables,
    register bcache devices, activate LVs, write back the tunables the kernel forgot
    (sequential_cutoff, ...), and mount. It is what the unit `apply` installs runs at
    boot; running it on a healthy host changes nothing."""
    # start-up: the engine and the mapping's pydantic models, for this command only
    from hotcache.provision.engine import restorelog
    from hotcache.provision.engine.restore import plan_restore, restored_names

    need_root("restore")
    env = make_env(state, fstab, dry_run=dry_run)
    try:
        with holding_state(env, f"restore {' '.join(names or [])}".strip()):
            carry_out(plan_restore(env, names or None), env, "restore", yes=yes,
                      as_json=as_json, done="run; caches restored", dry_run=dry_run)
    except HotcacheError as exc:
        # Loud at boot: doctor and the metrics report it until a restore succeeds.
        if not dry_run:
            restorelog.record(restored_names(env, names), str(exc))
            refresh_index(state, fstab)
        raise
    if not dry_run:
        restorelog.record(restored_names(env, names), None)
        refresh_index(state, fstab)

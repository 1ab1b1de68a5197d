"""CLI commands for block-cache upkeep (restore after boot): registered on the main app."""

from __future__ import annotations

from typing import List, Optional

import typer


def register(app) -> None:
    from .cli import FstabOpt, JsonOpt, StateOpt, YesOpt

    @app.command()
    def restore(
        names: Optional[List[str]] = typer.Argument(None, help="Caches to restore (default: all)."),
        yes: bool = YesOpt, as_json: bool = JsonOpt,
        state: Optional[str] = StateOpt, fstab: Optional[str] = FstabOpt,
    ):
        """Bring the caches in the mapping back after a boot: recreate dm-cache tables,
        register bcache devices, activate LVs, write back the tunables the kernel forgot
        (sequential_cutoff, ...), and mount. It is what the unit `apply` installs runs at
        boot; running it on a healthy host changes nothing."""
        from pathlib import Path

        from .cli import _run_steps, confirm, console, emit, make_env, need_root, show_plan
        from .restore import plan_restore

        need_root("restore")
        env = make_env(state and Path(state), fstab and Path(fstab))
        result = plan_restore(env, names or None)
        if result.empty:
            if as_json:
                return emit({"changed": False, **result.to_json()})
            return show_plan(result, "restore")
        if not as_json:
            show_plan(result, "restore")
        confirm(f"restore: run {len(result.steps)} steps", yes)
        _run_steps(result, env, quiet=as_json)
        if as_json:
            return emit({"changed": True, **result.to_json()})
        console().print(f"[green]done[/]: {len(result.steps)} steps; caches restored")

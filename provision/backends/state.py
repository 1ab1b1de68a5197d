"""Backend facts kept in the mapping entry (`backend_state`): what a later apply, status,
restore or teardown must know but cannot read back from the devices alone."""

from __future__ import annotations

from typing import Callable

from hotcache.provision import mapping


def remember(p, summary: str, compute: Callable[[object], dict]) -> None:
    """Queue a step that merges compute(ctx) into the cache's backend_state."""

    def action(ctx) -> None:
        values = compute(ctx)
        if ctx.runner.dry_run:
            return
        with mapping.editing(p.env.state) as data:
            entry = data["caches"].setdefault(p.cache, {})
            entry.setdefault("backend_state", {}).update(values)

    p.do(summary, action)


def of(entry: dict | None) -> dict:
    return dict((entry or {}).get("backend_state") or {})

"""Backend facts kept in the mapping entry (`backend_state`): what a later apply, status,
restore or teardown must know but cannot read back from the devices alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

from hotcache.provision import mapping
from hotcache.provision.plan import Ref, RunContext
from hotcache.provision.records import STATES, BackendState, CacheEntry

if TYPE_CHECKING:
    from hotcache.provision.backends.parts.contract import Planner


def remember(p: Planner, summary: str, compute: Callable[[RunContext], dict[str, Any]], *,
             destructive_on: tuple[str | Ref, ...] = ()) -> None:
    """Queue a step that merges compute(ctx) into the cache's backend_state;
    `destructive_on`: the devices compute writes over (Planner.do)."""

    def action(ctx: RunContext) -> None:
        values = compute(ctx)
        if ctx.runner.dry_run:
            return
        with mapping.editing(p.env.state) as data:
            entry = data["caches"][p.cache]     # recorded as building before any build step
            old = entry.backend_state.dump() if entry.backend_state else {}
            kind = STATES.get(entry.backend, BackendState)
            entry.backend_state = kind.model_validate({**old, **values})

    p.do(summary, action, destructive_on=destructive_on)


S = TypeVar("S", bound=BackendState)


def of(entry: CacheEntry | None, kind: type[S]) -> S:
    """The entry's backend_state as the backend's record (empty when none is recorded)."""
    st = entry.backend_state if entry is not None else None
    return st if isinstance(st, kind) else kind()

"""What a backend needs of the engine's objects, as protocols: backends sit below the
engine and type against these shapes, never against the engine's own classes.

The engine's Planner, Device and CacheSpec satisfy them structurally; mypy checks that
where the engine hands them to a backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hotcache.provision.block.blockdev import DeviceReport
    from hotcache.provision.plan import Plan, Ref, RunContext


class Labelled(Protocol):
    @property
    def label(self) -> str: ...


class Device(Protocol):
    """A spec device resolved against the host (the engine's Device). Plain members are
    the engine's own fields, of the same type; `ref` is a read-only property because a
    backend asks less of it (a label) than the engine's DeviceRef holds."""

    role: str
    node: str | Ref
    size: int
    report: DeviceReport | None
    fs: dict[str, str]
    proven: bool

    @property
    def ref(self) -> Labelled: ...


class CacheSpec(Protocol):
    """One cache of the spec (the engine's CacheSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def tunables(self) -> dict[str, int | str]: ...
    @property
    def effective_mode(self) -> str: ...


class Env(Protocol):
    @property
    def state(self) -> Path: ...


class Planner(Protocol):
    """Collects the steps of one cache (the engine's Planner). `env` is a read-only
    property: a backend reads only the mapping's path from the engine's Env."""

    cache: str
    plan: Plan
    refusals: list[str]
    restoring: bool
    released: set[str]

    @property
    def env(self) -> Env: ...

    def command(self, summary: str, argv: list[str | Ref], *, capture: str | None = None,
            destructive: bool = False, devices: tuple[str, ...] = (),
            check: Callable[[RunContext], None] | None = None) -> None: ...

    def do(self, summary: str, action: Callable[[RunContext], None], *,
           destructive_on: tuple[str | Ref, ...] = ()) -> None: ...

    def refuse(self, why: str) -> None: ...

"""Planned steps, queued and then executed in order.

A step is either an external program (an argv, shown exactly as it will run) or a small
action hotcache does itself (write the fstab entry, record the mapping), shown as a
sentence. A value that only exists once an earlier step ran, such as the node of a loop
device not attached yet, is a `Ref`: shown as a placeholder, filled in at run time.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

from hotcache.provision.system.runner import Runner


@dataclass(frozen=True)
class Ref:
    key: str
    display: str

    def __str__(self) -> str:
        return self.display


@dataclass
class RunContext:
    runner: Runner
    refs: dict[str, str] = field(default_factory=dict)

    def resolve(self, value: "str | Ref") -> str:
        return self.refs[value.key] if isinstance(value, Ref) else str(value)


@dataclass
class Step:
    cache: str
    summary: str
    argv: list[str | Ref] = field(default_factory=list)
    action: Callable[[RunContext], None] | None = None  # hotcache's own work
    capture: str | None = None                          # Ref key set from stdout
    destructive: bool = False
    # Run right before the program: raises when the device is no longer the one the
    # step was planned for (engine/recheck.py).
    check: Callable[[RunContext], None] | None = None

    def shown(self) -> str:
        if self.argv:
            return shlex.join(str(a) for a in self.argv)
        return f"(hotcache) {self.summary}"

    def run(self, ctx: RunContext) -> None:
        if self.check is not None:
            self.check(ctx)
        if self.argv:
            result = ctx.runner.run([ctx.resolve(a) for a in self.argv])
            if self.capture:
                ctx.refs[self.capture] = result.stdout.strip()
        if self.action is not None:
            self.action(ctx)

    def to_json(self) -> dict[str, Any]:
        return {"cache": self.cache, "summary": self.summary,
                "argv": [str(a) for a in self.argv] or None,
                "destructive": self.destructive}


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)      # things worth saying, not doing
    unchanged: list[str] = field(default_factory=list)  # caches already as specified
    touched: set[str] = field(default_factory=set)      # nodes a destructive step writes

    @property
    def empty(self) -> bool:
        return not self.steps

    def to_json(self) -> dict[str, Any]:
        return {"changes": len(self.steps), "steps": [s.to_json() for s in self.steps],
                "unchanged": self.unchanged, "notes": self.notes}

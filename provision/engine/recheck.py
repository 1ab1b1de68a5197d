"""Identity proven again right before each destructive step.

A plan proves each device once, when it is computed; then a confirmation prompt can wait
for hours and a teardown's flush can take one. Disks can be pulled, re-plugged and
renamed meanwhile, and a step that trusted the kernel name it was planned with would
erase whatever disk carries that name now. So every destructive step (wipefs,
make-bcache, mkfs, pvcreate, dd) carries the identity of each device it names as seen
at plan time, and checks it again just before it runs: the same device number, size,
by-id links, serial/WWN/partition UUID and loop image, and, unless an earlier step of
the plan wrote to it, the same signature. Any difference stops the step (and the plan)
before the program starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotcache.provision.block import identity
from hotcache.provision.block.host import Host
from hotcache.provision.errors import RefusedError
from hotcache.provision.plan import Ref, RunContext


@dataclass(frozen=True)
class Snapshot:
    """What a device is, as far as a later check can compare it."""

    node: str
    devnum: str
    size: int
    by_id: tuple[str, ...]
    ident: tuple[tuple[str, str], ...]
    loop_file: str | None
    sig: tuple[str | None, str | None]

    def describe(self) -> str:
        bits = [f"device {self.devnum}", f"{self.size} bytes"]
        bits += [f"{k} {v}" for k, v in self.ident]
        bits += list(self.by_id)
        if self.loop_file:
            bits.append(f"image {self.loop_file}")
        if self.sig[0]:
            bits.append(f"{self.sig[0]} {self.sig[1] or ''}".strip())
        return ", ".join(bits)


def snapshot(host: Host, node: str) -> Snapshot | None:
    """`node` as it is now; None when no block device is there."""
    name = identity.kname(node, host)
    if name is None:
        return None
    seen = identity.probe(name, host)
    return Snapshot(node, host.devnum(f"/dev/{name}"), seen.size, tuple(seen.by_id),
                    tuple(sorted((k, str(v)) for k, v in seen.identity.items())),
                    seen.loop_file, (seen.sig_type, seen.sig_uuid))


def differences(before: Snapshot, now: Snapshot | None, *, sig: bool) -> list[str]:
    if now is None:
        return [f"{before.node} is gone"]
    out = []
    for what, a, b in (("device number", before.devnum, now.devnum),
                       ("size", before.size, now.size),
                       ("by-id links", before.by_id, now.by_id),
                       ("identity", before.ident, now.ident),
                       ("loop image", before.loop_file, now.loop_file)):
        if a != b:
            out.append(f"{what} {_shown(b)}, planned with {_shown(a)}")
    # A signature that was there must still be there; a blank device may have gained
    # one only through this plan's own steps, which `sig=False` says.
    if sig and before.sig[0] and now.sig != before.sig:
        out.append(f"signature {_sig(now.sig)}, planned with {_sig(before.sig)}")
    return out


def _sig(sig: tuple[str | None, str | None]) -> str:
    return " ".join(v for v in sig if v) or "none"


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(_shown(v) if isinstance(v, tuple) else str(v)
                         for v in value if v) or "none"
    return str(value) if value is not None else "none"


class Guard:
    """The check one destructive step runs before its program."""

    def __init__(self, host: Host, cache: str, summary: str, before: list[Snapshot],
                 touched: set[str], loops: list[Ref]):
        self.host, self.cache, self.summary = host, cache, summary
        self.before, self.touched, self.loops = before, touched, loops

    def __call__(self, ctx: RunContext) -> None:
        problems = []
        for snap in self.before:
            now = snapshot(self.host, snap.node)
            problems += [f"{snap.node}: {d}" for d in
                         differences(snap, now, sig=snap.node not in self.touched)]
        for ref in self.loops:
            node = ctx.refs.get(ref.key)
            image = ref.key.removeprefix("loop:")
            if node is None:
                continue    # a dry run: nothing was attached
            backing = identity.hardware(identity.kname(node, self.host) or "", self.host)[3] \
                if identity.kname(node, self.host) else None
            if backing != image:
                problems.append(f"{node} serves {backing or 'no image'}, not {image}")
        if problems:
            raise RefusedError(
                f"{self.cache}: stopped before `{self.summary}`: the device is not the one "
                "the plan was made for:\n" + "\n".join(f"  {p}" for p in problems),
                hint="nothing was run on it; check the disks (`hotcache devices`, "
                     "`hotcache status`) and plan again")


def guard(host: Host, cache: str, summary: str, argv: list[str | Ref], touched: set[str]) -> Guard:
    """A Guard for a step about to be queued; `touched`: nodes an earlier destructive
    step of the plan already wrote to (their signature is expected to change)."""
    before, loops = [], []
    for arg in argv:
        if isinstance(arg, Ref):
            if arg.key.startswith("loop:"):
                loops.append(arg)
            continue
        if isinstance(arg, str) and arg.startswith("/dev/") and host.exists(arg):
            snap = snapshot(host, arg)
            if snap is not None:
                before.append(snap)
    return Guard(host, cache, summary, before, set(touched), loops)

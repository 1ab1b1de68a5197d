"""Bring caches back after a boot: `hotcache restore`.

The kernel keeps neither raw dm-cache tables nor bcache's tunables (sequential_cutoff,
writeback_percent) across a reboot. The mapping records each cache's spec, so restoring
is an apply of those recorded specs: the plan looks at what the boot left (bcache already
registered by udev, LVs already active, dm tables gone) and does only what is missing.

apply installs one systemd unit per block cache (bootunit.py), ordered before the
cache's mount unit, that runs `hotcache restore NAME`.
"""

from __future__ import annotations

from pathlib import Path

from hotcache.provision import mapping
from hotcache.provision.backends import BACKENDS
from hotcache.provision.block import identity
from hotcache.provision.block.host import Host
from hotcache.provision.engine import onorigin
from hotcache.provision.engine.apply import Env, plan_apply
from hotcache.provision.engine.spec import CacheSpec, HostSpec, without_wipe
from hotcache.provision.errors import HotcacheError, UsageError
from hotcache.provision.plan import Plan
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.waits import wait_until

DEVICE_WAIT = 60.0     # seconds restore waits for a cache's devices to appear at boot


def recorded_spec(state_path: Path, names: list[str] | None = None) -> HostSpec:
    """The HostSpec made of the specs the mapping recorded (all caches, or `names`)."""

    data = mapping.load(state_path)
    chosen = names or list(data["caches"])
    unknown = [n for n in chosen if n not in data["caches"]]
    if unknown:
        raise UsageError(f"no cache named {', '.join(unknown)} in the mapping {state_path} "
                         f"(known: {', '.join(data['caches']) or 'none'})")
    caches = []
    for name in chosen:
        recorded = data["caches"][name].spec
        if not recorded:
            raise UsageError(f"{name}: the mapping {state_path} holds no spec for it; "
                             "run `hotcache apply SPEC` once")
        caches.append(CacheSpec.model_validate(without_wipe(recorded)))
    return HostSpec(caches=caches)


def restored_names(env: Env, names: list[str] | None) -> list[str]:
    """The caches a restore of `names` (None: all) is about; [] when the mapping cannot
    be read (its own error says so)."""
    if names:
        return list(names)
    try:
        return list(mapping.load(env.state)["caches"])
    except HotcacheError:
        return []


def wait_for_devices(spec: HostSpec, host: Host) -> None:
    """At boot, disks (and udev's by-id links) can appear late: wait a bounded time."""

    paths = [ref.path for c in spec.caches for ref in c.devices().values() if ref.path]

    def present() -> tuple[bool, str]:
        missing = [p for p in paths if identity.kname(p, host) is None]
        return not missing, f"missing {', '.join(missing)}"
    wait_until("the cache devices to appear", present, timeout=DEVICE_WAIT, interval=1.0)


def plan_restore(env: Env, names: list[str] | None = None) -> Plan:
    """A cache running on its origin since its SSD failed is brought back on the origin
    alone (onorigin.py), never on the failed SSD; the others as they were built."""
    caches = mapping.load(env.state)["caches"]
    moved = [n for n in (names or caches) if n in caches and caches[n].on_origin]
    rest = [n for n in (names or caches) if n not in moved]
    if rest or not moved:
        spec = recorded_spec(env.state, rest or names)
        wait_for_devices(spec, env.host)
        _load_modules(env.runner, spec)
        plan = plan_apply(spec, env, restoring=True)
    else:
        plan = Plan()
    for name in moved:
        onorigin.plan_restore(env, name, caches[name], plan)
    return plan


def _load_modules(runner: Runner, spec: HostSpec) -> None:
    """Kernel modules the recorded backends need (a fresh boot may not have them yet)."""
    wanted = sorted({m for c in spec.caches for m in BACKENDS[c.backend].modules})
    if wanted and not runner.dry_run:
        runner.run(["modprobe", "-a", *wanted], check=False)

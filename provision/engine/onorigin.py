"""A cache running on its origin since its SSD failed (the watcher switched it in place,
tend/failover.py; the mapping records `on_origin`).

- What status, doctor and the metrics say of it: "running on the origin since <time>:
  cache failed (<the kernel's words>)", with no dirty data at risk (the switch happens
  only then), and without a read of the failed SSD.
- What a boot does with it: the restore unit runs `hotcache restore NAME`, which for such
  a cache never loads a table on the failed SSD. It takes the failed cache apart while
  nothing is mounted from it (the backend's `drop_failed_cache`: for raw dm-cache, whose
  tables a boot dropped, the origin mapped as the switch left it, the filesystem past
  hotcache's header; for lvmcache lvm2 takes the cache volume off the inactive LV, which
  puts LVM's metadata right) and mounts the filesystem from the origin alone. While the
  filesystem is still mounted from the switched device, restore leaves it as it is.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hotcache.provision.backends import get as get_backend
from hotcache.provision.backends.parts import recorded
from hotcache.provision.block import blockdev
from hotcache.provision.engine.statusrow import CacheFailure
from hotcache.provision.plan import Plan
from hotcache.provision.records import CacheEntry
from hotcache.provision.system.waits import wait_until

if TYPE_CHECKING:
    from hotcache.provision.engine.apply import Env


def message(entry: CacheEntry) -> str | None:
    """The words status and the metrics use; None: the cache is not on its origin."""
    moved = entry.on_origin
    if moved is None:
        return None
    return f"running on the origin since {moved.since}: cache failed ({moved.said})"


def failure(entry: CacheEntry) -> CacheFailure | None:
    """status' CacheFailure of a cache switched to its origin (None: it is not)."""
    said = message(entry)
    if said is None or entry.on_origin is None:
        return None
    info = entry.devices.get("cache")
    path = (next(iter(info.by_id or []), None) or info.path or info.node) if info else None
    return {"device": path, "kernel": entry.on_origin.said, "dirty_bytes": 0,
            "message": f"{said}; no dirty data at risk: every write reached the origin",
            "on_origin_since": entry.on_origin.since}


DEVICE_WAIT = 60.0


def plan_restore(env: Env, name: str, entry: CacheEntry, plan: Plan) -> None:
    """Queue what a boot needs to mount cache `name`, on its origin since its SSD
    failed, from the origin alone (see the module's docstring)."""
    # start-up: status imports this module; the planner and the spec's pydantic models
    # only for a restore
    from hotcache.provision.engine.apply import FSTYPE, Planner, mount_options
    from hotcache.provision.engine.spec import CacheSpec, without_wipe

    host = env.host
    mp = os.path.normpath(entry.filesystem.mountpoint)
    p = Planner(env, name, plan)
    if blockdev.mount_at(host, mp) is not None:
        plan.notes.append(f"{name}: {message(entry)}; its filesystem is mounted at {mp}, "
                          "so restore leaves it as it is")
        return
    if not env.runner.dry_run:
        wait_until(f"the origin of {name} to appear",
                   lambda: (recorded.current_node(entry, "origin", host) is not None,
                            "not present"), timeout=DEVICE_WAIT, interval=1.0)
    origin = recorded.require(entry, "origin", host, cache=name).node
    backend = get_backend(entry.backend, host)
    left = backend.drop_failed_cache(p, entry, {"origin": origin})
    opts = mount_options(CacheSpec.model_validate(without_wipe(entry.spec)))
    if not os.path.isdir(mp):
        p.command(f"create mountpoint {mp}", ["mkdir", "--parents", mp])
    p.command(f"mount {name} on {mp} from its origin ({message(entry)})",
              ["mount", "-t", FSTYPE, "-o", ",".join(opts), left, mp])
    first = "" if backend.attaches_on_origin else \
        f"`hotcache teardown {name} --cache-failed` (it unmounts the filesystem), then "
    plan.notes.append(f"{name}: {message(entry)}. The failed SSD is never used again: "
                      f"{first}name a new SSD in {name}'s spec and `hotcache apply SPEC` "
                      "attaches a new cache to this filesystem")

"""Take a cache down without losing a byte: unmount, drop the boot entry, let the backend
flush and dismantle, optionally wipe, detach loop devices, forget it in the mapping."""

from __future__ import annotations

from hotcache.provision import mapping
from hotcache.provision.block import blockdev
from hotcache.provision.block import busy
from hotcache.provision.system import fstab
from hotcache.provision.backends import get as get_backend
from hotcache.provision.engine.apply import Env, Planner
from hotcache.provision.errors import RefusedError, UsageError
from hotcache.provision.engine.plan import Plan
from hotcache.provision.engine.status import current_node


def plan_teardown(name: str, env: Env, *, wipe: bool = False) -> Plan:
    data = mapping.load(env.state)
    entry = data["caches"].get(name)
    if entry is None:
        known = ", ".join(data["caches"]) or "none"
        raise UsageError(f"no cache named {name!r} in the mapping {env.state} (known: {known})",
                         hint="`hotcache status` lists the caches hotcache built")
    plan = Plan()
    p = Planner(env, name, plan)
    mp = entry.get("filesystem", {}).get("mountpoint")
    if mp and blockdev.mount_at(mp):
        users = busy.users_of(mp)
        if users:
            raise RefusedError(f"{mp} is busy, so {name} cannot be taken down:\n"
                               + "\n".join(f"  {u}" for u in users),
                               hint="stop those processes (training jobs, shells cd'ed "
                                    "into it) and run teardown again")
        p.run(f"flush and unmount {mp}", ["umount", mp])
    persisted = entry.get("persist", {}).get("fstab")
    if persisted:
        path = fstab.fstab_path(persisted)  # the file apply wrote, wherever it was
        if fstab.read_entry(path, name) is not None:
            p.do(f"remove the entry of {name} from {path}",
                 lambda ctx: fstab.set_entry(path, name, None))
    get_backend(entry["backend"]).dismantle(p, entry)
    for role, info in entry.get("devices", {}).items():
        node = current_node(entry, role)
        if node is None:
            continue
        if wipe:
            p.run(f"erase signatures on the {role} device {node} (--wipe)",
                  ["wipefs", "--all", node], destructive=True)
        if info.get("loop_file"):
            p.run(f"detach loop device {node} (image {info['loop_file']} is kept)",
                  ["losetup", "--detach", node])

    def forget(ctx):
        if ctx.runner.dry_run:
            return
        with mapping.editing(env.state) as state:
            state["caches"].pop(name, None)

    p.do(f"remove {name} from the mapping {env.state}", forget)
    return plan

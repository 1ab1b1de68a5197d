"""Take a cache down without losing a byte: unmount, drop the boot entry, let the backend
flush and dismantle, optionally wipe, detach loop devices, forget it in the mapping."""

from __future__ import annotations

import os

from hotcache.provision import mapping
from hotcache.provision.block import blockdev
from hotcache.provision.block import busy
from hotcache.provision.system import fstab
from hotcache.provision.backends import get as get_backend
from hotcache.provision.engine import images
from hotcache.provision.engine.apply import Env, Planner
from hotcache.provision.errors import RefusedError, UsageError
from hotcache.provision.engine.plan import Plan
from hotcache.provision.engine.status import current_node


def plan_teardown(name: str, env: Env, *, wipe: bool = False,
                  remove_images: bool = False) -> Plan:
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
        fs_uuid = entry.get("filesystem", {}).get("uuid")
        if fstab.has_marker(path, name):
            p.do(f"remove the entry of {name} from {path} (only a line that mounts its "
                 f"UUID on {mp} goes with its marker)",
                 lambda ctx: fstab.set_entry(path, name, None, fs_uuid, [mp]))
    get_backend(entry["backend"]).dismantle(p, entry)
    kept = []
    for role, info in entry.get("devices", {}).items():
        node = current_node(entry, role)
        image = info.get("loop_file")
        adopted = role == "origin" and (entry.get("backend_state") or {}).get("adopted")
        if node is not None and wipe and adopted:
            plan.notes.append(f"the origin LV {node} is not wiped: hotcache adopted it with "
                              "its data and did not create it")
        elif node is not None and wipe:
            p.run(f"erase signatures on the {role} device {node} (--wipe)",
                  ["wipefs", "--all", node], destructive=True)
        if node is not None and image:
            p.run(f"detach loop device {node} (image {image})", ["losetup", "--detach", node])
        if image and remove_images and os.path.exists(image):
            p.run(f"delete the image file {image} (--remove-images)", ["rm", "--", image],
                  destructive=True)
        elif image and os.path.exists(image):
            kept.append((role, image))
    for role, image in kept:
        plan.notes.append(_kept_note(name, entry, image, wiped=wipe))

    def forget(ctx):
        if ctx.runner.dry_run:
            return
        with mapping.editing(env.state) as state:
            state["caches"].pop(name, None)
            for role, image in kept:
                images.record(state, image, name, entry, role)

    p.do(f"remove {name} from the mapping {env.state}", forget)
    return plan


def _kept_note(name: str, entry: dict, image: str, *, wiped: bool) -> str:
    """What happens to a loop image that teardown keeps, and how to be rid of it."""
    if wiped:
        what = "kept, its signatures erased (--wipe)"
    elif entry.get("backend") == "none":
        what = ("kept with its filesystem and data; an apply naming it again mounts it "
                "again")
    else:
        what = (f"kept with the {entry.get('backend')} metadata and data on it; to build a "
                "cache on it again, give it `wipe: true` in the spec (its data is lost)")
    return (f"image {image} is {what}. `rm {image}` deletes it; `--remove-images` "
            "deletes a cache's images as part of the teardown")

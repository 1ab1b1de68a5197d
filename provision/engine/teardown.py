"""Take a cache down without losing a byte: unmount, let the backend flush and dismantle,
drop the boot entry, optionally wipe, detach loop devices, forget it in the mapping.

A cache that is not live (tables not loaded, backing device not registered: after a boot
before `hotcache restore`) cannot be flushed, so its teardown is refused: what it holds
(dirty blocks, the geometry that describes them) would be lost. `--forget` removes the
entry of a cache whose devices are gone for good, after saying what is lost.
`--cache-failed` takes apart a cache whose SSD the kernel reports failed: no flush (the
SSD cannot give its data back), the origin left with its filesystem; dirty data that
was on the SSD only is lost, and it goes ahead only with `--accept-loss` covering it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hotcache.provision import mapping
from hotcache.provision.backends import BACKENDS, block_cache
from hotcache.provision.backends.base import Backend
from hotcache.provision.backends.parts import recorded
from hotcache.provision.block import blockdev, busy, header
from hotcache.provision.system import fstab
from hotcache.provision.backends import get as get_backend
from hotcache.provision.engine import failoverunit, images, onorigin, reattach
from hotcache.provision.engine.bootunit import remove_unit
from hotcache.provision.engine.apply import Env, Planner
from hotcache.provision.engine.status import cache_failure
from hotcache.provision.errors import RefusedError, UsageError
from hotcache.provision.plan import Plan, RunContext
from hotcache.provision.records import CacheEntry
from hotcache.provision.system.sizes import parse_size


def _refuse_if_failed(name: str, entry: CacheEntry, env: Env,
                      seen: dict[str, str | None]) -> None:
    """A cache whose SSD failed cannot be flushed through it: its plain teardown (the
    command an admin tries first) and the restore it would otherwise point at both fail
    on the dead SSD. Say the command that works, with the loss to accept if any."""
    failed = onorigin.failure(entry) or cache_failure(entry, env.host, seen)
    if failed is None:
        return
    dirty = failed["dirty_bytes"]
    accept = "" if dirty == 0 else f" --accept-loss {'all' if dirty is None else dirty}"
    raise RefusedError(
        f"{failed['message']}. A plain teardown would flush through the failed SSD; "
        "nothing was changed",
        hint=f"`hotcache teardown {name} --cache-failed{accept}` takes the cache apart "
             "without it and leaves the origin with its filesystem"
             + ("" if dirty == 0 else " (the writes that reached the SSD only are lost)"))


def plan_teardown(name: str, env: Env, *, wipe: bool = False, forget: bool = False,
                  remove_images: bool = False, cache_failed: bool = False,
                  accept_loss: str | None = None) -> Plan:
    """The steps that take cache `name` down (or forget it), each device read once while
    planning."""
    with env.host.holding_probes():
        return _plan_teardown(name, env, wipe=wipe, forget=forget, remove_images=remove_images,
                              cache_failed=cache_failed, accept_loss=accept_loss)


def _plan_teardown(name: str, env: Env, *, wipe: bool, forget: bool, remove_images: bool,
                   cache_failed: bool, accept_loss: str | None) -> Plan:
    data = mapping.load(env.state)
    entry = data["caches"].get(name)
    if entry is None and name in reattach.detached(data):
        return _plan_detached(name, env, forget=forget)
    if entry is None:
        raise _unknown(name, data, env)
    _refuse_flags(name, wipe=wipe, forget=forget, detached=name in reattach.detached(data))
    backend = get_backend(entry.backend, env.host)
    seen = {role: recorded.current_node(entry, role, env.host) for role in entry.devices}
    why = backend.live(entry, seen)
    if forget:
        plan = _plan_forget(name, entry, env, why)
    elif cache_failed:
        if wipe:
            raise UsageError("--cache-failed keeps the origin's filesystem, so it cannot --wipe",
                             hint=f"`hotcache teardown {name} --cache-failed` alone")
        plan = _plan_failed(name, entry, env, seen, accept_loss)
    else:
        _refuse_if_failed(name, entry, env, seen)
        _refuse_if_not_live(name, why)
        # Every device is proven to be the recorded one before anything is touched.
        nodes = {role: recorded.require(entry, role, env.host, cache=name).node
                 for role in entry.devices}
        plan = _plan_live(name, entry, env, backend, nodes, wipe=wipe,
                          remove_images=remove_images)
    # The last cache that can fail over takes the fail-over watcher's service with it.
    watched = [n for n, e in data["caches"].items() if n != name and BACKENDS[e.backend].fails_over]
    if backend.fails_over and not watched:
        failoverunit.plan_removal(Planner(env, name, plan))
    return plan


def _unknown(name: str, data: dict[str, Any], env: Env) -> UsageError:
    """The error for a name the mapping does not hold, listing the names it does."""
    known = ", ".join(data["caches"]) or "none"
    return UsageError(f"no cache named {name!r} in the mapping {env.state} (known: {known})",
                      hint="`hotcache status` lists the caches hotcache built")


def _refuse_flags(name: str, *, wipe: bool, forget: bool, detached: bool) -> None:
    """--wipe is refused where it would erase what the teardown means to leave: with
    --forget (which touches no device), and on an origin kept, filesystem and all, when
    its failed SSD was taken off (`detached`)."""
    if wipe and forget:
        raise UsageError("--forget touches no device, so it cannot --wipe",
                         hint=f"`hotcache teardown {name} --forget` alone")
    if wipe and detached:
        raise RefusedError(f"{name}'s origin holds the filesystem kept when its failed SSD "
                           "was taken off (the new SSD's apply did not finish); --wipe would "
                           "erase it; nothing was changed",
                           hint=f"`hotcache teardown {name}` without --wipe keeps it")


def _refuse_if_not_live(name: str, why: str | None) -> None:
    """A cache that is not live cannot be flushed: `why` (the backend's answer) is the
    reason, and its teardown is refused rather than losing what the cache holds."""
    if why:
        raise RefusedError(
            f"{name} is not live: {why}. Its teardown would skip the flush and lose what "
            "the cache holds (dirty blocks in writeback, and what describes them); nothing "
            "was changed",
            hint=f"`hotcache restore {name}`, then `hotcache teardown {name}`. If its devices "
                 f"are gone for good, `hotcache teardown {name} --forget` removes the entry")


def _plan_live(name: str, entry: CacheEntry, env: Env, backend: Backend,
               nodes: dict[str, str | None], *, wipe: bool, remove_images: bool) -> Plan:
    """The teardown of a live cache whose devices are proven: unmount, flush and
    dismantle, boot entries, devices and images, the mapping entry."""
    plan = Plan()
    p = Planner(env, name, plan)
    mp = entry.filesystem.mountpoint
    mounted = blockdev.mount_at(env.host, mp) if mp else None
    if mounted:
        plan.notes += _shared_mount_notes(mp, busy.other_namespaces_holding(mounted.source_dev))
        _refuse_if_busy(name, mp)
        p.command(f"flush and unmount {mp}", ["umount", mp])
    # The backend flushes first: if that fails, the fstab entry, the unit, the cache set
    # and the mapping entry are all still there.
    backend.dismantle(p, entry, nodes)
    if backend.restores_at_boot:
        remove_unit(p, name)
    _remove_fstab_entry(p, name, entry)
    kept: list[tuple[str, str]] = []
    for role in entry.devices:
        image = _release_device(p, plan, backend, entry, role, nodes[role], wipe=wipe,
                                remove_images=remove_images)
        if image is not None:
            kept.append((role, image))
    for _role, image in kept:
        plan.notes.append(_kept_note(name, entry, image, wiped=wipe))
    _forget(p, name, env, entry, kept)
    return plan


def _shared_mount_notes(mp: str, held: list[str]) -> list[str]:
    """What to say when other mount namespaces hold the mount (`held`: who): the device
    stays in use after the unmount here, until they exit."""
    if not held:
        return []
    return [f"{mp} is also mounted in other mount namespaces (containers, sandboxes), "
            f"by {', '.join(held[:5])}: its device stays in use (a loop device stays "
            "attached) until they exit"]


def _release_device(p: Planner, plan: Plan, backend: Backend, entry: CacheEntry, role: str,
                    node: str | None, *, wipe: bool, remove_images: bool) -> str | None:
    """Queue what becomes of one device once the cache is dismantled (its signatures
    erased on --wipe, its loop device detached, its image deleted); returns the image
    it keeps, if any."""
    image = entry.devices[role].loop_file
    kept_why = backend.kept_on_wipe(entry, role, node) if wipe and node is not None \
        else None
    if kept_why:
        plan.notes.append(kept_why)
    elif node is not None and wipe:
        p.command(f"erase signatures on the {role} device {node} (--wipe; found by its "
                  "identity)",
                  ["wipefs", "--all", node], destructive=True)
        claim = backend.wipe_header(entry, role)
        if claim:
            host, at, (uuid, length) = p.env.host, node, claim

            def erase(ctx: RunContext) -> None:
                if not ctx.runner.dry_run:
                    header.erase(host, at, uuid, length)
            p.do(f"erase hotcache's header (this cache's UUID) from the {role} device "
                 f"{node} (--wipe)", erase)
    if node is not None and image:
        p.command(f"detach loop device {node} (image {image})", ["losetup", "--detach", node])
    fate = _image_fate(image, remove_images=remove_images,
                       exists=image is not None and os.path.exists(image))
    if fate == "delete" and image is not None:    # "delete" only for an image
        p.command(f"delete the image file {image} (--remove-images)", ["rm", "--", image],
                  destructive=True)
    return image if fate == "keep" else None


def _image_fate(image: str | None, *, remove_images: bool, exists: bool) -> str | None:
    """What teardown does with a device's loop image: "delete" it (--remove-images),
    "keep" it (then the mapping goes on knowing it as hotcache's), or nothing (None: no
    image, or none there any more)."""
    if not image or not exists:
        return None
    return "delete" if remove_images else "keep"


def _refuse_if_busy(name: str, mp: str) -> None:
    """Refused while a process uses the mountpoint, naming each one."""
    users = busy.users_of(mp)
    if users:
        raise RefusedError(f"{mp} is busy, so {name} cannot be taken down:\n"
                           + "\n".join(f"  {u}" for u in users),
                           hint="stop those processes (training jobs, shells cd'ed "
                                "into it) and run teardown again")


def _plan_failed(name: str, entry: CacheEntry, env: Env, seen: dict[str, str | None],
                 accept_loss: str | None) -> Plan:
    """Take apart a cache whose SSD failed, without it: unmount, let the backend drop
    the cache layer, leave the origin with its filesystem, forget the cache."""
    failed = onorigin.failure(entry) or cache_failure(entry, env.host, seen)
    if failed is None:
        raise RefusedError(
            f"the kernel reports nothing wrong with the SSD of {name}, and it answers reads; "
            "--cache-failed skips the flush, so it is only for a failed SSD; nothing was "
            "changed", hint=f"`hotcache teardown {name}` flushes the cache and takes it down")
    dirty = failed["dirty_bytes"]
    if dirty != 0:
        at_risk = "an unknown amount" if dirty is None else f"{dirty} bytes"
        try:
            accepted = None if accept_loss is None else (
                float("inf") if accept_loss == "all" else parse_size(accept_loss))
        except ValueError as exc:
            raise UsageError(f"--accept-loss {accept_loss}: {exc}",
                             hint="give a size such as 64M, or `all`") from exc
        if accepted is None or (dirty is None and accepted != float("inf")) \
                or (dirty is not None and accepted < dirty):
            raise RefusedError(
                f"{failed['message']}. Taking {name} apart loses {at_risk} of writes that "
                "reached the cache only; nothing was changed",
                hint=f"to accept that loss: `hotcache teardown {name} --cache-failed "
                     f"--accept-loss {'all' if dirty is None else dirty}`; then check the "
                     "filesystem on the origin (`xfs_repair -n`) before using it")
    backend = get_backend(entry.backend, env.host)
    origin = recorded.require(entry, "origin", env.host, cache=name).node
    plan = Plan()
    p = Planner(env, name, plan)
    plan.notes.append(failed["message"])
    mp = entry.filesystem.mountpoint
    mounted = blockdev.mount_at(env.host, mp) if mp else None
    if mounted:
        _refuse_if_busy(name, mp)
        p.command(f"unmount {mp}", ["umount", mp])
    left = backend.drop_failed_cache(p, entry, {"origin": origin})
    if backend.restores_at_boot:
        remove_unit(p, name)
    _remove_fstab_entry(p, name, entry)
    surviving = backend.surviving_state(entry)
    _forget(p, name, env, entry, [],
            detached=lambda state: reattach.record(state, name, entry, surviving))
    plan.notes.append(f"the filesystem (UUID {entry.filesystem.uuid}) is on {left}: "
                      f"`mount -o noatime UUID={entry.filesystem.uuid} {mp}` mounts it"
                      + ("" if dirty == 0 else "; run `xfs_repair -n` on it first, since "
                         "writes that were on the SSD only are lost")
                      + f". A new SSD: put it in, name it as the cache device in {name}'s "
                        "spec (same backend and origin) and run `hotcache apply SPEC`: the "
                        "new cache is attached to this filesystem, which is kept (warm-up "
                        "starts over)")
    return plan


def _plan_detached(name: str, env: Env, *, forget: bool) -> Plan:
    """A cache whose failed SSD was taken off, waiting for a new one: no device is
    hotcache's to take down; `--forget` drops the record."""
    if not forget:
        raise RefusedError(
            f"{name} has no cache any more: its failed SSD was taken off, and its origin "
            "keeps the filesystem, waiting for a new SSD; nothing was changed",
            hint=f"`hotcache apply SPEC` with a new SSD in {name}'s spec attaches a new "
                 f"cache; `hotcache teardown {name} --forget` drops the record (the origin "
                 "and its filesystem stay as they are)")
    plan = Plan()

    def drop(ctx: RunContext) -> None:
        if ctx.runner.dry_run:
            return
        with mapping.editing(env.state) as state:
            reattach.forget(state, name)
    Planner(env, name, plan).do(f"forget that {name} waits for a new SSD (the origin and "
                                "its filesystem stay as they are)", drop)
    return plan


def _remove_fstab_entry(p: Planner, name: str, entry: CacheEntry) -> None:
    persisted = entry.persist and entry.persist.fstab
    if persisted:
        path = fstab.fstab_path(persisted)  # the file apply wrote, wherever it was
        fs_uuid, mp = entry.filesystem.uuid, entry.filesystem.mountpoint
        if fstab.has_marker(path, name):
            p.do(f"remove the entry of {name} from {path} (only a line that mounts its "
                 f"UUID on {mp} goes with its marker)",
                 lambda ctx: fstab.set_entry(path, name, None, fs_uuid, [mp]))


def _forget(p: Planner, name: str, env: Env, entry: CacheEntry, kept: list[tuple[str, str]],
            detached: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Queue the step that removes the cache's entry (and records what outlives it: kept
    images, or, through `detached`, an origin waiting for a new SSD). A re-attach that did
    not finish left the record of the origin it started from: it goes with the entry."""
    def forget(ctx: RunContext) -> None:
        if ctx.runner.dry_run:
            return
        with mapping.editing(env.state) as state:
            state["caches"].pop(name, None)
            reattach.forget(state, name)
            for role, image in kept:
                images.record(state, image, name, entry, role)
            if detached is not None:
                detached(state)

    p.do(f"remove {name} from the mapping {env.state}", forget)


def _plan_forget(name: str, entry: CacheEntry, env: Env, why: str | None) -> Plan:
    """--forget: drop the entry, its fstab line and its unit; touch no device."""
    if why is None and block_cache(entry.backend):
        raise RefusedError(f"{name} is live, so --forget would leave a running cache that "
                           "hotcache no longer knows",
                           hint=f"`hotcache teardown {name}` flushes it and takes it down")
    plan = Plan()
    p = Planner(env, name, plan)
    plan.notes += lost(entry, why)
    _remove_fstab_entry(p, name, entry)
    remove_unit(p, name)
    _forget(p, name, env, entry, [])
    return plan


def _kept_note(name: str, entry: CacheEntry, image: str, *, wiped: bool) -> str:
    """What happens to a loop image that teardown keeps, and how to be rid of it."""
    if wiped:
        what = "kept, its signatures erased (--wipe)"
    elif not block_cache(entry.backend):
        what = ("kept with its filesystem and data; an apply naming it again mounts it "
                "again")
    else:
        what = (f"kept with the {entry.backend} metadata and data on it; to build a "
                "cache on it again, give it `wipe: true` in the spec (its data is lost)")
    return (f"image {image} is {what}. `rm {image}` deletes it; `--remove-images` "
            "deletes a cache's images as part of the teardown")


def lost(entry: CacheEntry, why: str | None) -> list[str]:
    """What forgetting the entry loses, said before it is done."""
    out = [f"not live: {why}"] if why else []
    if entry.mode == "writeback":
        out.append("the cache was in writeback: dirty blocks still on the SSD will never "
                   "reach the origin, so the filesystem on the origin may be incomplete")
    backend = BACKENDS.get(entry.backend)
    if backend is not None:
        out += backend.forget_loses(entry)
    for role, info in entry.devices.items():
        out.append(f"the record of its {role} device, {recorded.describe_recorded(info)}, "
                   "which hotcache then treats as foreign")
    return [f"--forget loses {x}" for x in out]

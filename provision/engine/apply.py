"""spec -> plan -> apply, and teardown: the provisioning engine.

The plan is computed from what is really on the host, so every run converges: a second
apply of the same spec finds nothing to do, and an apply killed between steps picks up
where it stopped. The mapping entry is written (state `building`, with the filesystem
UUID it is about to create) before anything destructive, so a re-run recognises its own
half-built devices instead of refusing them as foreign.
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hotcache.provision import mapping
from hotcache.provision.backends.parts import recorded
from hotcache.provision.block import blockdev, busy, header, identity
from hotcache.provision.block.host import Host
from hotcache.provision.system import fstab
from hotcache.provision.backends import BACKENDS, backend_report, get as get_backend
from hotcache.provision.backends.base import Backend, Signature
from hotcache.provision.errors import HotcacheError, KernelUnsupported, ProbeFailed, RefusedError
from hotcache.provision.engine import failoverunit, images, owners, reattach, recheck
from hotcache.provision.plan import Plan, Ref, RunContext, Step
from hotcache.provision.records import (STATES, BackendState, CacheEntry, DeviceRecord,
                                        EntryState, Filesystem, Persist)
from hotcache.provision.system.clock import now
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.users import parse_owner
from hotcache.provision.engine import bootunit
from hotcache.provision.engine.spec import (CacheSpec, DeviceRef, HostSpec,
                                            without_wipe)

FSTYPE = "xfs"
# Programs that create or erase: a step running one is a build, which restore never does.
BUILDS = frozenset({"wipefs", "make-bcache", "mkfs.xfs", "pvcreate", "vgcreate", "vgextend",
                    "lvcreate", "lvconvert", "dd", "truncate"})
NEW_FS_UUID = "NEW-UUID"     # in a plan only shown (dry run): the UUID apply will draw


@dataclass
class Env:
    runner: Runner
    state: Path
    fstab: Path
    # Every read of the machine while planning goes through it (the real host on
    # `runner`, unless a test hands a fake one).
    host: Host = None  # type: ignore[assignment]
    # A plan only shown (`plan`, `--dry-run`): nothing is drawn at random, so two plans of
    # the same spec on the same host are the same.
    preview: bool = False

    def __post_init__(self) -> None:
        if self.host is None:
            self.host = Host(self.runner)


@dataclass
class Device:
    """A spec device reference, resolved against the host."""

    role: str
    ref: DeviceRef
    node: "str | Ref"
    present: bool                    # the block device exists now
    size: int
    report: blockdev.DeviceReport | None = None
    fs: dict[str, str] = field(default_factory=dict)      # blkid's TYPE/UUID/LABEL
    image_signatures: list[dict[str, Any]] = field(default_factory=list)
    image_data: int = 0              # bytes an existing loop image holds (allocated)
    # Identity proven to be the device the mapping entry recorded (by-id, serial, WWN,
    # partition UUID, loop image, hotcache's signature): only then can it be "ours".
    proven: bool = False


class Planner:
    """Collects steps for one cache, and the refusals found on the way."""

    def __init__(self, env: Env, cache: str, plan: Plan, *, restoring: bool = False):
        self.env, self.cache, self.plan = env, cache, plan
        self.restoring = restoring      # `hotcache restore`: bring back, never build
        self.refusals: list[str] = []
        self.start = len(plan.steps)
        self.known_images: set[str] = set()   # image files the mapping says hotcache made
        # Devices of a cache the mapping records as built, proven its own (backend.owns):
        # they hold its data, so nothing destructive is ever queued on them.
        self.own_devices: set[str] = set()
        # Mountpoints a step of the backend's unmounts (a dead mount of a device the
        # kernel stopped): the mount is planned as if nothing were mounted there.
        self.released: set[str] = set()

    def command(self, summary: str, argv: list[str | Ref], *, capture: str | None = None,
            destructive: bool = False, devices: tuple[str, ...] = (),
            check: Callable[[RunContext], None] | None = None) -> None:
        """Queue a program. A destructive step proves again, right before it runs, each
        device it names in `argv` or `devices` (those it acts on without naming them, as
        lvm2 commands name a VG); `check` is the backend's own re-check (LVM UUIDs)."""
        building = destructive or str(argv[0]) in BUILDS
        if self.restoring and building:
            self._refuse_building(summary, shlex.join(str(a) for a in argv))
            return
        guard = None
        if destructive:
            proven, guard = self._proven(summary, argv, devices)
            if not proven:
                return
        self.plan.steps.append(Step(self.cache, summary, argv, capture=capture,
                                    destructive=destructive, check=_both(guard, check)))

    def do(self, summary: str, action: Callable[[RunContext], None], *,
           destructive_on: tuple[str | Ref, ...] = ()) -> None:
        """Queue hotcache's own work; `destructive_on`: the devices it writes over, each
        proven again right before it runs, as a destructive command's."""
        guard = None
        if destructive_on:
            if self.restoring:
                self._refuse_building(summary, "hotcache's own write")
                return
            proven, guard = self._proven(summary, list(destructive_on), ())
            if not proven:
                return
        self.plan.steps.append(Step(self.cache, summary, action=action,
                                    destructive=bool(destructive_on), check=guard))

    def _refuse_building(self, summary: str, shown: str) -> None:
        # Restore re-assembles what is there; whatever it would have to create or
        # erase means something recorded is missing, which the backend names.
        self.refuse(f"{self.cache}: restore would have to build ({summary}: `{shown}`); "
                    "restore never builds or erases. Something the mapping records is "
                    f"missing: `hotcache status {self.cache}` names it")

    def _proven(self, summary: str, argv: list[str | Ref], devices: tuple[str, ...]
                ) -> tuple[bool, Callable[[RunContext], None] | None]:
        """Whether a destructive step may be queued (never on this cache's own devices),
        and the check that proves its devices again right before it runs."""
        hit = sorted(a for a in argv if isinstance(a, str) and a in self.own_devices)
        if hit:
            self.refuse(f"{self.cache}: apply would erase {', '.join(hit)} ({summary}), which "
                        "holds this cache's own data: the mapping records it as built, so "
                        "something it records is missing. hotcache never rebuilds a built "
                        f"cache over its own devices: `hotcache status {self.cache}` names "
                        "what is missing")
            return False, None
        touched = self.plan.touched
        guard = recheck.guard(self.env.host, self.cache, summary, [*argv, *devices], touched)
        touched.update(a for a in argv if isinstance(a, str) and a.startswith("/dev/"))
        return True, guard

    def refuse(self, why: str) -> None:
        self.refusals.append(why)

    @property
    def changed(self) -> bool:
        return len(self.plan.steps) > self.start


def _both(*checks: Callable[[RunContext], None] | None) -> Callable[[RunContext], None] | None:
    """One step check that runs each given check in turn (None when there is none)."""
    given = [c for c in checks if c is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def each(ctx: RunContext) -> None:
        for check in given:
            check(ctx)
    return each


def mount_options(spec: CacheSpec) -> list[str]:
    """noatime always; nosuid,nodev unless the spec says nosuid_nodev: false."""
    safe = ["nosuid", "nodev"] if spec.filesystem.nosuid_nodev else []
    return list(dict.fromkeys(["noatime", *safe, *spec.filesystem.options]))


def fstab_options(spec: CacheSpec) -> list[str]:
    """The mount options plus what systemd reads: `nofail` and a bounded device wait (a
    late disk never drops the host into emergency mode) and, for a cache restored at
    boot, `x-systemd.requires=` its restore unit: Requires= and After=, so a restore that
    failed, was masked or never ran stops the mount, and the bare origin (a raw dm-cache
    built before hotcache's origin header shows the same filesystem UUID, stale) is never
    mounted in the cache's place."""
    requires = [f"x-systemd.requires={bootunit.unit_name(spec.name)}"] \
        if BACKENDS[spec.backend].restores_at_boot else []
    return [*mount_options(spec), "nofail", *requires,
            f"x-systemd.device-timeout={spec.filesystem.device_timeout}s"]


def fs_label(spec: CacheSpec) -> str:
    return spec.filesystem.label or spec.name[:12]


# --- resolving devices ------------------------------------------------------------

def resolve(p: Planner, role: str, ref: DeviceRef, roots: set[str]) -> Device:
    host = p.env.host
    if ref.loop is None:
        path = host.realpath(ref.file)
        rep = blockdev.report(host, path, roots=roots, strict=False)
        return Device(role, ref, path, True, rep.size, rep, _fs(host, path, rep))
    image = ref.loop.file
    node = blockdev.loop_for_file(host, image)
    held = _image_data(image)
    if os.path.exists(image) and os.path.getsize(image) != ref.loop.bytes:
        p.plan.notes.append(f"{p.cache}.{role}: image {image} is "
                            f"{os.path.getsize(image) / 2**20:.0f} MiB, the spec says "
                            f"{ref.loop.size}; it is used at its present size (hotcache does "
                            "not resize an existing image)")
    if node:
        rep = blockdev.report(host, node, roots=roots, strict=False)
        return Device(role, ref, node, True, rep.size, rep, _fs(host, node, rep),
                      image_data=held)
    placeholder = Ref(f"loop:{image}", f"<loop device of {image}>")
    if os.path.exists(image):
        size = os.path.getsize(image)
        sigs = blockdev.signatures(host, image)
        fs = blockdev.fs_identity(host, image)
    else:
        size, sigs, fs = ref.loop.bytes, [], {}
        p.command(f"create sparse image {image} ({ref.loop.size})",
              ["truncate", "--size", str(ref.loop.bytes), image])
    p.command(f"attach {image} as a loop device",
          ["losetup", "--find", "--show", image], capture=placeholder.key)
    return Device(role, ref, placeholder, False, size, None, fs, sigs, image_data=held)


def _fs(host: Host, node: str, rep: blockdev.DeviceReport) -> dict[str, str]:
    """blkid's view of the device. When blkid cannot read a device that is refused anyway
    (root, mounted, held), the refusal, not the failed probe, is what is said."""
    try:
        return blockdev.fs_identity(host, node)
    except ProbeFailed:
        if rep.hard_problems():
            return {}
        raise


def _image_data(image: str) -> int:
    """Bytes the image file really holds (allocated blocks): 0 for a missing file or a
    sparse one nothing was written to, such as the one an interrupted apply created."""
    try:
        st = os.stat(image)
    except FileNotFoundError:
        return 0
    return st.st_blocks * 512 if st.st_size else 0


def resolve_recorded(p: Planner, role: str, ref: DeviceRef, entry: CacheEntry,
                     roots: set[str]) -> Device | None:
    """A device of a cache already in the mapping, found by its recorded identity, never
    by the name in the spec; None (with a refusal) when it cannot be proven."""
    found = recorded.locate(entry, role, p.env.host, cache=p.cache)
    at = f"{p.cache}.{role}"
    if found.problem:
        p.refuse(f"{at}: {found.problem}")
        return None
    if found.moved:
        p.plan.notes.append(found.moved)
    seen = found.seen            # the recorded device as it is now; found.node is its node
    if seen is None:
        info = entry.devices[role]
        if ref.loop is not None and info.loop_file == os.path.realpath(ref.loop.file):
            dev = resolve(p, role, ref, roots)   # the image, attached again
            dev.proven = True
            return dev
        p.refuse(f"{at}: the device it was built on, {recorded.describe_recorded(info)}, is "
                 "not present under any name")
        return None
    named = _named_now(p.env.host, ref)
    if named != seen.node:
        info = entry.devices[role]
        same_ref = ref.path == info.path if ref.path else \
            os.path.realpath(ref.file) == info.loop_file
        if not same_ref:
            p.refuse(f"{at}: the spec names {ref.label} ({named or 'not present'}), but "
                     f"{p.cache} was built on {seen.describe()}; moving a cache to "
                     f"other devices needs `hotcache teardown {p.cache}` first")
            return None
        if not found.moved:
            p.plan.notes.append(f"{at}: {ref.label} now names {named or 'nothing'}, not the "
                                f"device {p.cache} was built on; using "
                                f"{seen.describe()}, found by its identity")
    node = seen.node
    rep = blockdev.report(p.env.host, node, roots=roots)
    return Device(role, ref, node, True, rep.size, rep, _fs(p.env.host, node, rep),
                  proven=True)


def _named_now(host: Host, ref: DeviceRef) -> str | None:
    """The node the spec's reference names today (None: nothing there)."""
    if ref.loop is not None:
        return blockdev.loop_for_file(host, ref.loop.file)
    return host.realpath(ref.file) if host.exists(ref.file) else None


def _require_stable_identity(p: Planner, spec: CacheSpec, dev: Device) -> None:
    """A cache restored at boot must find its devices again by what they are: a disk with
    no by-id link, serial, WWN or partition UUID (a virtio disk without serial, a
    device-mapper device without UUID) could never be proven after a reboot, so its
    restore would refuse at every boot. Refused before the first build."""
    if dev.ref.loop is not None or not isinstance(dev.node, str):
        return          # a loop image is found again by its file
    name = identity.kname(dev.node, p.env.host)
    if name is None:
        return
    _, ident, links, loop_file = identity.hardware(name, p.env.host)
    if links or loop_file or any(k != "partn" for k in ident):
        return
    p.refuse(f"{spec.name}.{dev.role} ({dev.ref.label}): {dev.node} has no stable identity "
             "(no by-id link, serial, WWN or partition UUID), so after a reboot nothing "
             f"could prove it is this device and `hotcache restore {spec.name}` would refuse "
             "it at every boot. Give the disk a serial (QEMU and libvirt: serial=...), name "
             "a partition of it (partitions carry a UUID), or a device-mapper device "
             "created with a UUID (`dmsetup create --uuid`)")


def first_build(p: Planner, entry: CacheEntry | None) -> bool:
    """`wipe: true` is consent for the first build only: never replayed by restore, nor
    by an apply of a cache the mapping records as built."""
    return not p.restoring and (entry is None or entry.state == EntryState.BUILDING)


def preflight(p: Planner, backend: Backend, spec: CacheSpec, entry: CacheEntry | None, dev: Device,
              min_size: int) -> None:
    """Refuse what is unsafe; queue a wipe where the spec consented to one."""
    at = f"{spec.name}.{dev.role} ({dev.ref.label})"
    if dev.size < min_size:
        p.refuse(f"{at}: {dev.size / 2**20:.0f} MiB is too small; {spec.backend} needs at "
                 f"least {min_size / 2**20:.0f} MiB here")
    if backend.owns(entry, dev):
        if entry is not None and entry.state == EntryState.READY and isinstance(dev.node, str):
            p.own_devices.add(dev.node)
        return
    if dev.report is not None:
        rep = dev.report
        hard = rep.hard_problems()
        if hard:
            p.refuse(f"{at}: {'; '.join(hard)}. hotcache will not touch it, even with wipe: true")
            return
        # A probe that failed is an error (exit 4), never "no signatures": ask again and
        # let it raise.
        sigs = rep.signatures
        node = cast(str, dev.node)      # a device with a report is present: a path
        if rep.unreadable:
            sigs = blockdev.signatures(p.env.host, node)
            late = blockdev.partitions_in_use(p.env.host, node)
            if late:
                p.refuse(f"{at}: {'; '.join(late)}. hotcache will not touch it, even with "
                         "wipe: true")
                return
        sigs = [*sigs, *_header_signature(p.env.host, node,
                                          backend.signature(entry, dev.role) if entry else None),
                *backend.hidden_signatures(entry, dev, node)]
    else:
        sigs = dev.image_signatures
        image = dev.ref.loop.file if dev.ref.loop is not None else None
        if image is not None and os.path.exists(image):
            # an image not attached yet: hotcache's header and what lies behind it, read
            # from the file (a kept image of a torn-down cache holds both)
            sigs = [*sigs, *_header_signature(p.env.host, image, backend.signature(
                entry, dev.role) if entry else None),
                *backend.hidden_signatures(entry, dev, image)]
    # An existing image file with data in it is someone's, unless the mapping says
    # hotcache made it: a file of plain data carries no signature to refuse.
    foreign = None
    loop = dev.ref.loop
    if loop is not None and dev.image_data:
        image = os.path.realpath(loop.file)
        if image not in p.known_images:
            foreign = (f"{image} already exists and holds {dev.image_data / 2**20:.1f} MiB "
                       f"of data (a {os.path.getsize(image) / 2**20:.0f} MiB file; the spec "
                       f"says {loop.size})")
    if not sigs and not foreign:
        return
    kinds = ", ".join(sorted({s.get("type", "?") for s in sigs}))
    if dev.ref.wipe and not first_build(p, entry):
        p.refuse(f"{at}: it carries signatures ({kinds}) that are not the ones hotcache "
                 f"wrote for {spec.name}. `wipe: true` was consent for the first build "
                 "only; it is not used again on a cache already built")
        return
    if not dev.ref.wipe:
        why = [f"it carries signatures ({kinds})"] if sigs else []
        if foreign:
            why.append(foreign)
        p.refuse(f"{at}: {' and '.join(why)} that hotcache did not create. If its data may "
                 "be destroyed, add `wipe: true` to that device in the spec")
        return
    if not sigs:
        return
    p.command(f"erase every signature on {dev.ref.label} ({kinds}), as `wipe: true` allows",
          ["wipefs", "--all", dev.node], destructive=True)
    dev.fs = {}


def _header_signature(host: Host, node: str,
                      expected: Signature | None) -> list[dict[str, Any]]:
    """hotcache's header of another cache (a raw dm-cache SSD), which blkid and wipefs do
    not know, as a signature to refuse like theirs; the header this cache's own entry
    records (`expected`, the backend's signature for the role) is no conflict."""
    try:
        found = header.read(host, node)
    except OSError:
        return []       # blkid read it a moment ago; a device that fails now fails later
    if not found or expected == (header.TYPE, found["uuid"]):
        return []
    return [{"type": f"hotcache header of cache {found.get('cache')}"}]


# --- planning --------------------------------------------------------------------

def plan_apply(spec: HostSpec, env: Env, *, restoring: bool = False) -> Plan:
    """The steps that make the host what `spec` says (or, `restoring`, bring back what
    the mapping records), each device read once while planning."""
    with env.host.holding_probes():
        return _plan_apply(spec, env, restoring=restoring)


def _plan_apply(spec: HostSpec, env: Env, *, restoring: bool) -> Plan:
    plan = Plan()
    state = mapping.load(env.state)
    refusals: list[str] = owners.conflicts(spec, state)
    for cache in spec.caches:
        p = Planner(env, cache.name, plan, restoring=restoring)
        p.known_images = images.made_by_hotcache(state, cache.name)
        entry = state["caches"].get(cache.name)
        if restoring and (entry is None or entry.state != EntryState.READY):
            refusals.append(f"{cache.name}: its first apply did not finish (state "
                            f"{repr(entry.state.value) if entry else None}); restore only brings back a "
                            "built cache. Run `hotcache apply SPEC` with its spec to finish it")
            continue
        if entry is not None and entry.backend != cache.backend:
            refusals.append(f"{cache.name}: it was built with backend {entry.backend}; "
                            f"changing to {cache.backend} needs `hotcache teardown "
                            f"{cache.name}` first")
            continue
        # A cache whose failed SSD a teardown took off: a new SSD is attached to the
        # filesystem its origin kept (the record seeds a first build that formats nothing).
        waiting = None if restoring else reattach.detached(state).get(cache.name)
        if entry is not None and entry.on_origin is not None and not restoring:
            # Switched to its origin when its SSD failed: the same, with the filesystem
            # still mounted (on the switched device, or on the origin after a boot).
            why = _new_ssd_refused(p, cache, entry)
            if why:
                refusals.append(why)
                continue
            waiting = reattach.seed(entry, get_backend(entry.backend, p.env.host)
                                    .surviving_state(entry))
            entry = None
        why = _spec_as_it_was(cache, waiting) if waiting is not None and entry is None else None
        if why:
            refusals.append(why)
            continue
        if waiting is not None and waiting.backend != cache.backend:
            refusals.append(f"{cache.name}: its origin kept the filesystem of a "
                            f"{waiting.backend} cache whose SSD failed; a {cache.backend} "
                            f"cache on it needs `hotcache teardown {cache.name} --forget` "
                            "first (and `wipe: true` on the origin: its data is lost)")
            continue
        # An image kept by a teardown is still hotcache's: its filesystem is mounted again.
        _plan_cache(p, cache, entry or waiting or images.adoptable_entry(state, cache),
                    reattaching=waiting is not None, seed=waiting if entry is None else None)
        refusals += p.refusals
        if not p.changed and not p.refusals:
            plan.unchanged.append(cache.name)
    for name in state["caches"]:
        if name not in {c.name for c in spec.caches}:
            plan.notes.append(f"{name} is in the mapping but not in this spec; it is left as "
                              f"it is (`hotcache teardown {name}` removes it)")
    if refusals:
        raise RefusedError("refusing to apply this spec:\n" + "\n".join(f"  {r}" for r in refusals),
                           hint="nothing was changed; fix the spec or the devices and retry")
    return plan


def _spec_as_it_was(spec: CacheSpec, waiting: CacheEntry) -> str | None:
    """Why a spec cannot attach a new SSD to a cache whose SSD failed (`waiting`, what
    survives of it): it still names the cache device as it did before (a routine apply,
    Ansible's on every play), and what that name shows now is no consent to attach a
    cache there, `wipe: true` or not. None: it names another device."""
    named = spec.devices().get("cache")
    image = os.path.realpath(named.loop.file) if named and named.loop else None
    if named is None or not reattach.failed_ssd_named(waiting, named.path, image):
        return None
    return (f"{spec.name}: its SSD failed, and the spec still names the cache device it was "
            f"built on ({named.label}). Name the new SSD as the cache device (by what it is: "
            "a /dev/disk/by-id path), then apply again")


def _new_ssd_refused(p: Planner, spec: CacheSpec, entry: CacheEntry) -> str | None:
    """Why a cache running on its origin since its SSD failed cannot take the SSD the
    spec names: the spec still names the failed one, or the backend cannot attach a new
    SSD until the failed cache is taken off (None: it can)."""
    host = p.env.host
    if not get_backend(entry.backend, host).attaches_on_origin:
        return (f"{spec.name}: it runs on its origin since its SSD failed, and "
                f"{entry.backend} takes the failed cache off only with the filesystem "
                f"unmounted: `hotcache teardown {spec.name} --cache-failed` does that, "
                "then `hotcache apply SPEC` attaches the new SSD")
    named = spec.devices().get("cache")
    why = _spec_as_it_was(spec, reattach.seed(entry, {}))
    if why:
        return why
    try:
        failed = recorded.locate(entry, "cache", host).node
    except (OSError, HotcacheError):
        failed = None   # a dead SSD that cannot be probed: the spec's device is probed next
    if failed is not None and named is not None and failed == _named_now(host, named):
        return (f"{spec.name}.cache ({named.label}): that is the SSD that failed "
                f"({failed}); {spec.name} runs on its origin. Name a new SSD as the cache "
                "device, then apply again")
    return None


def _plan_cache(p: Planner, spec: CacheSpec, entry: CacheEntry | None, *,
                reattaching: bool = False, seed: CacheEntry | None = None) -> None:
    """Plan one cache. `reattaching`: its SSD failed and was taken off, and `entry` (or
    `seed`, the record the teardown left, when the apply has not started yet) holds the
    origin whose filesystem a new SSD is attached to; nothing is formatted."""
    backend = _usable_backend(p.env.host, spec)
    devs = _resolve_devices(p, spec, entry)
    if p.refusals or not _checked(p, spec, backend, entry, devs, reattaching):
        return
    fs_uuid = _filesystem_uuid(p, spec, backend, entry, devs)
    building = entry is None or entry.state != EntryState.READY
    unmounted = _release_origin(p, spec, devs["origin"]) if reattaching else False
    if p.refusals:
        return
    if reattaching:
        p.plan.notes.append(f"{spec.name}: the new SSD is attached to the filesystem "
                            f"{fs_uuid} its origin kept; the cache starts empty, so "
                            f"warm-up starts over (`hotcache warm {spec.filesystem.mountpoint}`)")
    if building:
        p.do(f"record {spec.name} in the mapping as building (filesystem UUID {fs_uuid})",
             lambda ctx: _write_entry(p.env, spec, devs, ctx, fs_uuid, None, EntryState.BUILDING,
                                 seed=seed))

    target = backend.build(p, spec, entry, devs)
    if p.refusals:
        return      # what comes next is planned on what the backend refused to do
    if backend.restores_at_boot:
        bootunit.plan_unit(p, spec)
    if backend.fails_over:
        failoverunit.plan_unit(p)
    target_dev = _target_device(p.env.host, spec, devs, target)
    # A filesystem the mapping records as made (or that a failed cache's origin kept) is
    # never made again.
    made = (entry is not None and entry.state == EntryState.READY) or p.restoring or reattaching
    if not _plan_filesystem(p, spec, backend, entry, devs, target, target_dev, fs_uuid, made):
        return
    mounting = _plan_mount(p, spec, entry, target, target_dev, unmounted=unmounted)
    _plan_persist(p, spec, fs_uuid, entry)
    _plan_owner(p, spec, mounting)
    if p.changed or building or _entry_drifted(entry, spec) or _identity_missing(entry):
        p.do(f"record {spec.name} in the mapping as ready",
             lambda ctx: _write_entry(p.env, spec, devs, ctx, fs_uuid, target, EntryState.READY,
                                 seed=seed, reattached=reattaching))


def _usable_backend(host: Host, spec: CacheSpec) -> Backend:
    """The spec's backend, once this host can run it and has its programs (raises:
    the kernel lacks it, naming the backends that can run here)."""
    backend = get_backend(spec.backend, host)
    why = backend.unavailable()
    if why:
        usable = [r["backend"] for r in backend_report(host) if r["available"]]
        raise KernelUnsupported(f"{spec.name}: backend {spec.backend} cannot run here: {why}",
                                hint=f"this host can use backend {', '.join(usable) or 'none'}"
                                     " (`hotcache devices --backends` says why)")
    for program in backend.programs:
        host.require(program)
    return backend


def _resolve_devices(p: Planner, spec: CacheSpec, entry: CacheEntry | None) -> dict[str, Device]:
    """Each spec device: a recorded one by its identity, a new one by the spec's name."""
    roots = blockdev.root_devices(p.env.host)
    devs = {}
    for role, ref in spec.devices().items():
        if entry is not None and entry.devices.get(role):
            dev = resolve_recorded(p, role, ref, entry, roots)
        else:
            dev = resolve(p, role, ref, roots)
        if dev is not None:
            devs[role] = dev
    return devs


def _checked(p: Planner, spec: CacheSpec, backend: Backend, entry: CacheEntry | None,
             devs: dict[str, Device], reattaching: bool) -> bool:
    """Whether the devices may be used as planned (False, with refusals, when not); a
    wipe the spec consented to is queued on the way."""
    if reattaching and "origin" in devs and not backend.owns(entry, devs["origin"]):
        # Checked before preflight: the spec's `wipe: true` must not erase an origin that
        # was meant to keep its filesystem.
        p.refuse(f"{spec.name}.origin ({spec.origin.label}): it no longer carries what the "
                 f"failed cache left on it ({_fs_shown(devs['origin'])}, not the recorded "
                 f"filesystem {entry.filesystem.uuid if entry else '?'}), so there is "
                 "nothing to re-attach a new SSD to; nothing was changed. If its data is "
                 f"gone for good: `hotcache teardown {spec.name} --forget`, then apply to "
                 "build a new cache")
        return False
    if backend.restores_at_boot and first_build(p, entry):
        for dev in devs.values():
            _require_stable_identity(p, spec, dev)
    for dev in devs.values():
        preflight(p, backend, spec, entry, dev, backend.min_bytes)
    return not p.refusals


def _filesystem_uuid(p: Planner, spec: CacheSpec, backend: Backend, entry: CacheEntry | None,
                     devs: dict[str, Device]) -> str:
    """The filesystem's UUID: recorded, adopted from an existing LV, or drawn now (a
    placeholder in a plan only shown, which draws nothing)."""
    fs_uuid = (entry and entry.filesystem.uuid) or backend.adopted_fs_uuid(devs)
    if fs_uuid is not None:
        return fs_uuid
    if p.env.preview:
        p.plan.notes.append(f"{spec.name}: {NEW_FS_UUID} stands for the filesystem UUID "
                            "that apply draws (at random) when it runs")
        return NEW_FS_UUID
    return str(uuid.uuid4())


def _plan_filesystem(p: Planner, spec: CacheSpec, backend: Backend, entry: CacheEntry | None,
                     devs: dict[str, Device], target: str | Ref, target_dev: Device, fs_uuid: str,
                     made: bool) -> bool:
    """Queue the format of a new filesystem, or the check of one already `made`; False
    (with a refusal) when the device shows another filesystem than the one made.

    A cache brought back after a boot (restore) appears only when its steps run; its
    backend knows the filesystem is already on it. A made filesystem is never made
    again: its device must show it, or nothing goes on."""
    if made and target_dev.present and target_dev.fs.get("UUID") != fs_uuid:
        p.refuse(f"{spec.name}: {target} shows {_fs_shown(target_dev)}, not the filesystem "
                 f"{fs_uuid} hotcache made on it; hotcache will not format a recorded "
                 "filesystem. Check the devices (`hotcache status`)")
        return False
    if made and not target_dev.present:
        host = p.env.host
        p.do(f"check that {target} shows the filesystem {fs_uuid} before mounting it",
             lambda ctx: _check_filesystem(host, ctx, target, fs_uuid, spec.name))
    elif target_dev.fs.get("UUID") != fs_uuid and not backend.keeps_filesystem(entry, devs):
        p.command(f"format {target} as XFS, label {fs_label(spec)}",
              ["mkfs.xfs", "-L", fs_label(spec), "-m", f"uuid={fs_uuid}", "-s", "size=4096",
               target], destructive=True)
    return True


def _release_origin(p: Planner, spec: CacheSpec, origin: Device) -> bool:
    """Before a new SSD is attached: the origin's filesystem, mounted by itself on the
    cache's mountpoint since the failed cache was taken off, is unmounted (the cache
    device then mounts it). True when that unmount is queued. An origin mounted anywhere
    else, or busy, is refused."""
    host = p.env.host
    if not isinstance(origin.node, str):
        return False
    mp = os.path.normpath(spec.filesystem.mountpoint)
    where = [m for m in blockdev.mountpoints_of(host, origin.node)]
    current = blockdev.mount_at(host, mp)
    if current is not None and current.source_dev == host.devnum(origin.node):
        where = [m for m in where if os.path.normpath(m) != mp]
        if not where:
            users = busy.users_of(mp)
            if users:
                p.refuse(f"{spec.name}: {mp} is busy, and the origin's filesystem must be "
                         "unmounted for a moment to attach the new SSD:\n"
                         + "\n".join(f"  {u}" for u in users)
                         + "\nstop those processes and apply again")
                return False
            p.command(f"unmount {mp} (the origin alone; the cache device mounts it again)",
                  ["umount", mp])
            return True
    if where:
        p.refuse(f"{spec.name}.origin ({spec.origin.label}): its filesystem is mounted at "
                 f"{', '.join(where)}; unmount it there (the cache mounts it on {mp})")
    return False


def _fs_shown(dev: Device) -> str:
    if not dev.fs.get("TYPE"):
        return "no filesystem"
    return f"{dev.fs['TYPE']} {dev.fs.get('UUID', '')}".strip()


def _check_filesystem(host: Host, ctx: RunContext, target: str | Ref, fs_uuid: str,
                      name: str) -> None:
    if ctx.runner.dry_run:
        return
    node = ctx.resolve(target)
    seen = blockdev.fs_identity(host, node)
    if seen.get("UUID") != fs_uuid:
        raise RefusedError(f"{name}: {node} shows {seen.get('TYPE') or 'no filesystem'} "
                           f"{seen.get('UUID') or ''}, not the filesystem {fs_uuid} hotcache "
                           "made; it was not mounted and nothing was formatted",
                           hint="check the devices with `hotcache status`; restore again "
                                "once the right disks are present")


def _target_device(host: Host, spec: CacheSpec, devs: dict[str, Device],
                   target: str | Ref) -> Device:
    for dev in devs.values():
        if dev.node == target:
            return dev
    # A backend-made device (bcache, dm): read what is on it if it already exists.
    if isinstance(target, str) and host.exists(target):
        return Device("cached", spec.origin, target, True, blockdev.size_bytes(host, target),
                      None, blockdev.fs_identity(host, target))
    return Device("cached", spec.origin, target, False, 0)


def _plan_mount(p: Planner, spec: CacheSpec, entry: CacheEntry | None, target: str | Ref,
                target_dev: Device, *, unmounted: bool = False) -> bool:
    """Queue what it takes to have the filesystem mounted; True if a mount is queued.
    `unmounted`: a step before unmounts what is on the mountpoint now."""
    mp = os.path.normpath(spec.filesystem.mountpoint)
    opts = mount_options(spec)
    host = p.env.host
    released = {host.realpath(m) for m in p.released}
    unmounted = unmounted or host.realpath(mp) in released
    old_mp = entry.filesystem.mountpoint if entry else None
    if entry and old_mp and old_mp != mp and host.realpath(old_mp) not in released \
            and blockdev.mount_at(host, old_mp):
        p.command(f"unmount {old_mp} (the spec moved {spec.name} to {mp})", ["umount", old_mp])
        old_uuid = entry.filesystem.uuid
        p.do(f"remove the old mountpoint entry of {spec.name} from {p.env.fstab}",
             lambda ctx: fstab.set_entry(p.env.fstab, spec.name, None, old_uuid, [old_mp]))
    current = None if unmounted else blockdev.mount_at(host, mp)
    if current is not None and isinstance(target, str) and target_dev.present \
            and current.source_dev == host.devnum(target):
        missing = [o for o in opts if o not in current.options]
        if missing:
            p.command(f"remount {mp} with {','.join(missing)}",
                  ["mount", "-o", ",".join(["remount", *opts]), mp])
        return False
    if current is not None:
        p.refuse(f"{spec.name}: {mp} already has {current.source} mounted on it; choose "
                 "another mountpoint or unmount that first")
        return False
    if os.path.exists(mp) and not os.path.isdir(mp):
        p.refuse(f"{spec.name}: mountpoint {mp} exists and is not a folder")
        return False
    if not unmounted and os.path.isdir(mp) and any(os.scandir(mp)):
        p.refuse(f"{spec.name}: mountpoint {mp} is a folder that is not empty; mounting "
                 "over it would hide its files. Move them or choose another mountpoint")
        return False
    if not os.path.isdir(mp):
        p.command(f"create mountpoint {mp}", ["mkdir", "--parents", mp])
    p.command(f"mount {spec.name} on {mp} ({','.join(opts)})",
          ["mount", "-t", FSTYPE, "-o", ",".join(opts), target, mp])
    return True


def _plan_persist(p: Planner, spec: CacheSpec, fs_uuid: str, entry: CacheEntry | None) -> None:
    path = p.env.fstab
    line = None
    mp = os.path.normpath(spec.filesystem.mountpoint)
    if spec.filesystem.persist == "fstab":
        line = fstab.entry(fs_uuid, mp, FSTYPE, fstab_options(spec))
    ours = [mp, entry.filesystem.mountpoint if entry is not None else None]
    if fstab.read_entry(path, spec.name, fs_uuid, ours) != line:
        what = f"write the entry `{line}` to {path}" if line else f"remove the entry from {path}"
        p.do(f"{what} (tagged {fstab.marker(spec.name)})",
             lambda ctx: fstab.set_entry(path, spec.name, line, fs_uuid, ours))


def _plan_owner(p: Planner, spec: CacheSpec, mounting: bool) -> None:
    fs = spec.filesystem
    mp = os.path.normpath(fs.mountpoint)
    st = None if mounting or not os.path.isdir(mp) else os.stat(mp)
    if fs.owner:
        owner = parse_owner(fs.owner)     # the spec checked that it exists
        if st is None or st.st_uid != owner.uid or (owner.gid is not None
                                                    and st.st_gid != owner.gid):
            p.command(f"give {mp} to {fs.owner}", ["chown", fs.owner, mp])
    if fs.mode:
        want = int(fs.mode, 8)
        if st is None or (st.st_mode & 0o7777) != want:
            p.command(f"set the mode of {mp} to {fs.mode}", ["chmod", fs.mode, mp])


def _identity_missing(entry: CacheEntry | None) -> bool:
    """An entry written before identities were recorded: record them now."""
    return entry is not None and any(info.identity is None for info in entry.devices.values())


def _entry_drifted(entry: CacheEntry | None, spec: CacheSpec) -> bool:
    if entry is None:
        return True
    return without_wipe(entry.spec) != recorded_spec(spec)


def recorded_spec(spec: CacheSpec) -> dict[str, Any]:
    """The spec as the mapping keeps it: `wipe: true` was consent for the first build
    and is not kept for restore to replay."""
    return without_wipe(spec.model_dump(mode="json", exclude_none=True))


def _writeback_ever(old: CacheEntry | None, mode: str | None) -> bool | None:
    """The entry's writeback_ever after this apply: once True, True for good; unknown
    for a cache recorded before it was kept (unless it is writeback now)."""
    now_wb = mode == "writeback"
    if old is None:
        return now_wb
    if old.writeback_ever is None:
        return True if now_wb or old.mode == "writeback" else None
    return old.writeback_ever or now_wb


def _write_entry(env: Env, spec: CacheSpec, devs: dict[str, Device], ctx: RunContext,
            fs_uuid: str, target: str | Ref | None, state: EntryState, *, seed: CacheEntry | None = None,
            reattached: bool = False) -> None:
    """Write the cache's entry. `seed`: the record of a cache whose failed SSD was taken
    off (its backend facts and hot copies carry over); `reattached`: that record is
    forgotten once the new SSD is attached."""
    if ctx.runner.dry_run:
        return
    devices: dict[str, dict[str, Any]] = {}
    loop_files: list[str] = []
    for role, dev in devs.items():
        node = ctx.resolve(dev.node) if isinstance(dev.node, Ref) else dev.node
        info: dict[str, Any] = {"node": node, "size": dev.size}
        if env.host.exists(node):
            info = identity.record(identity.probe(env.host.kname(node), env.host))
        if dev.ref.path:
            info["path"] = dev.ref.path
        if dev.ref.loop:
            info["loop_file"] = os.path.realpath(dev.ref.loop.file)
            loop_files.append(info["loop_file"])
        devices[role] = info
    cached = None
    if target is not None:
        cached = ctx.resolve(target) if isinstance(target, Ref) else target
    with mapping.editing(env.state) as data:
        for image in loop_files:
            images.forget(data, image)          # in a cache again: no longer just kept
        old = data["caches"].get(spec.name)
        if old is None or (seed is not None and old.on_origin is not None):
            old = seed      # a failed cache's record gives way to what survives of it
        if reattached and state == EntryState.READY:
            reattach.forget(data, spec.name)
        data["caches"][spec.name] = CacheEntry(
            backend=spec.backend,
            state=state,
            created=old.created if old and old.created else now(),
            updated=now(),
            mode=spec.effective_mode,
            writeback_ever=_writeback_ever(old, spec.effective_mode),
            tunables=dict(spec.tunables),
            devices={role: DeviceRecord.model_validate(info) for role, info in devices.items()},
            cached_device=cached,
            filesystem=Filesystem(
                type=FSTYPE, uuid=fs_uuid, label=fs_label(spec),
                mountpoint=os.path.normpath(spec.filesystem.mountpoint),
                options=mount_options(spec),
                owner=spec.filesystem.owner, mode=spec.filesystem.mode,
            ),
            persist=Persist(fstab=str(env.fstab) if spec.filesystem.persist == "fstab" else None),
            backend_state=(old.backend_state if old and old.backend_state is not None
                           else STATES.get(spec.backend, BackendState)()),
            hot_copies=old.hot_copies if old and old.hot_copies is not None else {},
            spec=recorded_spec(spec),
        )


def execute(plan: Plan, runner: Runner,
            progress: Callable[[int, Step], None] | None = None) -> None:
    ctx = RunContext(runner)
    for i, step in enumerate(plan.steps):
        if progress:
            progress(i, step)
        step.run(ctx)

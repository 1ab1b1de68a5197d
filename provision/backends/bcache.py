"""Backend `bcache`: the SSD becomes a cache set, the origin a backing device, and the
filesystem goes on the bcache device, always named by /dev/bcache/by-uuid/UUID (the
bcacheN number moves between boots).

Only the cache mode lives in bcache's superblock; sequential_cutoff and the other
tunables are forgotten at reboot, so `hotcache restore` (run by the unit apply installs)
writes them again from the mapping.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotcache.provision.backends.parts import bcache_sysfs as sb
from hotcache.provision.errors import (FlushIncomplete, HotcacheError, KernelUnsupported,
                                       RefusedError)
from hotcache.provision.plan import Ref, RunContext
from hotcache.provision.records import BcacheState, CacheEntry, EntryState
from hotcache.provision.system.waits import flush_timeout, wait_drained, wait_until
from hotcache.provision.backends.parts import state
from hotcache.provision.backends.base import Backend, Failure, Nodes, Signature, present_origin
from hotcache.provision.backends.parts.stats import CacheStats
from hotcache.provision.block import blockdev, busy
from hotcache.provision.block.host import Host

if TYPE_CHECKING:
    from hotcache.provision.backends.parts.contract import CacheSpec, Device, Planner

BLOCK = "4k"               # cache and backing block sizes must match to attach
MIN_BUCKETS = 1024         # the kernel refuses fewer ("ca->sb.nbuckets is too small")
MAX_BUCKET = 512 * 1024    # bcache's own default bucket size
# sequential_cutoff 0: dataset shards are large sequential reads, which bcache would
# otherwise pass by. congested_*_threshold_us 0: bcache sends reads past the cache while
# the SSD's latency is over 2 ms (writes: 20 ms), and what it sent past is never cached;
# measured in the guest kernel, parallel reads (hotcache warm, a DataLoader's workers)
# left half of a dataset uncached that way.
DEFAULT_TUNABLES = {"sequential_cutoff": 0, "congested_read_threshold_us": 0,
                    "congested_write_threshold_us": 0}
REGISTER_TIMEOUT = 30.0


def bucket_size(cache_bytes: int) -> int:
    """The largest power-of-two bucket (at most 512 KiB) that still gives >= 1024 buckets."""
    size = MAX_BUCKET
    while size > 4096 and cache_bytes // size < MIN_BUCKETS:
        size //= 2
    return size


def desired_tunables(tunables: Mapping[str, int | str]) -> dict[str, int | str]:
    return {**DEFAULT_TUNABLES, **tunables}


class Bcache(Backend):
    name = "bcache"
    modes = ("writethrough", "writeback", "writearound", "none")
    tunables = {"sequential_cutoff": int, "writeback_percent": int, "writeback_delay": int,
                "readahead": int, "congested_read_threshold_us": int,
                "congested_write_threshold_us": int}
    restores_at_boot = True     # tunables other than cache_mode are lost at reboot
    restore_why = "its tunables ({what}) are reset to the kernel defaults at boot"
    boot_loses_tunables_only = True     # cache_mode lives in the superblock
    kernel_feature = "bcache"
    modules = ("bcache",)
    programs = ("make-bcache", "wipefs", "mkfs.xfs", "blkid")

    def owns(self, entry: CacheEntry | None, dev: Device) -> bool:
        st = state.of(entry, BcacheState)
        ours = {st.cache_uuid, st.backing_uuid} - {None}
        return dev.proven and dev.fs.get("TYPE") == "bcache" and dev.fs.get("UUID") in ours

    def signature(self, entry: CacheEntry, role: str) -> Signature | None:
        st = state.of(entry, BcacheState)
        recorded = st.backing_uuid if role == "origin" else st.cache_uuid
        return ("bcache", recorded) if recorded else None

    def keeps_filesystem(self, entry: CacheEntry | None, devs: Mapping[str, Device]) -> bool:
        return entry is not None and entry.state == EntryState.READY and self.owns(entry, devs["origin"])

    def build(self, p: Planner, spec: CacheSpec, entry: CacheEntry | None,
              devs: Mapping[str, Device]) -> str | Ref:
        st = state.of(entry, BcacheState)
        origin, cache = devs["origin"], devs["cache"]
        cset = st.cset_uuid or str(uuid.uuid4())
        new_cache = not (self.owns(entry, cache) and st.cset_uuid)
        new_origin = not self.owns(entry, origin)
        if new_cache:
            bucket = bucket_size(cache.size)
            p.command(f"erase old signatures on the cache device {cache.ref.label}",
                  ["wipefs", "--all", cache.node], destructive=True)
            p.command(f"make {cache.ref.label} a bcache cache set ({cache.size // bucket} buckets "
                  f"of {bucket // 1024} KiB)",
                  ["make-bcache", "-C", "--bucket", f"{bucket // 1024}k", "--block", BLOCK,
                   "--cset-uuid", cset, cache.node], destructive=True)
        if new_origin:
            p.command(f"erase old signatures on the origin {origin.ref.label}",
                  ["wipefs", "--all", origin.node], destructive=True)
            p.command(f"make {origin.ref.label} a bcache backing device",
                  ["make-bcache", "-B", "--block", BLOCK, origin.node], destructive=True)
        key = f"bcache-uuid:{spec.name}"
        bdev_uuid = st.backing_uuid if not new_origin else None
        if new_cache or new_origin:
            def uuids(ctx: RunContext) -> dict[str, Any]:
                values = {"cset_uuid": cset,
                          "cache_uuid": _probe_uuid(ctx, cache.node),
                          "backing_uuid": _probe_uuid(ctx, origin.node)}
                ctx.refs[key] = values["backing_uuid"]
                return values
            state.remember(p, "record the cache set and backing device UUIDs in the mapping",
                           uuids)

        h = self.host
        live = bdev_uuid is not None and isinstance(origin.node, str) \
            and sb.is_registered(h, origin.node) and h.is_dir(sb.set_dir(cset))
        stopped = stopping_node(h, bdev_uuid, origin.node) \
            if bdev_uuid is not None and isinstance(origin.node, str) else None
        if stopped is not None:
            self._release_stopped(p, entry, stopped)
        if not live:
            p.do(f"register {cache.ref.label} and {origin.ref.label} with the kernel "
                 "(udev may have done it already)",
                 lambda ctx: register(h, ctx.resolve(cache.node), ctx.resolve(origin.node),
                                      cset))
        if not live or not isinstance(origin.node, str) \
                or sb.attached_set(h, origin.node) != cset:
            p.do(f"attach the backing device to cache set {cset}",
                 lambda ctx: attach(h, ctx.resolve(origin.node), cset))
        if stopped is not None:
            # Its link names the stopped node until udev makes it again for the new one.
            target: str | Ref = Ref(f"bcache-node:{spec.name}", f"{sb.BY_UUID}/{bdev_uuid}")
        elif bdev_uuid is not None:
            target = f"{sb.BY_UUID}/{bdev_uuid}"
        else:
            target = Ref(f"bcache-node:{spec.name}", "/dev/bcache/by-uuid/<new backing UUID>")
        if not live or not h.exists(str(target)):
            def linked(ctx: RunContext) -> None:
                u = ctx.refs.get(key) or bdev_uuid
                if not u:   # the record step above sets it whenever bdev_uuid is unknown
                    raise HotcacheError(f"the backing device of {spec.name} has no bcache "
                                        "UUID to find its /dev/bcache/by-uuid link by")
                node = wait_for_link(h, u)
                if isinstance(target, Ref):
                    ctx.refs[target.key] = node
            p.do("wait for udev's /dev/bcache/by-uuid link", linked)
        if new_origin:
            # make-bcache wrote only its own superblock: an old filesystem 8 KiB in would
            # show through the new device and stop mkfs.
            p.command("erase old signatures showing through the new bcache device",
                  ["wipefs", "--all", target], destructive=True)
        self._plan_tunables(p, spec, origin.node, cset, live)
        return target

    def _release_stopped(self, p: Planner, entry: CacheEntry | None, node: str) -> None:
        """The kernel stopped this cache's bcache device (too many I/O errors on the
        origin: bch_cached_dev_error) and unregistered the backing device. Its dirty data
        waits in the cache set, and registering the backing device again brings it back,
        but only once the stopped device is gone: the kernel keeps its node, which cannot
        be opened, while anything holds it (a mount of the dead filesystem, here or in
        another mount namespace) or its writeback waits on the origin. So: unmount such a
        mount (nothing can be read or written through it), then wait for the node to go.
        Refused while processes use the mount, while another namespace holds it, where
        another filesystem is mounted over it, and for a cache whose first apply did not
        finish (whether its filesystem was made is not known)."""
        h = self.host
        gone = (f"{p.cache}: the kernel stopped its bcache device {node} after I/O errors "
                "on the origin (see `dmesg`; the cache set keeps the dirty data)")
        if entry is None or entry.state != EntryState.READY:
            p.refuse(f"{gone}, before its first apply finished. Unmount what is mounted from "
                     f"{node}, wait until {node} is gone (the kernel lets go of it once the "
                     "origin answers again), then run the apply again")
            return
        elsewhere = busy.other_namespaces_holding(h.devnum(node))
        if elsewhere:
            p.refuse(f"{gone}; other mount namespaces still hold its filesystem (containers "
                     "started while it was mounted keep their own copy of the mount), so the "
                     "kernel cannot let go of it" + _stop_them(elsewhere))
            return
        for mp in blockdev.mountpoints_of(h, node):
            top = blockdev.mount_at(h, mp)
            if top is None or top.source_dev != h.devnum(node):
                p.refuse(f"{gone}; it is mounted at {mp} under {top.source if top else '?'}, "
                         "which is mounted over it: unmount that first, then run the command "
                         "again")
                continue
            users = busy.users_of(mp)
            if users:
                p.refuse(f"{gone}; {mp} is mounted from it (nothing can be read or written "
                         "through it) and must be unmounted before the cache comes back, but "
                         "it is in use" + _stop_them(users))
                continue
            p.command(f"unmount {mp}: the kernel stopped its device {node} after I/O errors "
                      "on the origin, so nothing can be read or written through it",
                      ["umount", mp], check=functools.partial(on_top, h, mp, node))
            p.released.add(mp)
        p.do(f"wait for the kernel to let go of the stopped device {node} (the cache set "
             "keeps its dirty data)", lambda ctx: wait_stopped(h, node))

    def _plan_tunables(self, p: Planner, spec: CacheSpec, node: str | Ref, cset: str,
                       live: bool) -> None:
        h = self.host
        want = {"cache_mode": spec.effective_mode, **desired_tunables(spec.tunables)}
        for key, value in want.items():
            if live and isinstance(node, str):      # live: the node is known
                current = h.read(sb.tunable_path(h, key, node, cset))
                if current is not None and key == "cache_mode":
                    current = sb.selected(current)
                if sb.same_value(key, current, value):
                    continue

            def write(ctx: RunContext, k: str = key, v: int | str = value) -> None:
                h.write(sb.tunable_path(h, k, ctx.resolve(node), cset), str(v))
            p.do(f"set bcache {key} to {value}", write)

    def live(self, entry: CacheEntry, nodes: Nodes) -> str | None:
        node, cset = nodes.get("origin"), state.of(entry, BcacheState).cset_uuid
        h = self.host
        if node is None:
            return "its origin (the bcache backing device) is not present"
        if not sb.is_registered(h, node):
            bdev_uuid = state.of(entry, BcacheState).backing_uuid
            stopped = stopping_node(h, bdev_uuid, node) if bdev_uuid else None
            return f"the bcache backing device {node} is not registered with the kernel" + (
                f" (the kernel stopped {stopped} after I/O errors on it: see `dmesg`; the "
                "cache set keeps the dirty data)" if stopped else "")
        attached = sb.attached_set(h, node)
        state_now = h.read(f"{sb.bdev_dir(h, node)}/state")
        if attached is None and state_now != "no cache":
            return (f"{node} is registered but not attached to its cache set {cset} "
                    f"(state {state_now})")
        if attached is not None and attached != cset:
            return f"{node} is attached to another cache set {attached}"
        return None

    def failure(self, entry: CacheEntry, nodes: Nodes) -> Failure | None:
        node, cset = nodes.get("origin"), state.of(entry, BcacheState).cset_uuid
        h = self.host
        if node is None or not cset or not sb.is_registered(h, node):
            return None         # not live: restore and teardown say so
        if sb.attached_set(h, node) is not None:
            return None
        if h.is_dir(sb.set_dir(cset)):
            # The set is still registered: its SSD did not fail (the kernel unregisters a
            # set whose cache device fails). The backing device was detached for another
            # reason (its own I/O errors): not live, which restore and teardown handle,
            # and the set may hold its dirty data.
            return None
        d = sb.bdev_dir(h, node)
        gone = " and the cache set is no longer registered"
        said = h.read(f"{d}/state")
        dirty: int | None = sb.parse_human(h.read(f"{d}/dirty_data") or "0")
        if said == "dirty" and not dirty:
            # A backing device waiting for its dirty cache set counts dirty_data only
            # once attached: it holds an unknown amount, never "none".
            dirty = None
        return Failure(f"bcache runs {node} without its cache set {cset} (state "
                       f"{said}{gone}): the kernel detached the cache", dirty,
                       sb.selected(h.read(f"{d}/cache_mode") or "") or None)

    def stats(self, entry: CacheEntry, nodes: Nodes) -> CacheStats:
        node, cset = nodes.get("origin"), state.of(entry, BcacheState).cset_uuid
        h = self.host
        if node is None or not sb.is_registered(h, node):
            raise HotcacheError("the bcache backing device is not registered; run "
                                "`hotcache restore`")
        d = sb.bdev_dir(h, node)

        def attr(name: str) -> str:
            return sb.read(h, f"{d}/{name}")
        hits = int(attr("stats_total/cache_hits"))
        misses = int(attr("stats_total/cache_misses"))
        bypassed = sum(int(attr(f"stats_total/cache_bypass_{k}")) for k in ("hits", "misses"))
        total = _cache_bytes(entry)
        unused = sb.unused_percent(h, cset) if cset else None
        policy = h.read(f"{sb.set_dir(cset)}/cache0/cache_replacement_policy") if cset else None
        return {
            "mode": sb.selected(attr("cache_mode")),
            "policy": sb.selected(policy) if policy is not None else None,
            "state": attr("state"),
            "hits": hits, "misses": misses,
            "hit_ratio": round(hits / (hits + misses), 4) if hits + misses else None,
            "bypassed": bypassed,   # I/Os sent past the cache (sequential, congested)
            "dirty_bytes": sb.parse_human(attr("dirty_data")),
            "cache_used_bytes": None if unused is None or total is None
            else total * (100 - unused) // 100,
            "cache_total_bytes": total,
            "promotions": None,   # bcache fills on every miss; it has no promotion counter
            "priority": sb.priority_stats(h, cset) if cset else None,   # buckets by state, %
            "sequential_cutoff": sb.parse_human(attr("sequential_cutoff")),
        }

    def drop_failed_cache(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> str:
        node, cset = present_origin(nodes, p.cache), state.of(entry, BcacheState).cset_uuid
        h = self.host
        if sb.attached_set(h, node) is not None:
            raise RefusedError(f"{node} is still attached to its cache set {cset}: bcache has "
                               "not given up the cache, and detaching it would flush through "
                               "the failed SSD; nothing was changed",
                               hint="`hotcache status` says what the kernel reports; "
                                    "`echo 1 > /sys/fs/bcache/<set>/stop` forces it")
        if cset and h.is_dir(sb.set_dir(cset)):
            p.do(f"stop cache set {cset} (its SSD failed; no backing device uses it)",
                 lambda ctx: unregister_set(h, cset))
        # The backing device keeps running without a cache: its /dev/bcacheN serves every
        # block from the origin, and udev registers it again at each boot.
        return f"{node} (through its bcache device, which runs without a cache)"

    def surviving_state(self, entry: CacheEntry) -> dict[str, Any]:
        # The backing device keeps its superblock and UUID (its bcache device, which
        # holds the filesystem, runs on); a new SSD becomes a new cache set.
        backing = state.of(entry, BcacheState).backing_uuid
        return {"backing_uuid": backing} if backing else {}

    @classmethod
    def forget_loses(cls, entry: CacheEntry) -> list[str]:
        st = state.of(entry, BcacheState)
        if not st.cset_uuid:
            return []
        return [f"which cache set ({st.cset_uuid}) and backing device ({st.backing_uuid}) "
                "belong together"]

    def dismantle(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> None:
        node, cset = nodes.get("origin"), state.of(entry, BcacheState).cset_uuid
        h = self.host
        if node and sb.is_registered(h, node):
            if sb.attached_set(h, node):
                p.do("detach the cache set (bcache first writes every dirty block back to "
                     "the origin) and wait for state `no cache`", lambda ctx: detach(h, node))
            p.do(f"stop the bcache device on {node}", lambda ctx: stop_backing(h, node))
        if cset and h.is_dir(sb.set_dir(cset)):
            p.do(f"unregister cache set {cset} (only once no backing device is attached)",
                 lambda ctx: unregister_set(h, cset))
        if node:
            p.plan.notes.append(f"{node} keeps its bcache superblock; the filesystem on it "
                                "starts 8 KiB in (`teardown --wipe` erases the superblock)")


def _cache_bytes(entry: CacheEntry) -> int | None:
    cache = entry.devices.get("cache")
    return cache.size if cache and cache.size else None


def _probe_uuid(ctx: RunContext, node: str | Ref) -> str:
    res = ctx.runner.run(["blkid", "--probe", "--match-tag", "UUID", "--output", "value",
                          ctx.resolve(node)])
    return res.stdout.strip()


# --- run-time actions (sysfs writes, bounded waits), on the host the plan read -------

def register(host: Host, cache_node: str, origin_node: str, cset: str) -> None:
    """Register both devices. udev's bcache rule usually does it first, and a second
    registration fails with EINVAL ("already registered"): tolerate it, then check."""
    def write(node: str) -> None:
        try:
            host.write(f"{sb.SYS_FS}/register", host.realpath(node))
        except OSError:
            pass  # already registered (udev did it) or a real failure: the wait tells

    def done() -> tuple[bool, str]:
        if host.is_dir(sb.set_dir(cset)) and sb.is_registered(host, origin_node):
            return True, "registered"
        # Again: just after a stopped device is let go, the kernel can still refuse
        # the backing device for a moment (busy).
        write(origin_node)
        return False, "not registered yet"

    for node in (cache_node, origin_node):
        write(node)
    wait_until("bcache to register the cache set and the backing device", done,
               timeout=REGISTER_TIMEOUT,
               hint="check `dmesg` for bcache errors (block size mismatch, too few buckets)")


def attach(host: Host, origin_node: str, cset: str) -> None:
    current = sb.attached_set(host, origin_node)
    if current == cset:
        return
    if current is not None:
        raise KernelUnsupported(f"{origin_node} is attached to another cache set {current}",
                                hint="take that cache down first")
    host.write(f"{sb.bdev_dir(host, origin_node)}/attach", cset)


def wait_for_link(host: Host, bdev_uuid: str) -> str:
    link = f"{sb.BY_UUID}/{bdev_uuid}"
    runner = host.runner
    runner.run(["udevadm", "settle", "--timeout=10"], check=False)

    def there() -> tuple[bool, str]:
        if host.exists(link):
            return True, "present"
        runner.run(["udevadm", "trigger", "--subsystem-match=block", "--action=change"],
                   check=False)
        runner.run(["udevadm", "settle", "--timeout=5"], check=False)
        return host.exists(link), "link missing"
    wait_until(f"udev to create {link}", there, timeout=REGISTER_TIMEOUT, interval=1.0)
    return link


def stopping_node(host: Host, bdev_uuid: str, origin_node: str) -> str | None:
    """The node of this backing device's bcache device while the kernel is stopping it:
    its by-uuid link still names a device, but the backing device is no longer
    registered (a running bcache device always has its backing device registered)."""
    link = f"{sb.BY_UUID}/{bdev_uuid}"
    if sb.is_registered(host, origin_node) or not host.exists(link):
        return None
    node = host.realpath(link)
    if host.is_dir(f"{host.sysfs(node)}/bcache"):
        # A running bcache device (its link to its backing device resolves): another
        # cache's, which took the number once ours was gone, before udev moved the link.
        return None
    return node


def _stop_them(processes: list[str]) -> str:
    return ":\n" + "\n".join(f"  {u}" for u in processes) + \
        "\nstop those processes and run the command again"


def on_top(host: Host, mp: str, node: str, _ctx: RunContext) -> None:
    """Right before the unmount: `mp`'s top mount is still the stopped device's (a mount
    made over it since the plan would be the one unmounted)."""
    top = blockdev.mount_at(host, mp)
    if top is None or top.source_dev != host.devnum(node):
        raise RefusedError(f"{mp} is no longer mounted from {node} on top (now: "
                           f"{top.source if top else 'nothing'}); it was not unmounted",
                           hint="look at `findmnt " + mp + "`, then run the command again")


def wait_stopped(host: Host, node: str) -> None:
    wait_until(f"the kernel to let go of the stopped bcache device {node}",
               lambda: (not host.exists(node), "still there"), timeout=REGISTER_TIMEOUT,
               hint="the kernel lets go of it once nothing holds it and its writeback "
                    "stops, which waits on the origin's I/O: check that the origin answers "
                    "again (`dmesg`) and that no process or container still has it mounted "
                    "(`findmnt`, `lsof`), then run the command again; the cache set keeps "
                    "the dirty data meanwhile")


def detach(host: Host, origin_node: str, **wait: Any) -> None:
    """Detach the cache set, which makes bcache write every dirty block back first, and
    wait until the backing device says `no cache`. The device going away meanwhile (a
    failing origin stops it) is an error: the flush did not complete."""
    d = host.path(sb.bdev_dir(host, origin_node))
    running = d / "writeback_running"
    if running.exists() and _get(running) != "1":
        running.write_text("1")     # 0 would hold every dirty block on the SSD
    cset = sb.attached_set(host, origin_node)
    (d / "detach").write_text("1")

    def remaining() -> tuple[int, str]:
        try:
            return _detach_progress(d)
        except OSError:         # the directory vanished while it was read
            pass
        raise FlushIncomplete(
            f"the bcache device on {origin_node} stopped before its dirty data was written "
            f"back (a failing origin stops it: see `dmesg`); the cache set {cset}, the "
            "mapping entry and the boot unit are kept",
            hint="fix the origin, `hotcache restore` to register it again, then run "
                 "teardown again")

    def diagnose() -> str:
        try:
            return _detach_stall(d, running)
        except OSError:
            return "the bcache device is gone"
    wait_drained(f"bcache to write back dirty data from {origin_node} and detach", remaining,
                 timeout=flush_timeout(), diagnose=diagnose,
                 hint="dirty data is still on the SSD; keep the cache and run teardown again "
                      "(HOTCACHE_FLUSH_TIMEOUT sets how long to wait)", **wait)


def _detach_progress(d: Path) -> tuple[int, str]:
    """(what is left, progress text) of a detach; OSError once the device is gone."""
    st = _get(d / "state")
    if st == "no cache":
        return 0, "detached"
    dirty = _get(d / "dirty_data")
    return sb.parse_human(dirty) + 1, f"state {st}, {dirty} dirty"


def _detach_stall(d: Path, running: Path) -> str:
    rate = d / "writeback_rate"
    return (f"state {_get(d / 'state')}, {_get(d / 'dirty_data')} dirty, writeback "
            f"running {_get(running) if running.exists() else '?'}, rate "
            f"{_get(rate) if rate.exists() else '?'}. An origin that returns I/O errors "
            "holds it (see `dmesg`). The cache set and its dirty data are kept: fix the "
            "origin, then run teardown again")


def stop_backing(host: Host, origin_node: str) -> None:
    d = host.path(sb.bdev_dir(host, origin_node))
    if d.is_dir():
        (d / "stop").write_text("1")
    wait_until(f"bcache to stop the device on {origin_node}",
               lambda: (not d.is_dir(), "still registered"), timeout=REGISTER_TIMEOUT)


def unregister_set(host: Host, cset: str) -> None:
    """Unregister a cache set that no backing device uses any more: a set with a backing
    device still attached may hold its dirty data, and unregistering it loses that."""
    d = host.path(sb.set_dir(cset))
    attached = sorted(p.name for p in d.glob("bdev*")) if d.is_dir() else []
    if attached:
        raise FlushIncomplete(f"cache set {cset} still has {', '.join(attached)} attached and "
                              "may hold its dirty data; it was not unregistered",
                              hint="run teardown again once the detach has finished")
    if d.is_dir():
        (d / "unregister").write_text("1")
    wait_until(f"bcache to unregister cache set {cset}",
               lambda: (not d.is_dir(), "still registered"), timeout=REGISTER_TIMEOUT)


def _get(path: Path) -> str:
    """A sysfs attribute of a device that may go away (OSError then)."""
    return path.read_text().strip()

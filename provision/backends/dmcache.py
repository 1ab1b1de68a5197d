"""Backend `dm-cache`: raw device-mapper tables through dmsetup.

The SSD is split by two linear targets into metadata (sized by `cache_metadata_size`) and
data; a `cache` target joins them with the origin (hc-NAME-cache). The origin starts
with hotcache's header, and the filesystem lives 1 MiB in, where the top device
(hc-NAME, a linear target on the cache device) maps it: the bare origin never shows a
filesystem that `mount -a` or a rescue system could mount without its cache, stale.
A cache built before this layout (the cache target itself hc-NAME, its filesystem at
the origin's start) keeps its own, as its recorded names and `fs_offset` 0 say.

Tables vanish at reboot, so the geometry is kept in the mapping and `hotcache restore`
loads the same tables again (the metadata is zeroed only when the cache is first built,
never on restore).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hotcache.provision.backends.parts.dmflush import MIN_MIGRATION, ensure_writeback, wait_clean
from hotcache.provision.backends.parts.dmtable import (CacheTable, cache_stats, parse_status,
                                                 parse_table, status_failure)
from hotcache.provision.block import blockdev, header, probe
from hotcache.provision.errors import HotcacheError, ProbeFailed
from hotcache.provision.plan import Ref, RunContext
from hotcache.provision.records import CacheEntry, DmCacheState, EntryState
from hotcache.provision.system.runner import Runner
from hotcache.provision.backends.parts import state
from hotcache.provision.backends.base import Backend, Failure, Nodes, Signature, present_origin
from hotcache.provision.backends.parts.stats import CacheStats

if TYPE_CHECKING:
    from hotcache.provision.backends.parts.contract import CacheSpec, Device, Planner

DEFAULT_BLOCK = 64 * 1024     # bytes: small blocks suit many small dataset files
MIB = 2048                    # sectors
FS_OFFSET = MIB               # sectors of the origin before the filesystem: the header's


def dm_names(cache: str, *, layered: bool = True) -> dict[str, str]:
    """The device-mapper names of cache `cache`'s devices. `layered`: the top device
    maps the filesystem past the origin's header; otherwise (a cache built before) the
    cache target is the top device."""
    base = f"hc-{cache}"
    if not layered:
        return {"cache": base, "meta": f"{base}-meta", "data": f"{base}-data"}
    return {"top": base, "cache": f"{base}-cache", "meta": f"{base}-meta",
            "data": f"{base}-data"}


def names_of(entry: CacheEntry) -> dict[str, str]:
    """The recorded names, else the layout's: a build records the origin header's
    offset before it creates any device, so a cache without one has the layout from
    before the header (an older version's record of an origin waiting for a new SSD)."""
    st = state.of(entry, DmCacheState)
    return st.names or dm_names(entry.spec.get("name", ""), layered=bool(st.fs_offset))


def top_table(origin_sectors: int, cache_dev: str, offset: int) -> str:
    """The top device's table: the cache device from `offset` on, where the filesystem is."""
    return f"0 {origin_sectors - offset} linear {cache_dev} {offset}"


def live_table(name: str, runner: Runner) -> str | None:
    """The loaded table of dm device `name`; None only when dmsetup says it does not
    exist (any other failure raises: probes fail closed)."""
    try:
        res = probe.run(runner, ["dmsetup", "table", name], absent_rc=(1,),
                        absent_stderr=("does not exist", "No such device or address"))
    except ProbeFailed as exc:
        # For `table` libdm takes the kernel's ENXIO (no device of that name) quietly, so
        # dmsetup prints nothing but its closing line (seen in the guest kernel, Debian
        # 12); every real failure says more before that line.
        if exc.returncode == 1 and (exc.stderr or "").strip() == "Command failed.":
            return None
        raise
    return res.stdout.strip() or None if res is not None else None


def metadata_sectors(runner: Runner, ssd_sectors: int, block: int) -> int:
    """`cache_metadata_size` for the whole SSD, rounded up to whole MiB."""
    res = runner.query(["cache_metadata_size", "--block-size", str(block),
                        "--device-size", str(ssd_sectors), "--max-hint-width", "4"])
    m = re.search(r"(\d+)\s*sectors", res.stdout)
    if not m:
        raise HotcacheError(f"cannot read the output of cache_metadata_size: {res.stdout!r}")
    return -(-int(m.group(1)) // MIB) * MIB


def _text(p: Planner, key: str, render: Callable[..., str], *nodes: str | Ref) -> str | Ref:
    """A table naming device nodes; when a node is only known at run time (a loop device
    not attached yet), a step fills it in then."""
    if all(isinstance(n, str) for n in nodes):
        return render(*nodes)
    shown = render(*(str(n) for n in nodes))
    p.do(f"fill in the table `{shown}` with the attached device",
         lambda ctx: ctx.refs.__setitem__(key, render(*(ctx.resolve(n) for n in nodes))))
    return Ref(key, shown)


class DmCache(Backend):
    def _dm_name(self, kname: str) -> str | None:
        """The device-mapper name of kernel device `kname` (a holder), None if not dm."""
        return self.host.read(f"/sys/class/block/{kname}/dm/name")

    name = "dm-cache"
    modes = ("writethrough", "writeback", "passthrough")
    tunables = {"block_size": int, "policy": str, "migration_threshold": int}
    restores_at_boot = True     # raw tables vanish at reboot
    restore_why = "its device-mapper table is gone after a reboot"
    kernel_feature = "device-mapper"
    modules = ("dm-cache", "dm-cache-smq")
    promotes_gradually = True   # smq
    fails_over = True           # its top dm device is switched to the origin in place
    attaches_on_origin = True   # ... and a new SSD's cache table loaded in its place
    programs = ("dmsetup", "cache_metadata_size", "mkfs.xfs", "dd", "wipefs")

    def owns(self, entry: CacheEntry | None, dev: Device) -> bool:
        st = state.of(entry, DmCacheState)
        recorded = entry.filesystem.uuid if entry is not None else None
        if dev.role == "origin" and dev.proven and recorded and dev.fs.get("UUID") == recorded:
            return True     # also an origin waiting for a new SSD (no geometry recorded)
        if dev.role == "origin" and dev.proven and st.origin_header_uuid \
                and self._header_uuid(dev) == st.origin_header_uuid:
            return True     # the header hotcache wrote in front of the filesystem
        if not st.data_sectors:
            return False
        if not dev.proven:
            return False    # the metadata has no signature: only identity tells whose it is
        holders = dev.report.holders if dev.report else []
        names = set((st.names or {}).values())
        return bool(holders) and all(self._dm_name(h) in names for h in holders) \
            or (dev.role == "cache" and not dev.fs)

    def _header_uuid(self, dev: Device) -> str | None:
        """The UUID in hotcache's header at the start of `dev` (None: none, or the device
        is not attached yet or cannot be read, which proves nothing)."""
        if not isinstance(dev.node, str):
            return None
        try:
            found = header.read(self.host, dev.node)
        except OSError:
            return None
        return found["uuid"] if found else None

    def signature(self, entry: CacheEntry, role: str) -> Signature | None:
        origin_claim = state.of(entry, DmCacheState).origin_header_uuid
        if role == "origin" and origin_claim:
            # the filesystem starts after the header, so blkid shows none on the origin
            return (header.TYPE, origin_claim)
        if role == "cache":
            # dm-cache metadata carries nothing blkid knows: hotcache's header proves the
            # SSD (a cache built before there was one has none)
            uuid_ = state.of(entry, DmCacheState).header_uuid
            return (header.TYPE, uuid_) if uuid_ else ()
        # In writeback the block holding the XFS superblock may be dirty on the SSD only,
        # so the origin may show nothing; another signature is still a conflict.
        return ("xfs", entry.filesystem.uuid, "may be absent")

    def live(self, entry: CacheEntry, nodes: Nodes) -> str | None:
        names = names_of(entry)
        if live_table(names["cache"], self.host.runner) is None:
            return f"its dm-cache table {names['cache']} is not loaded"
        if "top" in names and live_table(names["top"], self.host.runner) is None:
            return f"its top device {names['top']}, which maps the filesystem, is not loaded"
        return None

    def keeps_filesystem(self, entry: CacheEntry | None, devs: Mapping[str, Device]) -> bool:
        recorded = entry and entry.filesystem.uuid
        origin = devs["origin"]
        if not (origin.proven and recorded):
            return False
        st = state.of(entry, DmCacheState)
        if origin.fs.get("UUID") == recorded:
            return True
        # behind this cache's header, the filesystem itself (a first build stopped
        # between the header and the format has none yet)
        if not (st.fs_offset and st.origin_header_uuid and isinstance(origin.node, str)
                and self._header_uuid(origin) == st.origin_header_uuid):
            return False
        inner = blockdev.fs_identity(self.host, origin.node, offset=st.fs_offset * 512)
        return inner.get("UUID") == recorded

    def fs_offset(self, entry: CacheEntry | None, origin: Device) -> int:
        """Where the filesystem starts on the origin (sectors): as recorded for a cache
        built or waiting for a new SSD; 0 for an origin that shows the recorded
        filesystem at its start (a cache built before the header, kept); else past the
        header hotcache writes in front of a new filesystem."""
        st = state.of(entry, DmCacheState)
        if st.data_sectors or st.fs_offset is not None:
            return st.fs_offset or 0
        if st.names is not None and "top" not in st.names:
            return 0
        recorded = entry.filesystem.uuid if entry is not None else None
        if recorded and origin.fs.get("UUID") == recorded:
            return 0
        return FS_OFFSET

    def geometry(self, p: Planner, spec: CacheSpec, entry: CacheEntry | None,
                 devs: Mapping[str, Device]) -> dict[str, Any]:
        st = state.of(entry, DmCacheState)
        if st.data_sectors:
            return {"block_sectors": st.block_sectors, "meta_sectors": st.meta_sectors,
                    "data_sectors": st.data_sectors, "header_sectors": st.header_sectors or 0,
                    "fs_offset": st.fs_offset or 0}
        block = int(spec.tunables.get("block_size", DEFAULT_BLOCK))
        if block % 32768 or not 32768 <= block <= 2**30:
            p.refuse(f"{spec.name}.tunables.block_size: {block} must be a multiple of 32768 "
                     "bytes (32 KiB) between 32 KiB and 1 GiB")
            block = DEFAULT_BLOCK
        block //= 512
        ssd = devs["cache"].size // 512 - header.SECTORS
        meta = metadata_sectors(self.host.runner, ssd, block)
        data = (ssd - meta) // block * block
        if data < 16 * block:
            p.refuse(f"{spec.name}.cache: the SSD is too small for dm-cache with {block * 512} "
                     "byte blocks")
        return {"block_sectors": block, "meta_sectors": meta, "data_sectors": data,
                "header_sectors": header.SECTORS, "fs_offset": self.fs_offset(entry, devs["origin"])}

    def build(self, p: Planner, spec: CacheSpec, entry: CacheEntry | None,
              devs: Mapping[str, Device]) -> str | Ref:
        st = state.of(entry, DmCacheState)
        runner = self.host.runner
        origin, cache = devs["origin"], devs["cache"]
        geo = self.geometry(p, spec, entry, devs)
        offset = geo["fs_offset"]
        names = st.names or dm_names(spec.name, layered=bool(offset))
        top = f"/dev/mapper/{names.get('top', names['cache'])}"
        if p.refusals:
            return top
        # Metadata is zeroed only for a cache never built: once the geometry is recorded
        # the metadata describes blocks (dirty ones in writeback) that must not be lost.
        fresh = not st.data_sectors
        meta, data, head = geo["meta_sectors"], geo["data_sectors"], geo["header_sectors"]
        want = CacheTable(origin.size // 512, f"/dev/mapper/{names['meta']}",
                          f"/dev/mapper/{names['data']}", "ORIGIN", geo["block_sectors"],
                          spec.effective_mode, [], str(spec.tunables.get("policy", "smq")),
                          _policy_args(spec.tunables))
        current = live_table(names["cache"], runner)
        # The cache device switched to a linear mapping of the origin after the SSD failed
        # (parts/failover.py), the filesystem still mounted above it: a new SSD is attached
        # under it by loading a cache table in its place, as the switch loaded the linear.
        online = current is not None and self._on_origin(current, origin)
        if current is not None and not online and current.split()[2:3] != ["cache"]:
            p.refuse(f"{spec.name}: {names['cache']} holds `{current}`, neither the cache "
                     "table hotcache loads nor a linear mapping of the whole origin; nothing "
                     f"was changed. `dmsetup table {names['cache']}` shows it")
            return top
        if online and not fresh and (entry is None or entry.state != EntryState.BUILDING):
            # Only an attach that recorded the new SSD's geometry and stopped (state
            # `building`) goes on from here; a built cache whose record lacks the switch
            # would get its failed SSD's maps back, with metadata older than the origin.
            p.refuse(f"{spec.name}: {names['cache']} maps its origin linearly, as the "
                     "fail-over leaves a cache whose SSD failed, but the mapping does not "
                     f"record that; nothing was changed. `hotcache teardown {spec.name} "
                     "--cache-failed` takes the failed cache apart (it unmounts the "
                     "filesystem); then name a new SSD in the spec and apply")
            return top
        top_now = live_table(names["top"], runner) if "top" in names else None
        if top_now is not None and not self._top_over_cache(top_now, names, origin, offset):
            p.refuse(f"{spec.name}: {names['top']} holds `{top_now}`, not the mapping hotcache "
                     f"loads (the filesystem {offset // MIB} MiB into {names['cache']}); "
                     f"nothing was changed. If it maps the origin by hand, unmount it and "
                     f"`dmsetup remove {names['top']}`, then apply again")
            return top
        recorded_now = False
        if fresh and offset and not st.origin_header_uuid:
            self._write_header(p, spec.name, origin.node, role="origin", offset=offset)
        if current is None or online:
            if fresh:
                p.command(f"erase old signatures on the cache device {cache.ref.label}",
                      ["wipefs", "--all", cache.node], destructive=True)
                self._write_header(p, spec.name, cache.node)
            for part, start, length in (("meta", head, meta), ("data", head + meta, data)):
                if online and fresh and live_table(names[part], runner) is not None:
                    # the failed SSD's map, which the linear mapping no longer uses; --force
                    # swaps in the error target, so nothing waits on that SSD
                    p.command(f"remove the failed SSD's cache {part} mapping",
                              ["dmsetup", "remove", "--force", "--retry", names[part]])
                if live_table(names[part], runner) is None or (online and fresh):
                    table = _text(p, f"dm-{part}:{spec.name}",
                                  lambda n, s=start, size=length: f"0 {size} linear {n} {s}",
                                  cache.node)
                    p.command(f"map {length // MIB} MiB of the SSD as cache {part}data"
                          if part == "meta" else f"map {length // MIB} MiB of the SSD as "
                          "cache blocks", ["dmsetup", "create", names[part], "--table", table])
            if fresh:
                p.command("zero the metadata superblock (a new, empty cache)",
                      ["dd", "if=/dev/zero", f"of=/dev/mapper/{names['meta']}", "bs=4096",
                       "count=1", "oflag=direct"], destructive=True)
            table = _text(p, f"dm-cache:{spec.name}",
                          lambda n: dataclasses.replace(want, origin=n).render(), origin.node)
            if online:
                # Recorded before the cache goes live under the mounted filesystem: from
                # then on its metadata may describe dirty blocks, and a rerun must never
                # take it for a cache not built yet.
                self._remember_geometry(p, geo, names, want)
                recorded_now = True
                p.command(f"load a cache table ({spec.effective_mode}, policy {want.policy}, "
                          f"{want.block * 512 // 1024} KiB blocks) in place of the linear "
                          "mapping of the origin", ["dmsetup", "reload", names["cache"],
                                                    "--table", table])
                p.do("switch to it under the mounted filesystem (no unmount); if the "
                     "kernel refuses, the linear mapping runs on, never a suspended device",
                     lambda ctx: _resume_or_back(ctx, names["cache"]))
            else:
                p.command(f"create the cache device ({spec.effective_mode}, policy "
                          f"{want.policy}, {want.block * 512 // 1024} KiB blocks)",
                          ["dmsetup", "create", names["cache"], "--table", table])
        else:
            live = parse_table(current)
            if (live.mode, live.policy, live.policy_args) != (want.mode, want.policy,
                                                             want.policy_args):
                new = dataclasses.replace(live, mode=want.mode, policy=want.policy,
                                          policy_args=want.policy_args)
                p.command(f"load the table with mode {want.mode}, policy {want.policy} "
                      f"(was {live.mode}, {live.policy})",
                      ["dmsetup", "reload", names["cache"], "--table", new.render()])
                p.command("switch to the new table in place (no rebuild)",
                      ["dmsetup", "resume", names["cache"]])
        if "top" in names and top_now is None:
            p.command(f"create the top device {names['top']}: the cache device from "
                      f"{offset // MIB} MiB in, past hotcache's header on the origin, where "
                      "the filesystem is", ["dmsetup", "create", names["top"], "--table",
                      top_table(origin.size // 512, f"/dev/mapper/{names['cache']}", offset)])
            if fresh and not self.keeps_filesystem(entry, devs):
                # what an earlier filesystem left there (the spec's `wipe: true` covered
                # it: preflight finds it), so that the format starts clean
                p.command(f"erase old signatures on {top} (the origin from {offset // MIB} "
                          "MiB in)", ["wipefs", "--all", top], destructive=True)
        if not recorded_now and (st.data_sectors != data or st.names != names
                                 or (st.fs_offset or 0) != offset):
            self._remember_geometry(p, geo, names, want)
        return top

    @staticmethod
    def _remember_geometry(p: Planner, geo: dict[str, Any], names: dict[str, str],
                           want: CacheTable) -> None:
        state.remember(p, "record the dm-cache geometry and table names in the mapping",
                       lambda ctx: {**geo, "names": names,
                                    "table": want.render().replace("ORIGIN", "<origin>")})

    def _top_over_cache(self, table: str, names: dict[str, str], origin: Device,
                        offset: int) -> bool:
        """Whether the loaded top-device `table` is the one hotcache loads: its cache
        device from `offset` on, to the origin's end."""
        f = table.split()
        cache = f"/dev/mapper/{names['cache']}"
        if len(f) != 5 or f[2] != "linear" or f[4] != str(offset) \
                or f[1] != str(origin.size // 512 - offset) or not self.host.exists(cache):
            return False
        return f[3] in (self.host.devnum(cache), cache)

    def _on_origin(self, table: str, origin: Device) -> bool:
        """Whether the loaded `table` is the whole origin mapped linearly, as the fail-over
        leaves a cache whose SSD failed."""
        f = table.split()
        if len(f) != 5 or f[2] != "linear" or f[4] != "0" or not isinstance(origin.node, str):
            return False
        return f[1] == str(origin.size // 512) and f[3] in (self.host.devnum(origin.node),
                                                             origin.node)

    def _write_header(self, p: Planner, cache: str, node: str | Ref, *, role: str = "cache",
                      offset: int = 0) -> None:
        """hotcache's header at the start of the SSD (its first 4 KiB) or the origin (its
        first `offset` sectors, the rest zeroed: the filesystem starts after them), with
        a UUID drawn when it runs (a plan shows no random value), recorded as the
        device's signature."""
        def write(ctx: RunContext) -> dict[str, Any]:
            if ctx.runner.dry_run:
                return {}
            drawn = str(uuid.uuid4())
            if role == "origin":
                body = header.render(cache, self.name, drawn, role="origin",
                                     filesystem_offset_bytes=offset * 512)
                header.write(ctx.resolve(node), body.ljust(offset * 512, b"\0"))
                return {"origin_header_uuid": drawn, "fs_offset": offset}
            header.write(ctx.resolve(node), header.render(cache, self.name, drawn))
            return {"header_uuid": drawn}
        if role == "origin":
            state.remember(p, f"write hotcache's header (cache {cache}, a new UUID) in the "
                           f"first {offset // MIB} MiB of the origin, before the filesystem: "
                           "the bare origin never shows a filesystem to mount without the "
                           "cache, and the UUID proves which cache the origin is", write,
                           destructive_on=(node,))
            return
        state.remember(p, f"write hotcache's header (cache {cache}, a new UUID) in the first "
                       f"{header.SIZE // 1024} KiB of the SSD: it proves which cache the SSD "
                       "is, where serials can follow the slot", write)

    def stats(self, entry: CacheEntry, nodes: Nodes) -> CacheStats:
        names = names_of(entry)
        res = self.host.runner.run(["dmsetup", "status", names["cache"]])
        return cache_stats(parse_status(res.stdout))

    def failure(self, entry: CacheEntry, nodes: Nodes) -> Failure | None:
        names = names_of(entry)
        return status_failure(self.host.runner, ["dmsetup", "status", names["cache"]], entry)

    def failover_device(self, entry: CacheEntry) -> str | None:
        return names_of(entry)["cache"]

    def drop_failed_cache(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> str:
        origin = present_origin(nodes, p.cache)
        names = names_of(entry)
        # --force swaps in the error target first, so a table stuck on the failed SSD
        # (suspended, or failing its metadata commit) is removed without a flush.
        for part in ("top", "cache", "data", "meta"):
            if part in names and live_table(names[part], self.host.runner) is not None:
                p.command(f"remove the {part} mapping without a flush (the SSD failed)",
                      ["dmsetup", "remove", "--force", "--retry", names[part]])
        offset = state.of(entry, DmCacheState).fs_offset
        if not offset or "top" not in names:
            return origin           # a cache built before the header: the origin shows it
        # The filesystem starts past hotcache's header: mapped as the fail-over leaves it
        # (the cache device a linear mapping of the whole origin, the top device on it),
        # so a new SSD is attached under it as under a switched cache.
        # present_origin proved the origin against its record, its size included
        info = entry.devices["origin"]
        sectors, shown = info.size // 512, next(iter(info.by_id or []), origin)
        p.command(f"map the whole origin {origin} as {names['cache']}, without the failed "
                  "cache", ["dmsetup", "create", names["cache"], "--table",
                            f"0 {sectors} linear {origin} 0"])
        p.command(f"map the filesystem {offset // MIB} MiB into the origin as {names['top']}",
                  ["dmsetup", "create", names["top"], "--table",
                   top_table(sectors, f"/dev/mapper/{names['cache']}", offset)])
        p.plan.notes.append(
            f"{p.cache}: its filesystem starts {offset // MIB} MiB into the origin {origin}, "
            f"after hotcache's header; /dev/mapper/{names['top']} maps it until the next "
            f"boot. After a boot, `dmsetup create {names['cache']} --table '0 {sectors} "
            f"linear {shown} 0'` and then `dmsetup create {names['top']} --table '0 "
            f"{sectors - offset} linear /dev/mapper/{names['cache']} {offset}'` map it "
            "again, as `hotcache apply` with a new SSD finds it")
        return f"/dev/mapper/{names['top']}"

    def surviving_state(self, entry: CacheEntry) -> dict[str, Any]:
        # The origin keeps its header and the filesystem where it was; the device names
        # say which layout the new SSD's cache is built in (the metadata, the data and
        # the SSD's header are the failed SSD's, gone with it).
        st = state.of(entry, DmCacheState)
        kept = {"names": names_of(entry), "fs_offset": st.fs_offset,
                "origin_header_uuid": st.origin_header_uuid}
        return {key: value for key, value in kept.items() if value is not None}

    @classmethod
    def forget_loses(cls, entry: CacheEntry) -> list[str]:
        st = state.of(entry, DmCacheState)
        geometry = f"block {st.block_sectors} sectors, metadata {st.meta_sectors}, data " \
                   f"{st.data_sectors}"
        return [f"the dm-cache geometry ({geometry}) needed to load the cache again"] \
            if st.data_sectors else []

    def dismantle(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> None:
        runner = self.host.runner
        names = names_of(entry)
        current = live_table(names["cache"], runner)
        if current is not None:
            live = parse_table(current)
            cleaner = dataclasses.replace(live, policy="cleaner", policy_args=[])
            p.command("switch the cache to the cleaner policy, which writes every dirty block "
                  "back to the origin", ["dmsetup", "reload", names["cache"], "--table",
                                         cleaner.render()])
            p.command("activate the cleaner table", ["dmsetup", "resume", names["cache"]])
            p.do("check that the loaded table can write back (cleaner active, "
                 f"migration_threshold at least {MIN_MIGRATION})",
                 lambda ctx: None if ctx.runner.dry_run else ensure_writeback(names["cache"], ctx.runner))
            p.do("wait until the cache holds 0 dirty blocks",
                 lambda ctx: None if ctx.runner.dry_run else wait_clean(names["cache"], ctx.runner))
        if "top" in names and live_table(names["top"], runner) is not None:
            p.command("remove the top device (the filesystem's mapping)",
                      ["dmsetup", "remove", "--retry", names["top"]])
        if current is not None:
            p.command("remove the cache device", ["dmsetup", "remove", "--retry", names["cache"]])
        for part in ("data", "meta"):
            if live_table(names[part], runner) is not None:
                p.command(f"remove the cache {part} mapping",
                      ["dmsetup", "remove", "--retry", names[part]])
        # The header claims the SSD for this cache; once the cache is gone a new build
        # on it would read that claim as another cache's and refuse.
        node, claim = nodes.get("cache"), state.of(entry, DmCacheState).header_uuid
        if node and claim:
            def erase(ctx: RunContext) -> None:
                if not ctx.runner.dry_run:
                    header.erase(self.host, ctx.resolve(node), claim)
            p.do(f"erase hotcache's header (this cache's UUID) from the SSD {node}", erase)
        offset, origin = state.of(entry, DmCacheState).fs_offset, nodes.get("origin")
        if offset and origin:
            p.plan.notes.append(
                f"{origin} keeps the filesystem {offset // MIB} MiB in, after hotcache's "
                f"header: `losetup --find --show --offset {offset * 512} {origin}` gives a "
                "device that mounts it (`teardown --wipe` erases the header)")

    @classmethod
    def device_names(cls, cache: str, entry: CacheEntry | None) -> set[str]:
        if entry is not None and state.of(entry, DmCacheState).names:
            return set(names_of(entry).values())
        return {*dm_names(cache).values(), *dm_names(cache, layered=False).values()}

    def wipe_header(self, entry: CacheEntry, role: str) -> tuple[str, int] | None:
        st = state.of(entry, DmCacheState)
        if role != "origin" or not st.origin_header_uuid:
            return None
        # the header, and the filesystem's superblock behind it (blkid and mkfs look
        # there once a new top device maps it)
        return st.origin_header_uuid, ((st.fs_offset or 0) + MIB) * 512

    def hidden_signatures(self, entry: CacheEntry | None, dev: Device,
                          at: str) -> list[dict[str, Any]]:
        # Only where the filesystem will go behind the header: a cache built before it
        # keeps its filesystem at the origin's start, whose data is no signature.
        if dev.role != "origin" or not self.fs_offset(entry, dev):
            return []
        found = blockdev.fs_identity(self.host, at, offset=FS_OFFSET * 512)
        if not found.get("TYPE"):
            return []
        return [{"type": f"{found['TYPE']} {FS_OFFSET // MIB} MiB in, where the filesystem "
                         "goes behind hotcache's header"}]


def _resume_or_back(ctx: RunContext, name: str) -> None:
    """Resume dm device `name` with the table just loaded; if the kernel refuses it (a
    new SSD that fails at once), drop that table and resume the one that ran, so the
    filesystem above never waits on a suspended device."""
    if ctx.runner.dry_run:
        return
    try:
        ctx.runner.run(["dmsetup", "resume", name])
    except HotcacheError as exc:
        ctx.runner.run(["dmsetup", "clear", name], check=False)
        ctx.runner.run(["dmsetup", "resume", name], check=False)
        raise HotcacheError(f"the kernel refused the new cache table for {name}: "
                            f"{exc.message}; the linear mapping of the origin runs on",
                            hint="check the new SSD (`dmesg`), then apply again") from exc


def _policy_args(tunables: Mapping[str, int | str]) -> list[str]:
    if "migration_threshold" in tunables:
        return ["migration_threshold", str(tunables["migration_threshold"])]
    return []

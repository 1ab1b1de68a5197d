"""Backend `dm-cache`: raw device-mapper tables through dmsetup.

The SSD is split by two linear targets into metadata (sized by `cache_metadata_size`) and
data; a `cache` target joins them with the origin. Tables vanish at reboot, so the
geometry is kept in the mapping and `hotcache restore` loads the same tables again (the
metadata is zeroed only when the cache is first built, never on restore).
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
from hotcache.provision.block import header, probe
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


def dm_names(cache: str) -> dict[str, str]:
    base = f"hc-{cache}"
    return {"cache": base, "meta": f"{base}-meta", "data": f"{base}-data"}


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
        if not st.data_sectors:
            return False
        if not dev.proven:
            return False    # the metadata has no signature: only identity tells whose it is
        holders = dev.report.holders if dev.report else []
        names = set((st.names or {}).values())
        return bool(holders) and all(self._dm_name(h) in names for h in holders) \
            or (dev.role == "cache" and not dev.fs)

    def signature(self, entry: CacheEntry, role: str) -> Signature | None:
        if role == "cache":
            # dm-cache metadata carries nothing blkid knows: hotcache's header proves the
            # SSD (a cache built before there was one has none)
            uuid_ = state.of(entry, DmCacheState).header_uuid
            return (header.TYPE, uuid_) if uuid_ else ()
        # In writeback the block holding the XFS superblock may be dirty on the SSD only,
        # so the origin may show nothing; another signature is still a conflict.
        return ("xfs", entry.filesystem.uuid, "may be absent")

    def live(self, entry: CacheEntry, nodes: Nodes) -> str | None:
        names = state.of(entry, DmCacheState).names or dm_names(entry.spec.get("name", ""))
        if live_table(names["cache"], self.host.runner) is None:
            return f"its dm-cache table {names['cache']} is not loaded"
        return None

    def keeps_filesystem(self, entry: CacheEntry | None, devs: Mapping[str, Device]) -> bool:
        recorded = entry and entry.filesystem.uuid
        return devs["origin"].proven and bool(recorded) \
            and devs["origin"].fs.get("UUID") == recorded

    def geometry(self, p: Planner, spec: CacheSpec, st: DmCacheState,
                 devs: Mapping[str, Device]) -> dict[str, Any]:
        if st.data_sectors:
            return {"block_sectors": st.block_sectors, "meta_sectors": st.meta_sectors,
                    "data_sectors": st.data_sectors, "header_sectors": st.header_sectors or 0}
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
                "header_sectors": header.SECTORS}

    def build(self, p: Planner, spec: CacheSpec, entry: CacheEntry | None,
              devs: Mapping[str, Device]) -> str | Ref:
        st = state.of(entry, DmCacheState)
        runner = self.host.runner
        names = dm_names(spec.name)
        origin, cache = devs["origin"], devs["cache"]
        geo = self.geometry(p, spec, st, devs)
        if p.refusals:
            return f"/dev/mapper/{names['cache']}"
        # Metadata is zeroed only for a cache never built: once the geometry is recorded
        # the metadata describes blocks (dirty ones in writeback) that must not be lost.
        fresh = not st.data_sectors
        meta, data, head = geo["meta_sectors"], geo["data_sectors"], geo["header_sectors"]
        want = CacheTable(origin.size // 512, f"/dev/mapper/{names['meta']}",
                          f"/dev/mapper/{names['data']}", "ORIGIN", geo["block_sectors"],
                          spec.effective_mode, [], str(spec.tunables.get("policy", "smq")),
                          _policy_args(spec.tunables))
        current = live_table(names["cache"], runner)
        # The top device switched to a linear mapping of the origin after the SSD failed
        # (parts/failover.py), the filesystem still mounted on it: a new SSD is attached
        # under it by loading a cache table in its place, as the switch loaded the linear.
        online = current is not None and self._on_origin(current, origin)
        if current is not None and not online and current.split()[2:3] != ["cache"]:
            p.refuse(f"{spec.name}: {names['cache']} holds `{current}`, neither the cache "
                     "table hotcache loads nor a linear mapping of the whole origin; nothing "
                     f"was changed. `dmsetup table {names['cache']}` shows it")
            return f"/dev/mapper/{names['cache']}"
        if online and not fresh and (entry is None or entry.state != EntryState.BUILDING):
            # Only an attach that recorded the new SSD's geometry and stopped (state
            # `building`) goes on from here; a built cache whose record lacks the switch
            # would get its failed SSD's maps back, with metadata older than the origin.
            p.refuse(f"{spec.name}: {names['cache']} maps its origin linearly, as the "
                     "fail-over leaves a cache whose SSD failed, but the mapping does not "
                     f"record that; nothing was changed. `hotcache teardown {spec.name} "
                     "--cache-failed` takes the failed cache apart (it unmounts the "
                     "filesystem); then name a new SSD in the spec and apply")
            return f"/dev/mapper/{names['cache']}"
        recorded_now = False
        if current is None or online:
            if fresh:
                p.command(f"erase old signatures on the cache device {cache.ref.label}",
                      ["wipefs", "--all", cache.node], destructive=True)
                self._write_header(p, spec.name, cache.node)
            for part, start, length in (("meta", head, meta), ("data", head + meta, data)):
                if online and fresh and live_table(names[part], runner) is not None:
                    # the failed SSD's map, which the linear top no longer uses; --force
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
        if not recorded_now and (st.data_sectors != data or st.names != names):
            self._remember_geometry(p, geo, names, want)
        return f"/dev/mapper/{names['cache']}"

    @staticmethod
    def _remember_geometry(p: Planner, geo: dict[str, Any], names: dict[str, str],
                           want: CacheTable) -> None:
        state.remember(p, "record the dm-cache geometry and table names in the mapping",
                       lambda ctx: {**geo, "names": names,
                                    "table": want.render().replace("ORIGIN", "<origin>")})

    def _on_origin(self, table: str, origin: Device) -> bool:
        """Whether the loaded `table` is the whole origin mapped linearly, as the fail-over
        leaves a cache whose SSD failed."""
        f = table.split()
        if len(f) != 5 or f[2] != "linear" or f[4] != "0" or not isinstance(origin.node, str):
            return False
        return f[1] == str(origin.size // 512) and f[3] in (self.host.devnum(origin.node),
                                                             origin.node)

    def _write_header(self, p: Planner, cache: str, node: str | Ref) -> None:
        """hotcache's header in the first 4 KiB of the SSD, with a UUID drawn when it runs
        (a plan shows no random value), recorded as the SSD's signature."""
        def write(ctx: RunContext) -> dict[str, Any]:
            if ctx.runner.dry_run:
                return {}
            drawn = str(uuid.uuid4())
            header.write(ctx.resolve(node), header.render(cache, self.name, drawn))
            return {"header_uuid": drawn}
        state.remember(p, f"write hotcache's header (cache {cache}, a new UUID) in the first "
                       f"{header.SIZE // 1024} KiB of the SSD: it proves which cache the SSD "
                       "is, where serials can follow the slot", write)

    def stats(self, entry: CacheEntry, nodes: Nodes) -> CacheStats:
        names = state.of(entry, DmCacheState).names or dm_names(entry.spec["name"])
        res = self.host.runner.run(["dmsetup", "status", names["cache"]])
        return cache_stats(parse_status(res.stdout))

    def failure(self, entry: CacheEntry, nodes: Nodes) -> Failure | None:
        names = state.of(entry, DmCacheState).names or dm_names(entry.spec["name"])
        return status_failure(self.host.runner, ["dmsetup", "status", names["cache"]], entry)

    def failover_device(self, entry: CacheEntry) -> str | None:
        return (state.of(entry, DmCacheState).names or dm_names(entry.spec["name"]))["cache"]

    def drop_failed_cache(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> str:
        origin = present_origin(nodes, p.cache)
        names = state.of(entry, DmCacheState).names or dm_names(p.cache)
        # --force swaps in the error target first, so a table stuck on the failed SSD
        # (suspended, or failing its metadata commit) is removed without a flush.
        for part in ("cache", "data", "meta"):
            if live_table(names[part], self.host.runner) is not None:
                p.command(f"remove the {part} mapping without a flush (the SSD failed)",
                      ["dmsetup", "remove", "--force", "--retry", names[part]])
        return origin

    @classmethod
    def forget_loses(cls, entry: CacheEntry) -> list[str]:
        st = state.of(entry, DmCacheState)
        geometry = f"block {st.block_sectors} sectors, metadata {st.meta_sectors}, data " \
                   f"{st.data_sectors}"
        return [f"the dm-cache geometry ({geometry}) needed to load the cache again"] \
            if st.data_sectors else []

    def dismantle(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> None:
        runner = self.host.runner
        names = state.of(entry, DmCacheState).names or dm_names(p.cache)
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

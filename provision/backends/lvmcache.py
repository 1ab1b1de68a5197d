"""Backend `lvmcache`: lvm2 builds the dm-cache.

Two ways in:
- the origin is a whole device: a volume group `hc_<name>` gets the origin LV `data` (on
  the HDD) and a cache volume (on the SSD), and hotcache formats `data`;
- the origin is an existing LV that already holds a filesystem: the SSD joins that LV's
  volume group and the cache is attached to the LV in place, without reformatting it
  (this backend's advantage over bcache, whose backing device needs its own superblock).
Either way `lvconvert --type cache --cachevol` attaches the cache. LVM keeps its metadata
on the PVs, so after a boot only the activation is missing, which `hotcache restore` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from hotcache.provision.backends.parts.dmflush import MIN_MIGRATION, ensure_writeback, wait_clean
from hotcache.provision.backends.parts.dmtable import (cache_stats, live_mode, parse_status,
                                                     status_failure)
from hotcache.provision.block import probe
from hotcache.provision.block.host import Host
from hotcache.provision.errors import HotcacheError, ProbeFailed, RefusedError
from hotcache.provision.records import CacheEntry, EntryState, LvmCacheState
from hotcache.provision.backends.parts import state
from hotcache.provision.backends.base import Backend, Failure, Nodes, Signature
from hotcache.provision.backends.parts.stats import CacheStats
from hotcache.provision.plan import Ref, RunContext

if TYPE_CHECKING:
    from hotcache.provision.backends.parts.contract import CacheSpec, Device, Planner

ORIGIN_LV = "data"


def vg_name(cache: str) -> str:
    return f"hc_{cache}"


def cache_lv(origin_lv: str) -> str:
    return f"{origin_lv}_hccache"


# An argv's words: all strings for a probe run now, or with nodes known only once an
# earlier step ran (Ref) for a planned step.
Word = TypeVar("Word", str, "str | Ref")


def lvm(host: Host, command: str, *args: Word) -> list[Word]:
    """An lvm2 command that never asks (--yes is passed by callers) and, on hosts without
    a devices file, sees every device (a fresh guest or host may not list new disks)."""
    argv: list[Word] = [command]
    if not host.exists("/etc/lvm/devices/system.devices"):
        argv += ["--config", "devices { use_devicesfile=0 }"]
    argv.extend(args)
    return argv


# What lvm2 says (exit 5) when the VG, LV or PV asked about is not there: only these
# read as "absent"; any other failure is an error (probes fail closed).
LVM_ABSENT = ("not found", "Failed to find")


def report(host: Host, what: str, fields: str, *targets: str) -> list[dict[str, Any]]:
    res = probe.run(host.runner, lvm(host, what, "--reportformat", "json", "-o", fields,
                                     *targets), absent_rc=(5,), absent_stderr=LVM_ABSENT)
    if res is None:
        return []
    try:
        rows = probe.json_doc(res)["report"][0].get(what[:-1], [])   # lvs -> "lv"
    except (KeyError, IndexError, TypeError, AttributeError):
        rows = None
    if not isinstance(rows, list):
        raise ProbeFailed(res.argv, 0, res.stderr, why="its JSON is not an lvm2 report")
    return rows


def lv_info(host: Host, vg: str, lv: str) -> dict[str, Any] | None:
    rows = report(host, "lvs", "lv_name,lv_attr,segtype,cache_mode,cache_policy,"
                  "kernel_cache_settings,vg_uuid,lv_uuid", f"{vg}/{lv}")
    return rows[0] if rows else None


def same_lvm(entry: CacheEntry | None, info: dict[str, Any] | None, vg: str, lv: str) -> None:
    """The VG and LV under the recorded names are the ones hotcache built (or adopted):
    names are all lvm2 needs, and another host's disk can bring a VG of the same name.
    Refused (nothing changed) when a recorded UUID differs."""
    st = state.of(entry, LvmCacheState)
    if info is None:
        return
    for what, key, want, name in (("volume group", "vg_uuid", st.vg_uuid, vg),
                                  ("logical volume", "lv_uuid", st.lv_uuid, f"{vg}/{lv}")):
        have = info.get(key)
        if want and have != want:
            raise RefusedError(f"the {what} {name} is not the one hotcache recorded: its "
                               f"UUID is {have or 'unknown'}, recorded {want}; nothing was "
                               "changed",
                               hint=f"`vgs -o vg_name,vg_uuid,pv_name` shows which disks "
                                    f"carry {vg}; rename or remove the other one, or put "
                                    "the recorded disks back")


def uuids(host: Host, vg: str, lv: str, pvs: dict[str, str]) -> dict[str, Any]:
    """backend_state's identities of a built cache: the PV UUID of each device hotcache
    made a PV (role -> UUID, what blkid shows as the device's LVM2_member UUID), and the
    VG and LV UUIDs."""
    out: dict[str, Any] = {"pv_uuids": {}}
    for role, node in pvs.items():
        rows = report(host, "pvs", "pv_name,pv_uuid,vg_name", node)
        if not rows or rows[0].get("vg_name") != vg or not rows[0].get("pv_uuid"):
            raise ProbeFailed(["pvs", node], 0, "", why=f"it does not show {node} as a PV "
                              f"of {vg} after the build")
        out["pv_uuids"][role] = rows[0]["pv_uuid"]
    info = lv_info(host, vg, lv)
    if not info or not info.get("vg_uuid") or not info.get("lv_uuid"):
        raise ProbeFailed(["lvs", f"{vg}/{lv}"], 0, "", why="it shows no VG/LV UUID")
    out["vg_uuid"], out["lv_uuid"] = info["vg_uuid"], info["lv_uuid"]
    return out


def missing_pvs(host: Host, vg: str) -> int:
    """How many PVs of `vg` LVM cannot find (a dead or unreadable disk)."""
    rows = report(host, "vgs", "vg_name,vg_missing_pv_count", vg)
    return int(rows[0].get("vg_missing_pv_count") or 0) if rows else 0


def _dirty_bytes(host: Host, argv: list[str] | None) -> int | None:
    """Dirty bytes the active cache's kernel status reports; None: it reports none."""
    if argv is None:
        return None
    try:
        res = host.runner.run(argv, check=False, timeout=10)
        st = parse_status(res.stdout) if res.returncode == 0 else None
        return st["dirty_blocks"] * st["block_sectors"] * 512 if st else None
    except (HotcacheError, IndexError, ValueError, KeyError, TypeError):
        return None


def pv_vg(host: Host, node: str) -> str | None:
    rows = report(host, "pvs", "pv_name,vg_name", node)
    return rows[0].get("vg_name") if rows else None


def existing_lv(host: Host, node: str | Ref) -> tuple[str, str] | None:
    """(vg, lv) when `node` is an LVM logical volume (device-mapper uuid LVM-...)."""
    if not isinstance(node, str):
        return None
    if not (host.read(f"{host.sysfs(node)}/dm/uuid") or "").startswith("LVM-"):
        return None
    major, minor = host.devnum(node).split(":")
    rows = report(host, "lvs", "vg_name,lv_name", "--select",
                  f"lv_kernel_major={major} && lv_kernel_minor={minor}")
    return (rows[0]["vg_name"], rows[0]["lv_name"]) if rows else None


def names(host: Host, entry: CacheEntry | None, spec_name: str,
          origin: str | Ref | None = None) -> tuple[str, str, bool]:
    """(volume group, origin LV, adopted) for a cache: from the mapping once built."""
    st = state.of(entry, LvmCacheState)
    if st.vg:
        return st.vg, st.origin_lv or ORIGIN_LV, bool(st.adopted)
    found = existing_lv(host, origin) if origin is not None else None
    if found:
        return found[0], found[1], True
    return vg_name(spec_name), ORIGIN_LV, False


class LvmCache(Backend):
    name = "lvmcache"
    modes = ("writethrough", "writeback", "passthrough")
    tunables = {"chunk_size": int, "policy": str, "migration_threshold": int}
    restores_at_boot = True     # activation after a boot
    kernel_feature = "device-mapper"
    modules = ("dm-cache", "dm-cache-smq")
    promotes_gradually = True   # smq
    fails_over = True           # its top dm device is switched to the origin in place
    programs = ("pvcreate", "vgcreate", "vgextend", "vgreduce", "lvcreate", "lvconvert",
                "lvchange", "lvs", "dmsetup", "mkfs.xfs", "wipefs")

    def owns(self, entry: CacheEntry | None, dev: Device) -> bool:
        st = state.of(entry, LvmCacheState)
        if dev.role == "origin" and dev.fs.get("TYPE") == "xfs":
            lv = existing_lv(self.host, dev.node)
            if lv and st.adopted and lv == (st.vg, st.origin_lv):
                return True   # the LV this cache adopted (mounted by hotcache since)
            if lv and not st.vg and dev.report is not None \
                    and not dev.report.hard_problems():
                # An idle LV with data, named as origin of a cache not built yet: attach
                # the cache in place. A mounted, held or root LV goes through the
                # refusals like any device; once a VG is recorded, only its LV is ours.
                return True
        vg = st.vg
        if not vg or not dev.proven or dev.fs.get("TYPE") != "LVM2_member" \
                or not isinstance(dev.node, str):
            return False
        # The PV hotcache made, by its UUID where recorded: another PV in the same VG is
        # not this device.
        pv_uuid = (st.pv_uuids or {}).get(dev.role)
        if pv_uuid and dev.fs.get("UUID") != pv_uuid:
            return False
        return pv_vg(self.host, dev.node) == vg

    def signature(self, entry: CacheEntry, role: str) -> Signature | None:
        st = state.of(entry, LvmCacheState)
        if role == "origin" and st.adopted:
            return ("xfs", entry.filesystem.uuid)
        return ("LVM2_member", (st.pv_uuids or {}).get(role))

    def live(self, entry: CacheEntry, nodes: Nodes) -> str | None:
        vg, lv, _ = names(self.host, entry, entry.spec.get("name", ""))
        info = lv_info(self.host, vg, lv)
        if info is None:
            return f"LVM does not see the logical volume {vg}/{lv} (are its disks present?)"
        if info.get("segtype") == "cache" and info["lv_attr"][4:5] != "a":
            return f"the cached logical volume {vg}/{lv} is not active"
        return None

    def _dm_name(self, node: str) -> str:
        """The device-mapper name of the cached LV (what dmsetup status takes)."""
        name = self.host.read(f"{self.host.sysfs(node)}/dm/name")
        if name is None:
            raise FileNotFoundError(f"{node} is not an active device-mapper device")
        return name

    def adopted_fs_uuid(self, devs: Mapping[str, Device]) -> str | None:
        origin = devs["origin"]
        if origin.fs.get("TYPE") == "xfs" and existing_lv(self.host, origin.node):
            return origin.fs.get("UUID")
        return None

    def keeps_filesystem(self, entry: CacheEntry | None, devs: Mapping[str, Device]) -> bool:
        vg, lv, _ = names(self.host, entry, "", devs["origin"].node)
        return entry is not None and entry.state == EntryState.READY \
            and lv_info(self.host, vg, lv) is not None

    def build(self, p: Planner, spec: CacheSpec, entry: CacheEntry | None,
              devs: Mapping[str, Device]) -> str | Ref:
        h = self.host
        origin, cache = devs["origin"], devs["cache"]
        vg, lv, adopted = names(h, entry, spec.name, origin.node)
        info = lv_info(h, vg, lv)
        same_lvm(entry, info, vg, lv)
        if p.restoring and (info is None or info.get("segtype") != "cache"):
            p.refuse(self._missing(entry, vg, lv, info, devs))
            return f"/dev/{vg}/{lv}"
        if info is None and state.of(entry, LvmCacheState).vg and not adopted:
            # Built before (its VG recorded) and its LV is gone: renamed, removed, or its
            # VG not active. Re-creating it would erase both recorded PVs.
            p.refuse(self._missing(entry, vg, lv, info, devs, "apply"))
            return f"/dev/{vg}/{lv}"
        mode, policy = spec.effective_mode, str(spec.tunables.get("policy", "smq"))
        settings = _settings(spec.tunables)
        # The SSD joins an existing VG: the adopted LV's, or after a failed SSD was taken
        # out (teardown --cache-failed), the VG that still holds the origin LV.
        if (adopted or info is not None) \
                and not (isinstance(cache.node, str) and pv_vg(h, cache.node) == vg):
            p.command(f"erase old signatures on {cache.ref.label}",
                  ["wipefs", "--all", cache.node], destructive=True)
            p.command("make the SSD an LVM physical volume", lvm(h, "pvcreate", "--yes", cache.node),
                  destructive=True)
            p.command(f"add the SSD to the volume group {vg} of the existing LV {lv}",
                  lvm(h, "vgextend", "--yes", vg, cache.node))
        if info is None and not adopted:
            for dev in (origin, cache):
                p.command(f"erase old signatures on {dev.ref.label}",
                      ["wipefs", "--all", dev.node], destructive=True)
            p.command("make both devices LVM physical volumes",
                  lvm(h, "pvcreate", "--yes", origin.node, cache.node), destructive=True)
            p.command(f"create volume group {vg}", lvm(h, "vgcreate", "--yes", vg, origin.node,
                                                   cache.node))
            p.command(f"create the origin LV {vg}/{lv} on the whole origin",
                  lvm(h, "lvcreate", "--yes", "--name", lv, "--extents", "100%PVS", vg,
                      origin.node))
        elif info is not None and info["lv_attr"][4:5] != "a":
            p.command(f"activate volume group {vg}", lvm(h, "vgchange", "--activate", "y", vg))
        if not state.of(entry, LvmCacheState).vg:
            state.remember(p, f"record volume group {vg} in the mapping",
                           lambda ctx: {"vg": vg, "origin_lv": lv, "adopted": adopted})
        if info is None or info.get("segtype") != "cache":
            self._attach(p, spec, vg, lv, cache, mode, policy, settings)
        else:
            if info.get("cache_mode") != mode:
                p.command(f"change the cache mode to {mode} in place "
                      f"(was {info.get('cache_mode')})",
                      lvm(h, "lvchange", "--yes", "--cachemode", mode, f"{vg}/{lv}"))
            have = dict(kv.split("=", 1) for kv in
                        (info.get("kernel_cache_settings") or "").split(",") if "=" in kv)
            if info.get("cache_policy") != policy or any(have.get(k) != v for k, v in
                                                         settings.items()):
                p.command(f"change the cache policy to {policy} in the LVM metadata",
                      lvm(h, "lvchange", "--yes", "--cachepolicy", policy,
                          *_settings_args(settings), f"{vg}/{lv}"))
                p.command("load it into the active cache in place (lvchange alone does not)",
                      lvm(h, "lvchange", "--yes", "--refresh", f"{vg}/{lv}"))
        st = state.of(entry, LvmCacheState)
        # The first build records what it made, by UUID; so does a new SSD attached to an
        # LV whose failed cache was taken off (its PV joins the recorded ones).
        known = dict(st.pv_uuids or {})
        if not st.vg or (entry is not None and entry.state != EntryState.READY and "cache" not in known):
            made_pvs = {"cache": cache.node} if adopted else {"origin": origin.node,
                                                              "cache": cache.node}
            pvs = {r: n for r, n in made_pvs.items() if r not in known}

            def made(ctx: RunContext) -> dict[str, Any]:
                if ctx.runner.dry_run:
                    return {}
                found = uuids(h, vg, lv, {r: ctx.resolve(n) for r, n in pvs.items()})
                return {**found, "pv_uuids": {**known, **found["pv_uuids"]}}
            state.remember(p, "record the PV, VG and LV UUIDs in the mapping (a later "
                           "restore or teardown checks them)", made)
        return f"/dev/{vg}/{lv}"

    def _missing(self, entry: CacheEntry | None, vg: str, lv: str, info: dict[str, Any] | None,
                 devs: Mapping[str, Device],
                 command: str = "restore") -> str:
        """Why restore cannot re-assemble this cache, naming what is missing (restore
        never builds: re-creating it would erase what the disks hold)."""
        st = state.of(entry, LvmCacheState)
        name = entry.spec.get("name", "") if entry else ""
        if info is not None:
            return (f"{name}: the logical volume {vg}/{lv} is there but no longer cached "
                    f"(segment type {info.get('segtype') or 'unknown'}); restore only "
                    "re-assembles what the mapping records and attaches nothing. "
                    f"`hotcache teardown {name} --forget`, then `hotcache apply SPEC`, "
                    "attaches a new cache to it")
        where = []
        for role, dev in devs.items():
            if isinstance(dev.node, str):
                in_vg = pv_vg(self.host, dev.node)
                where.append(f"the {role} {dev.node} is {'a PV of ' + in_vg if in_vg else 'not a PV'}")
        return (f"{name}: the logical volume {vg}/{lv} (LV UUID {st.lv_uuid or 'not recorded'}) "
                f"is not found ({'; '.join(where)}). {command.capitalize()} never "
                "rebuilds a recorded cache, so nothing was created or erased. If it was "
                f"renamed, `lvs -o lv_name,lv_uuid {vg}` shows it and `lvrename {vg} "
                f"NEW-NAME {lv}` gives it back its recorded name; if its volume group is "
                f"not active, `vgchange --activate y {vg}`; then run `hotcache {command}` "
                "again")

    def _attach(self, p: Planner, spec: CacheSpec, vg: str, lv: str, cache: Device, mode: str,
                policy: str, settings: dict[str, str]) -> None:
        """Put a cache volume on the SSD and attach it to the origin LV; lvconvert keeps
        the LV's content."""
        cvol, h = cache_lv(lv), self.host
        if not report(self.host, "lvs", "lv_name", f"{vg}/{cvol}"):
            p.command(f"create the cache volume {vg}/{cvol} on the whole SSD",
                  lvm(h, "lvcreate", "--yes", "--name", cvol, "--extents", "100%PVS", vg,
                      cache.node))
        chunk = spec.tunables.get("chunk_size")
        p.command(f"attach {vg}/{cvol} as a {mode} cache of {vg}/{lv}",
              lvm(h, "lvconvert", "--yes", "--type", "cache", "--cachevol", f"{vg}/{cvol}",
                  "--cachemode", mode, "--cachepolicy", policy,
                  *(["--chunksize", f"{int(chunk) // 1024}k"] if chunk else []),
                  *_settings_args(settings), f"{vg}/{lv}"))

    def stats(self, entry: CacheEntry, nodes: Nodes) -> CacheStats:
        vg, lv, _ = names(self.host, entry, entry.spec["name"])
        major, minor = self.host.devnum(f"/dev/{vg}/{lv}").split(":")
        res = self.host.runner.run(["dmsetup", "status", "-j", major, "-m", minor])
        return cache_stats(parse_status(res.stdout))

    def failure(self, entry: CacheEntry, nodes: Nodes) -> Failure | None:
        vg, lv, _ = names(self.host, entry, entry.spec["name"])
        try:
            rows = report(self.host, "lvs", "lv_health_status,lv_attr", f"{vg}/{lv}")
        except ProbeFailed:
            rows = []           # live() and status report what lvs cannot see
        health = (rows[0].get("lv_health_status") or "") if rows else ""
        kernel = self._kernel_status(vg, lv)
        if health in ("partial", "failed", "refresh needed"):
            # The mode the kernel runs, or for an inactive LV the one LVM would load
            mode = live_mode(self.host.runner, kernel) if kernel else \
                (lv_info(self.host, vg, lv) or {}).get("cache_mode")
            return Failure(f"LVM reports {vg}/{lv} {health}"
                           + (" (a PV of its volume group is missing)" if health == "partial"
                              else ""), _dirty_bytes(self.host, kernel), mode)
        return status_failure(self.host.runner, kernel, entry) if kernel else None

    def _kernel_status(self, vg: str, lv: str) -> list[str] | None:
        """`dmsetup status` of the active cached LV, by device number (None: not active)."""
        try:
            major, minor = self.host.devnum(f"/dev/{vg}/{lv}").split(":")
        except (OSError, ValueError, AttributeError):
            return None
        return ["dmsetup", "status", "-j", major, "-m", minor]

    def failover_device(self, entry: CacheEntry) -> str | None:
        vg, lv, _ = names(self.host, entry, entry.spec["name"])
        try:
            return self._dm_name(f"/dev/{vg}/{lv}")
        except (OSError, ValueError):
            return None             # not active: nothing to switch

    def drop_failed_cache(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> str:
        """Take the failed cache out of the LV, leaving the LV on the origin alone.

        lvm2 detaches the cache volume of an inactive LV without activating it, so
        without a flush through the failed SSD and without reloading a table on it
        (`lvconvert --uncache --force`; a writeback cache is treated as writethrough
        then, which is where its dirty blocks are lost). The LV is deactivated for that,
        the SSD's PV, gone or unreadable, is taken out of the VG, and the LV, now the
        origin alone, is activated again. The VG and LV UUIDs (and the origin PV's
        identity) are proven again before each step."""
        h = self.host
        vg, lv, adopted = names(h, entry, p.cache)
        info = lv_info(h, vg, lv)
        if info is None:
            raise RefusedError(f"LVM does not see the logical volume {vg}/{lv}, so its "
                               "failed cache cannot be taken off it; nothing was changed",
                               hint=f"`lvs -a -o +devices {vg}` shows what LVM sees; "
                                    "put the origin disk back and run teardown again")
        same_lvm(entry, info, vg, lv)
        origin = () if adopted else tuple(n for n in (nodes.get("origin"),)
                                          if isinstance(n, str))
        check = self._still_recorded(p.cache, entry, vg, lv)
        target = f"{vg}/{lv}"
        if info.get("segtype") == "cache":
            # Anything but "-" (inactive): "a", or "X" (unknown), which lvs shows of an LV
            # whose top device the fail-over switched to a linear table of its origin.
            if info["lv_attr"][4:5] not in ("-", ""):
                p.command(f"deactivate {target}: lvm2 takes a cache off an inactive LV without "
                      "flushing it or loading a table on the failed SSD",
                      lvm(h, "lvchange", "--yes", "--activate", "n", target), check=check)
            p.command(f"drop the failed cache from {target} without a flush and remove its "
                  f"cache volume; {target} keeps the origin's data",
                  lvm(h, "lvconvert", "--yes", "--force", "--uncache", target),
                  destructive=True, devices=origin, check=check)
        if missing_pvs(h, vg):
            p.command(f"remove the missing PV (the failed SSD) from {vg}; no LV is on it any "
                  "more (lvm2 refuses if one is)",
                  lvm(h, "vgreduce", "--yes", "--removemissing", vg),
                  destructive=True, devices=origin, check=check)
        p.command(f"activate {target}, now on the origin alone",
              lvm(h, "lvchange", "--yes", "--activate", "y", target), check=check)
        ssd = entry.devices.get("cache")
        p.plan.notes.append(
            f"the failed SSD ({ssd.by_id[0] if ssd and ssd.by_id else 'the cache device'}) "
            "keeps a stale LVM label: before it is used again, `wipefs --all` it")
        return f"/dev/{vg}/{lv}"

    def surviving_state(self, entry: CacheEntry) -> dict[str, Any]:
        # The VG and the LV (now on the origin alone) keep their names and UUIDs; the
        # failed SSD's PV is out of the VG.
        kept = state.of(entry, LvmCacheState).dump()
        pvs = {r: u for r, u in (kept.get("pv_uuids") or {}).items() if r != "cache"}
        return {**kept, "pv_uuids": pvs}

    def kept_on_wipe(self, entry: CacheEntry, role: str, node: str) -> str | None:
        if role == "origin" and state.of(entry, LvmCacheState).adopted:
            return (f"the origin LV {node} is not wiped: hotcache adopted it with its data "
                    "and did not create it")
        return None

    @classmethod
    def forget_loses(cls, entry: CacheEntry) -> list[str]:
        vg = state.of(entry, LvmCacheState).vg
        return [f"that volume group {vg} belongs to this cache"] if vg else []

    def _still_recorded(self, cache: str, entry: CacheEntry, vg: str, lv: str
                        ) -> Callable[[RunContext], None]:
        """A step check: the VG and LV are still there with the recorded UUIDs."""
        def check(ctx: RunContext) -> None:
            info = lv_info(self.host, vg, lv)
            if info is None:
                raise RefusedError(f"{cache}: stopped: LVM no longer sees {vg}/{lv}",
                                   hint="nothing was run; `lvs -a` shows what LVM sees")
            same_lvm(entry, info, vg, lv)
        return check

    def dismantle(self, p: Planner, entry: CacheEntry, nodes: Nodes) -> None:
        h = self.host
        vg, lv, _ = names(h, entry, p.cache)
        info = lv_info(h, vg, lv)
        same_lvm(entry, info, vg, lv)
        if info is not None and info.get("segtype") == "cache":
            node = f"/dev/{vg}/{lv}"
            p.command("switch the cache to the cleaner policy, which writes every dirty block "
                  "back to the origin", lvm(h, "lvchange", "--yes", "--cachepolicy", "cleaner",
                                            "--cachesettings", "migration_threshold=2048",
                                            f"{vg}/{lv}"))
            p.command("load the cleaner into the active cache (lvchange alone does not)",
                  lvm(h, "lvchange", "--yes", "--refresh", f"{vg}/{lv}"))
            p.do(f"check that the loaded table can write back (migration_threshold at "
                 f"least {MIN_MIGRATION})",
                 lambda ctx: None if ctx.runner.dry_run else ensure_writeback(
                     self._dm_name(node), ctx.runner, need_cleaner=False))
            p.do("wait until the cache holds 0 dirty blocks",
                 lambda ctx: None if ctx.runner.dry_run else wait_clean(self._dm_name(node), ctx.runner))
            p.command(f"detach and remove the cache volume (lvm flushes it first); "
                  f"{vg}/{lv} keeps the data",
                  lvm(h, "lvconvert", "--yes", "--uncache", f"{vg}/{lv}"))
        ssd = nodes.get("cache")
        if ssd and pv_vg(h, ssd) == vg:
            p.command(f"take the SSD {ssd} out of {vg}", lvm(h, "vgreduce", "--yes", vg, ssd))
            p.command(f"remove the LVM label from {ssd}", lvm(h, "pvremove", "--yes", ssd))
        p.plan.notes.append(f"the data stays in /dev/{vg}/{lv} on the origin")


def _settings(tunables: Mapping[str, int | str]) -> dict[str, str]:
    if "migration_threshold" in tunables:
        return {"migration_threshold": str(tunables["migration_threshold"])}
    return {}


def _settings_args(settings: Mapping[str, str]) -> list[str]:
    if not settings:
        return []
    return ["--cachesettings", " ".join(f"{k}={v}" for k, v in settings.items())]

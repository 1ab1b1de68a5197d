"""Backend `lvmcache`: lvm2 builds the dm-cache. A volume group `hc_<name>` holds the
origin LV (on the HDD) and a cache volume (on the SSD) attached with
`lvconvert --type cache --cachevol`. LVM keeps its metadata on the PVs, so after a boot
only the activation is missing, which `hotcache restore` does.
"""

from __future__ import annotations

import json
import os

from ..dmtable import cache_stats, parse_status
from ..runner import Runner
from . import state
from .base import Backend

ORIGIN_LV, CACHE_LV = "data", "cache"


def vg_name(cache: str) -> str:
    return f"hc_{cache}"


def lvm(command: str, *args) -> list:
    """An lvm2 command that never asks (--yes) and, on hosts without a devices file,
    sees every device (Debian's guest images ship `use_devicesfile` settings that hide
    new disks)."""
    argv = [command]
    if not os.path.exists("/etc/lvm/devices/system.devices"):
        argv += ["--config", "devices { use_devicesfile=0 }"]
    return [*argv, *args]


def report(runner: Runner, what: str, fields: str, *targets: str) -> list[dict]:
    res = runner.query(lvm(what, "--reportformat", "json", "-o", fields, *targets),
                       check=False)
    if res.returncode != 0 or not res.stdout.strip():
        return []
    return json.loads(res.stdout)["report"][0].get(what[:-1], [])   # lvs -> "lv"


def origin_lv(runner: Runner, vg: str) -> dict | None:
    rows = report(runner, "lvs", "lv_name,lv_attr,segtype,cache_mode,cache_policy,"
                  "kernel_cache_settings,pool_lv", f"{vg}/{ORIGIN_LV}")
    return rows[0] if rows else None


def pv_vg(runner: Runner, node: str) -> str | None:
    rows = report(runner, "pvs", "pv_name,vg_name", node)
    return rows[0].get("vg_name") if rows else None


class LvmCache(Backend):
    name = "lvmcache"
    programs = ("pvcreate", "vgcreate", "lvcreate", "lvconvert", "lvchange", "lvs",
                "dmsetup", "mkfs.xfs", "wipefs")

    def unavailable(self):
        from ..discover import kernel_has

        if not kernel_has("device-mapper"):
            return "the kernel has no device-mapper (`dmsetup version` cannot reach it)"
        return None

    def owns(self, entry, dev):
        vg = state.of(entry).get("vg")
        if not vg or dev.fs.get("TYPE") != "LVM2_member" or not isinstance(dev.node, str):
            return False
        return pv_vg(Runner(), dev.node) == vg

    def keeps_filesystem(self, entry, devs):
        vg = state.of(entry).get("vg")
        return (entry or {}).get("state") == "ready" and bool(vg) \
            and origin_lv(Runner(), vg) is not None

    def build(self, p, spec, entry, devs):
        runner = p.env.runner
        vg = vg_name(spec.name)
        origin, cache = devs["origin"], devs["cache"]
        lv = origin_lv(runner, vg)
        target = f"/dev/{vg}/{ORIGIN_LV}"
        mode, policy = spec.effective_mode, spec.tunables.get("policy", "smq")
        settings = _settings(spec.tunables)
        if lv is None:
            for dev in (origin, cache):
                p.run(f"erase old signatures on {dev.ref.label}",
                      ["wipefs", "--all", dev.node], destructive=True)
            p.run("make both devices LVM physical volumes",
                  lvm("pvcreate", "--yes", origin.node, cache.node), destructive=True)
            p.run(f"create volume group {vg}", lvm("vgcreate", "--yes", vg, origin.node,
                                                   cache.node))
            p.run(f"create the origin LV {vg}/{ORIGIN_LV} on the whole origin",
                  lvm("lvcreate", "--yes", "--name", ORIGIN_LV, "--extents", "100%PVS", vg,
                      origin.node))
            state.remember(p, f"record volume group {vg} in the mapping",
                           lambda ctx: {"vg": vg, "origin_lv": ORIGIN_LV})
        elif lv["lv_attr"][4:5] != "a":
            p.run(f"activate volume group {vg}", lvm("vgchange", "--activate", "y", vg))
        if lv is None or lv.get("segtype") != "cache":
            self._attach(p, spec, vg, cache, mode, policy, settings)
        else:
            if lv.get("cache_mode") != mode:
                p.run(f"change the cache mode to {mode} in place (was {lv.get('cache_mode')})",
                      lvm("lvchange", "--yes", "--cachemode", mode, f"{vg}/{ORIGIN_LV}"))
            have = dict(kv.split("=", 1) for kv in
                        (lv.get("kernel_cache_settings") or "").split(",") if "=" in kv)
            if lv.get("cache_policy") != policy or any(have.get(k) != v for k, v in
                                                       settings.items()):
                p.run(f"change the cache policy to {policy} in place",
                      lvm("lvchange", "--yes", "--cachepolicy", policy,
                          *_settings_args(settings), f"{vg}/{ORIGIN_LV}"))
        from ..restore import plan_unit

        plan_unit(p, spec)
        return target

    def _attach(self, p, spec, vg, cache, mode, policy, settings) -> None:
        """Put a cache volume on the SSD and attach it to the origin LV, which may
        already hold data: lvconvert keeps the LV's content."""
        lvs = report(p.env.runner, "lvs", "lv_name", f"{vg}/{CACHE_LV}")
        if not lvs:
            p.run(f"create the cache volume {vg}/{CACHE_LV} on the whole SSD",
                  lvm("lvcreate", "--yes", "--name", CACHE_LV, "--extents", "100%PVS", vg,
                      cache.node))
        chunk = spec.tunables.get("chunk_size")
        p.run(f"attach {vg}/{CACHE_LV} as a {mode} cache of {vg}/{ORIGIN_LV}",
              lvm("lvconvert", "--yes", "--type", "cache", "--cachevol", f"{vg}/{CACHE_LV}",
                  "--cachemode", mode, "--cachepolicy", policy,
                  *(["--chunksize", f"{int(chunk) // 1024}k"] if chunk else []),
                  *_settings_args(settings), f"{vg}/{ORIGIN_LV}"))

    def stats(self, entry, runner):
        vg = state.of(entry).get("vg") or vg_name(entry["spec"]["name"])
        st = os.stat(f"/dev/{vg}/{ORIGIN_LV}")
        res = runner.run(["dmsetup", "status", "-j", str(os.major(st.st_rdev)),
                          "-m", str(os.minor(st.st_rdev))])
        return cache_stats(parse_status(res.stdout))

    def dismantle(self, p, entry):
        from ..restore import remove_unit
        from ..status import current_node
        from .dmcache import wait_clean

        vg = state.of(entry).get("vg") or vg_name(p.cache)
        lv = origin_lv(p.env.runner, vg)
        if lv is not None and lv.get("segtype") == "cache":
            node = f"/dev/{vg}/{ORIGIN_LV}"
            p.run("switch the cache to the cleaner policy, which writes every dirty block "
                  "back to the origin", lvm("lvchange", "--yes", "--cachepolicy", "cleaner",
                                            f"{vg}/{ORIGIN_LV}"))
            p.do("wait until the cache holds 0 dirty blocks",
                 lambda ctx: wait_clean(_dm_name(node), ctx.runner))
            p.run(f"detach and remove the cache volume (lvm flushes it first); "
                  f"{vg}/{ORIGIN_LV} keeps the data",
                  lvm("lvconvert", "--yes", "--uncache", f"{vg}/{ORIGIN_LV}"))
        ssd = current_node(entry, "cache")
        if ssd and pv_vg(p.env.runner, ssd) == vg:
            p.run(f"take the SSD {ssd} out of {vg}", lvm("vgreduce", "--yes", vg, ssd))
            p.run(f"remove the LVM label from {ssd}", lvm("pvremove", "--yes", ssd))
        p.plan.notes.append(f"the data stays in /dev/{vg}/{ORIGIN_LV} on the origin")
        remove_unit(p, p.cache)


def _settings(tunables: dict) -> dict[str, str]:
    if "migration_threshold" in tunables:
        return {"migration_threshold": str(tunables["migration_threshold"])}
    return {}


def _settings_args(settings: dict) -> list[str]:
    if not settings:
        return []
    return ["--cachesettings", " ".join(f"{k}={v}" for k, v in settings.items())]


def _dm_name(node: str) -> str:
    kname = os.path.basename(os.path.realpath(node))
    with open(f"/sys/class/block/{kname}/dm/name") as f:
        return f.read().strip()

"""dm-cache tables and status lines, as the kernel documents them
(Documentation/admin-guide/device-mapper/cache.rst).

table:  <start> <len> cache <metadata dev> <cache dev> <origin dev> <block size>
        <#features> <features>* <policy> <#policy args> [<policy arg>]*
status: <metadata block size> <#used>/<#total metadata blocks> <cache block size>
        <#used>/<#total cache blocks> <read hits> <read misses> <write hits>
        <write misses> <demotions> <promotions> <dirty> <#features> <features>*
        <#core args> <core args>* <policy> <#policy args> <args>* <metadata mode>
        <needs_check>
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hotcache.provision.backends.base import Failure
from hotcache.provision.backends.parts.stats import CacheStats
from hotcache.provision.errors import HotcacheError
from hotcache.provision.system.runner import Runner

if TYPE_CHECKING:
    from hotcache.provision.records import CacheEntry

MODES = ("writethrough", "writeback", "passthrough")


@dataclass
class CacheTable:
    length: int                 # origin sectors
    meta: str
    data: str
    origin: str
    block: int                  # sectors
    mode: str = "writethrough"
    features: list[str] = field(default_factory=list)   # besides the mode
    policy: str = "smq"
    policy_args: list[str] = field(default_factory=list)

    def render(self) -> str:
        feats = [*self.features, self.mode]
        return " ".join(["0", str(self.length), "cache", self.meta, self.data, self.origin,
                         str(self.block), str(len(feats)), *feats, self.policy,
                         str(len(self.policy_args)), *self.policy_args])


def parse_table(line: str) -> CacheTable:
    f = line.split()
    if len(f) < 9 or f[2] != "cache":
        raise ValueError(f"not a dm-cache table: {line!r}")
    nfeat = int(f[7])
    feats = f[8:8 + nfeat]
    rest = f[8 + nfeat:]
    mode = next((x for x in feats if x in MODES), "writeback")  # the kernel's default
    return CacheTable(int(f[1]), f[3], f[4], f[5], int(f[6]), mode,
                      [x for x in feats if x not in MODES], rest[0],
                      rest[2:2 + int(rest[1])])


def failed(line: str) -> str | None:
    """What a cache status line says is wrong with the cache (None: nothing): `Fail`
    (the kernel stopped using it), read-only metadata, or needs_check."""
    f = line.split()
    if len(f) > 3 and f[2] == "cache":
        f = f[3:]
    if f and f[0] == "Fail":
        return "dm-cache reports Fail: the kernel stopped using the cache after I/O errors"
    if f and f[0] == "Error":
        # dm-cache prints this when it cannot read its own metadata for the status: the
        # SSD fails I/O, and `Fail` follows once the kernel gives the cache up.
        return "dm-cache reports Error: it cannot read its metadata on the SSD"
    try:
        st = parse_status(line)
    except (IndexError, ValueError):
        return f"dm-cache's status is not one hotcache can read: {line.strip()!r}"
    if st["metadata_mode"] == "ro":
        return "dm-cache switched its metadata to read-only after an error"
    if st["needs_check"]:
        return "dm-cache set needs_check on its metadata"
    return None


def parse_status(line: str) -> dict[str, Any]:
    f = line.split()
    if len(f) > 3 and f[2] == "cache":
        f = f[3:]
    used_meta, total_meta = (int(x) for x in f[1].split("/"))
    block = int(f[2])
    used, total = (int(x) for x in f[3].split("/"))
    read_hits, read_misses, write_hits, write_misses, demotions, promotions, dirty = \
        (int(x) for x in f[4:11])
    i = 11
    nfeat = int(f[i])
    feats = f[i + 1:i + 1 + nfeat]
    i += 1 + nfeat
    ncore = int(f[i])
    core = f[i + 1:i + 1 + ncore]
    i += 1 + ncore
    policy = f[i]
    npol = int(f[i + 1])
    i += 2 + npol
    meta_mode = f[i] if i < len(f) else "?"
    needs_check = f[i + 1] if i + 1 < len(f) else "-"
    return {
        "block_sectors": block, "metadata_used": used_meta, "metadata_total": total_meta,
        "used_blocks": used, "total_blocks": total, "read_hits": read_hits,
        "read_misses": read_misses, "write_hits": write_hits, "write_misses": write_misses,
        "demotions": demotions, "promotions": promotions, "dirty_blocks": dirty,
        "mode": next((x for x in feats if x in MODES), "writeback"),
        "core_args": dict(zip(core[::2], core[1::2])), "policy": policy,
        "metadata_mode": meta_mode, "needs_check": needs_check != "-",
    }


def cache_stats(st: dict[str, Any]) -> CacheStats:
    """The statistics every backend reports, from a parsed status line."""
    block = st["block_sectors"] * 512
    hits = st["read_hits"] + st["write_hits"]
    misses = st["read_misses"] + st["write_misses"]
    if st["needs_check"] or st["metadata_mode"] != "rw":
        health = "needs_check" if st["needs_check"] else f"metadata {st['metadata_mode']}"
    else:
        health = "dirty" if st["dirty_blocks"] else "clean"
    return {
        "mode": st["mode"], "policy": st["policy"], "state": health,
        "hits": hits, "misses": misses,
        "hit_ratio": round(hits / (hits + misses), 4) if hits + misses else None,
        "dirty_bytes": st["dirty_blocks"] * block,
        "cache_used_bytes": st["used_blocks"] * block,
        "cache_total_bytes": st["total_blocks"] * block,
        "promotions": st["promotions"], "demotions": st["demotions"],
    }


def status_failure(runner: Runner, argv: list[str], entry: CacheEntry) -> Failure | None:
    """The verdict in a dm-cache status line (`dmsetup status` answers from the kernel's
    tables, without I/O to the devices); None when the device is not loaded or well."""
    try:
        res = runner.run(argv, check=False, timeout=10)
    except HotcacheError as exc:
        return Failure(f"`{' '.join(argv)}` did not answer: {exc}", None)
    said = failed(res.stdout) if res.returncode == 0 else None
    if said is None:
        return None
    try:
        st = parse_status(res.stdout)
        dirty: int | None = st["dirty_blocks"] * st["block_sectors"] * 512
    except (IndexError, ValueError):
        dirty = None            # Fail reports no counters: unknown, never the recorded mode
    return Failure(said, dirty, live_mode(runner, argv))


def live_mode(runner: Runner, status_argv: list[str]) -> str | None:
    """The cache mode in the live table (`dmsetup table`, answered from the kernel without
    I/O to the devices) of the device `status_argv` asks about; None when unreadable."""
    argv = ["table" if a == "status" else a for a in status_argv]
    try:
        res = runner.query(argv, check=False)
    except HotcacheError:
        return None
    f = res.stdout.split() if res.returncode == 0 else []
    if len(f) < 9 or f[2] != "cache":
        return None
    features = f[8:8 + int(f[7])] if f[7].isdigit() else []
    for mode in ("writethrough", "passthrough", "writeback"):
        if mode in features:
            return mode
    return "writeback"          # the kernel's default when the table names none

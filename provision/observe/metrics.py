"""Prometheus metrics for node_exporter's textfile collector, and the timer that refreshes
them.

node_exporter has no dm-cache, lvmcache or hot-copy collector, so `hotcache status
--prometheus FILE` writes what `status` sees in the text exposition format, and a
systemd timer runs it every minute. The file is replaced atomically
(prometheus_client.write_to_textfile: temp file + rename), so node_exporter never
reads half of it.

Every number comes from provision/status.py rows and the hot copies' own metadata. A
backend without statistics (`none`), or one whose statistics lack a key, simply has no
sample for that metric: absent, never a made-up zero.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import CollectorRegistry

from hotcache.provision import mapping
from hotcache.provision.backends import BACKENDS, block_cache
from hotcache.provision.engine import restorelog
from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy import format as hotcopy_format
from hotcache.provision.records import CacheEntry
from hotcache.provision.system.atomic import write_atomic
from hotcache.provision.system.runner import Runner

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from hotcache.provision.engine.statusrow import StatusRow
    from hotcache.provision.backends.parts.stats import CacheStats

DEFAULT_TEXTFILE = "/var/lib/prometheus/node-exporter/hotcache.prom"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
UNIT = "hotcache-metrics"

# Backend statistics keys (Backend.stats()) exported as plain gauges, with their help.
STAT_GAUGES = {
    "hit_ratio": ("cache_hit_ratio", "Share of cache lookups that hit, 0..1, as the backend reports it."),
    "dirty_bytes": ("cache_dirty_bytes", "Bytes in the cache not yet written to the origin."),
    "cache_used_bytes": ("cache_used_bytes", "Bytes of the cache device in use."),
    "cache_total_bytes": ("cache_size_bytes", "Size of the cache device's data area in bytes."),
}
STAT_COUNTERS = {
    "hits": ("cache_hits", "Cache read hits since the cache was started."),
    "misses": ("cache_misses", "Cache read misses since the cache was started."),
    "promotions": ("cache_promotions", "Blocks promoted to the cache since it was started."),
    "demotions": ("cache_demotions", "Blocks demoted from the cache since it was started."),
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _timestamp(value: Any) -> float | None:
    """ISO 8601 text (what hotcache writes) or epoch seconds -> epoch seconds."""
    number = _number(value)
    if number is not None:
        return number
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return when.timestamp()
    return None


# --- hot copies ------------------------------------------------------------------------

# A copy's version, as the mapping records it (records.HotCopy) or its metadata says.
Version = str | int | float | None


class CopyRow(TypedDict):
    """One hot copy on a cache, as `hot_copies` reports it."""
    path: str
    state: hotcopy_format.CopyState
    name: str
    version: Version
    present: bool
    files: float | None
    bytes: float | None
    verified_at: float | None       # Unix time
    verify_ok: bool | None
    recorded: bool
    verified: bool


def hot_copies(entry: CacheEntry | None, mounted: bool) -> list[CopyRow]:
    """The hot copies on one cache: those its mapping entry records (`hot_copies`, keyed
    by path), plus those found one or two folders below its mountpoint. Numbers come from
    each copy's own metadata file; a recorded copy that is gone is reported with
    present=False."""
    found: dict[str, dict[str, Any]] = {}
    for path, copy in ((entry and entry.hot_copies) or {}).items():
        if os.path.isabs(path):
            found[os.path.normpath(path)] = {"name": None, **copy.dump(), "recorded": True}
    mp = entry and entry.filesystem.mountpoint
    if mounted and mp:
        for folder in _scan(Path(mp)):
            found.setdefault(str(folder), {"recorded": False})
    return [_copy_row(path, info) for path, info in sorted(found.items())]


def _still_recorded(path: str, info: dict[str, Any]) -> bool:
    """The copy the mapping records is the folder at `path` now: hotcache recorded it
    (anyone in a shared folder can write a metadata file saying verify_ok) and, where
    the record has its inode, it is still that folder with that owner."""
    if not info.get("recorded"):
        return False
    if info.get("inode") is None:
        return True             # recorded before hotcache kept the inode
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino, st.st_uid) == (info.get("dev"), info["inode"], info.get("uid"))


def _scan(root: Path, depth: int = 2) -> Iterator[Path]:
    """Folders holding a hot-copy metadata file, at most `depth` levels below `root`;
    a hot copy's own folders are not searched (they can hold millions of files)."""
    try:
        children = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for child in children:
        path = Path(child.path)
        try:
            holds_copy = (path / hotcopy_format.METADATA).is_file()
        except OSError:         # an I/O error (a failed cache) is no copy to report
            continue
        if holds_copy:
            yield path
        elif depth > 1 and not child.name.endswith(hotcopy_format.STAGING_SUFFIX):
            yield from _scan(path, depth - 1)


def _copy_row(path: str, info: dict[str, Any]) -> CopyRow:
    recorded = _still_recorded(path, info)
    state, meta = hotcopy_format.copy_state(Path(path))
    src = meta if meta is not None else info
    verified = _timestamp(src.get("verified_at"))
    # A recorded copy is named as hotcache recorded it: its metadata file may be written
    # by the copy's owner, who must not rename what the cluster is told it holds.
    named = info if recorded and info.get("name") else src
    return {
        "path": path,
        "state": state,
        "name": str(named.get("name") or info.get("name") or os.path.basename(path)),
        "version": named.get("version"),
        "present": state.published,
        "files": _number(src.get("files")),
        "bytes": _number(src.get("bytes")),
        "verified_at": verified,
        # False for a copy missing or incomplete (nothing there can be trusted); None for
        # one published without a read-back and never verified since
        "verify_ok": state.verified,
        # hotcache made it and it is still that folder: only such a copy is published to
        # the cluster (node labels, manifests) as verified
        "recorded": recorded,
        "verified": bool(state.verified) and recorded,
    }


# --- the metrics -----------------------------------------------------------------------

class StatusCollector:
    """Turns status rows (provision/status.py) into metric families."""

    def __init__(self, rows: list[StatusRow], entries: dict[str, CacheEntry],
                 now: float | None = None) -> None:
        self.rows, self.entries = rows, entries
        self.now = time.time() if now is None else now

    def describe(self) -> list[Metric]:
        return []  # no fixed description: families depend on what the backends report

    def collect(self) -> list[Metric]:
        g = _Families()
        g.gauge("caches", "Caches recorded in the hotcache mapping.", []).add_metric([], len(self.rows))
        g.gauge("metrics_refresh_timestamp_seconds",
                "When these metrics were written (Unix time).", []).add_metric([], self.now)
        for row in self.rows:
            self._cache(g, row)
        return g.all()

    def _cache(self, g: "_Families", row: StatusRow) -> None:
        name = row["name"]
        stats: Mapping[str, object] = row.get("cache") or {}
        mp = row["mountpoint"] or ""
        devices = row["devices"]
        up = row["state"] == "ready" and bool(devices) and all(
            d["present"] for d in devices.values())
        g.info("cache", "What each cache is: backend, mode, state, mountpoint.",
               ["cache"]).add_metric([name], {
                   "backend": row["backend"] or "",
                   "mode": str(stats.get("mode") or row["mode"] or ""),
                   "state": row["state"] or "",
                   "mountpoint": mp,
                   "policy": str(stats.get("policy") or "")})
        g.gauge("cache_up", "1 when every device of the cache is present and its build is "
                "complete, else 0.", ["cache"]).add_metric([name], int(up))
        g.gauge("cache_ok", "1 when `hotcache status` finds no problem with the cache, else 0.",
                ["cache"]).add_metric([name], int(row["ok"]))
        g.gauge("cache_problems", "Problems `hotcache status` reports for the cache.",
                ["cache"]).add_metric([name], len(row["problems"]))
        failed = row["cache_failed"]
        if block_cache(row["backend"]):
            g.gauge("cache_failed", "1 when the kernel reports the cache's SSD failed (dm-cache "
                    "Fail or read-only metadata, bcache detached its cache set, LVM a missing "
                    "or failed PV) or the SSD does not answer a read, else 0.",
                    ["cache"]).add_metric([name], int(bool(failed)))
        self._on_origin(g, name, row)
        if failed and failed["dirty_bytes"] is not None:
            g.gauge("cache_failed_dirty_bytes", "Dirty data (written to the failed cache only) "
                    "at risk, in bytes.", ["cache"]).add_metric([name], failed["dirty_bytes"])
        self._restore(g, name, row)
        g.gauge("cache_mounted", "1 when the cache's filesystem is mounted where the mapping "
                "says, else 0.", ["cache", "mountpoint"]).add_metric([name, mp],
                                                                   int(row["mounted"]))
        for role, dev in sorted(devices.items()):
            g.gauge("cache_device_present", "1 when the device (origin or cache) is there, "
                    "else 0.", ["cache", "role"]).add_metric([name, role],
                                                             int(dev["present"]))
        for key, (metric, help_) in STAT_COUNTERS.items():
            value = _number(stats.get(key))
            if value is not None:
                g.counter(metric, help_, ["cache"]).add_metric([name], value)
        for key, (metric, help_) in STAT_GAUGES.items():
            value = _number(stats.get(key))
            if value is not None:
                g.gauge(metric, help_, ["cache"]).add_metric([name], value)
        for key, bytes_, help_ in (
                ("size_bytes", row["size_bytes"], "Size of the filesystem on the cache in bytes."),
                ("free_bytes", row["free_bytes"], "Bytes of the filesystem on the cache "
                                                  "available to new files."),
                ("used_bytes", row["used_bytes"], "Bytes of the filesystem on the cache in use.")):
            value = _number(bytes_)
            if value is not None:
                g.gauge(f"filesystem_{key}", help_, ["cache", "mountpoint"]).add_metric(
                    [name, mp], value)
        self._working_set(g, name, row, row.get("cache"))
        scan = row["mounted"] and not row["cache_failed"]
        for copy in hot_copies(self.entries.get(name), scan):
            if copy["recorded"]:    # a folder hotcache did not make says nothing here
                self._copy(g, name, copy)

    def _on_origin(self, g: "_Families", name: str, row: StatusRow) -> None:
        """A cache the fail-over watcher switched to its origin (engine/onorigin.py)."""
        entry = self.entries.get(name)
        if not block_cache(row["backend"]) or entry is None:
            return
        moved = entry.on_origin
        g.gauge("cache_on_origin", "1 when the cache's SSD failed and hotcache switched the "
                "cache, under its mounted filesystem, to a linear mapping of its origin "
                "(reads go to the HDD), else 0.", ["cache"]).add_metric([name], int(bool(moved)))
        if moved is not None:
            since = dt.datetime.fromisoformat(moved.since).timestamp()
            g.gauge("cache_on_origin_since_seconds", "When the cache was switched to its "
                    "origin, in seconds since the epoch.", ["cache"]).add_metric([name], since)

    def _restore(self, g: "_Families", name: str, row: StatusRow) -> None:
        backend = BACKENDS.get(row["backend"])
        if backend is None or not backend.restores_at_boot:
            return
        g.gauge("restore_failed", "1 when this boot's `hotcache restore` of the cache (its "
                "boot unit) failed, so its mount did not happen, else 0.",
                ["cache"]).add_metric([name], int(restorelog.failure(name, Runner())
                                                  is not None))

    def _working_set(self, g: "_Families", name: str, row: StatusRow,
                     stats: CacheStats | None) -> None:
        """What the cache is to hold against its fast tier, and bcache's buckets."""
        sizing = row["working_set"]["sizing"]
        if sizing:
            g.gauge("cache_working_set_bytes", "What the cache is to hold: the data on a "
                    "block cache's filesystem, or the hot copies on a plain SSD.",
                    ["cache"]).add_metric([name], sizing["need_bytes"])
            g.gauge("cache_capacity_ratio", "The fast tier's capacity over the working set; "
                    "below 1 a block cache thrashes, 1.2 to 1.5 is the margin to keep.",
                    ["cache"]).add_metric([name], sizing["ratio"] or 0)
        for state, percent in sorted(((stats.get("priority") if stats else None) or {}).items()):
            g.gauge("bcache_buckets_ratio", "Share of bcache's buckets in each state "
                    "(unused, clean, dirty, metadata), from priority_stats.",
                    ["cache", "state"]).add_metric([name, state], percent / 100)

    def _copy(self, g: "_Families", cache: str, copy: CopyRow) -> None:
        labels = ["cache", "copy", "path"]
        values = [cache, copy["name"], copy["path"]]
        g.gauge("hot_copy_present", "1 when the hot copy is there and complete, else 0.",
                labels).add_metric(values, int(copy["present"]))
        if copy["verify_ok"] is not None:
            g.gauge("hot_copy_verify_ok", "1 when the hot copy's last verification passed, 0 "
                    "when it failed or the copy is gone (absent: never verified).",
                    labels).add_metric(values, int(copy["verify_ok"]))
        for count, metric, help_ in ((copy["files"], "hot_copy_files", "Files in the hot copy."),
                                     (copy["bytes"], "hot_copy_bytes", "Bytes in the hot copy.")):
            if count is not None:
                g.gauge(metric, help_, labels).add_metric(values, count)
        if copy["present"]:
            # Never verified counts as verified at the epoch, so the too-old alert fires.
            verified = copy["verified_at"] or 0.0
            g.gauge("hot_copy_verified_timestamp_seconds", "When the hot copy was last "
                    "verified (Unix time; 0: never).", labels).add_metric(values, verified)
            g.gauge("hot_copy_verification_age_seconds", "Seconds since the hot copy was last "
                    "verified, when these metrics were written.", labels).add_metric(
                        values, max(0.0, self.now - verified))


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily, InfoMetricFamily)


class _Families:
    """One family per metric name, created on first use, all prefixed `hotcache_`."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def _get(self, cls: type[_Family], name: str, help_: str, labels: list[str]) -> _Family:
        full = f"hotcache_{name}"
        if full not in self._by_name:
            self._by_name[full] = cls(full, help_, labels=labels)
        # each name is asked for as one kind of family only, so it is the kind created
        return cast(_Family, self._by_name[full])

    def gauge(self, name: str, help_: str, labels: list[str]) -> GaugeMetricFamily:
        return self._get(GaugeMetricFamily, name, help_, labels)

    def counter(self, name: str, help_: str, labels: list[str]) -> CounterMetricFamily:
        return self._get(CounterMetricFamily, name, help_, labels)

    def info(self, name: str, help_: str, labels: list[str]) -> InfoMetricFamily:
        return self._get(InfoMetricFamily, name, help_, labels)

    def all(self) -> list[Metric]:
        return list(self._by_name.values())


def registry_for(rows: list[StatusRow], state: Path, now: float | None = None,
                 caches: dict[str, CacheEntry] | None = None) -> CollectorRegistry:
    """`caches`: the mapping's entries, when the caller has loaded them already."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StatusCollector(rows, caches if caches is not None
                                 else mapping.load(state)["caches"], now))
    return reg


def write_textfile(path: str | os.PathLike[str], rows: list[StatusRow], state: Path,
                   caches: dict[str, CacheEntry] | None = None) -> None:
    """Write the metrics to `path` atomically (an O_EXCL temp file in the same folder,
    then rename), never through a name planted in that folder."""
    write_atomic(path, generate_latest(registry_for(rows, state, caches=caches)).decode())


# --- the systemd timer -----------------------------------------------------------------

def timer_units(hotcache: str, textfile: str, interval: str, environment: dict[str, str],
                node_labels: str | None = None, slurm_push: bool = False) -> dict[str, str]:
    """The service and timer that refresh the metrics file (and, with `node_labels`, the
    node-feature-discovery feature file), by file name."""
    for what, value in (("hotcache program", hotcache), ("metrics file", textfile),
                        *((("node labels file", node_labels),) if node_labels else ()),
                        *environment.items()):
        if not value or any(c.isspace() or c in "\"'\\%$" for c in value):
            raise UsageError(f"{what} {value!r} cannot go into a systemd unit as it is",
                             hint="use a path without spaces, quotes, %, $ or backslashes")
    if not re.fullmatch(r"(\d+\s*(us|ms|s|sec|m|min|h|d|w)?\s*)+", interval):
        raise UsageError(f"interval {interval!r} is not a systemd time span",
                         hint="write it like 30s, 1min, 5min or 1h")
    env = "".join(f"Environment={k}={v}\n" for k, v in sorted(environment.items()))
    service = (
        "[Unit]\n"
        "Description=Refresh hotcache metrics for the node_exporter textfile collector\n"
        "After=local-fs.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "# A run that hangs (a dead device, a FIFO planted where a file was expected) is\n"
        "# stopped, so the next one starts and the node labels do not expire.\n"
        "TimeoutStartSec=5min\n"
        f"{env}"
        f"ExecStart={hotcache} status --prometheus {textfile}"
        f"{f' --node-labels {node_labels}' if node_labels else ''}"
        f"{' --slurm-push' if slurm_push else ''}\n"
        "# status exits 5 when a cache has drifted: the file is still written, and the\n"
        "# alert rules report the drift.\n"
        "SuccessExitStatus=5\n"
        "Nice=10\n"
        "IOSchedulingClass=idle\n"
    )
    timer = (
        "[Unit]\n"
        f"Description=Refresh hotcache metrics every {interval}\n\n"
        "[Timer]\n"
        f"OnBootSec={interval}\n"
        f"OnUnitActiveSec={interval}\n"
        "AccuracySec=5s\n\n"
        "[Install]\n"
        "WantedBy=timers.target\n"
    )
    return {f"{UNIT}.service": service, f"{UNIT}.timer": timer}


class TimerInstall(TypedDict):
    """What `install_timer` did (or, with check, would do)."""
    changed: bool
    files: list[str]
    enabled: bool
    unit_dir: str
    notes: list[str]
    check: bool


def install_timer(unit_dir: Path, units: dict[str, str] | None, runner: Runner, *,
                  check: bool = False) -> TimerInstall:
    """Write (or with units=None remove) the units; with systemd running and the real unit
    folder, also reload systemd and enable (or disable) the timer. Idempotent: reports
    `changed` only when a file was written or removed. check=True changes nothing."""
    names = [f"{UNIT}.service", f"{UNIT}.timer"]
    changed: list[str] = []
    for fname in names:
        path = unit_dir / fname
        want = None if units is None else units[fname]
        have = path.read_text() if path.is_file() else None
        if have == want:
            continue
        changed.append(str(path))
        if check:
            continue
        if want is None:
            path.unlink()
        else:
            write_atomic(path, want)
    live = Path("/run/systemd/system").is_dir() and \
        os.path.realpath(unit_dir) == os.path.realpath(DEFAULT_UNIT_DIR)
    notes: list[str] = []
    if changed and not check and live:
        if units is None:
            runner.run(["systemctl", "disable", "--now", f"{UNIT}.timer"], check=False)
        runner.run(["systemctl", "daemon-reload"])
        if units is not None:
            runner.run(["systemctl", "enable", "--now", f"{UNIT}.timer"])
    elif not live:
        notes.append(f"systemd is not managing {unit_dir} here, so the timer was not "
                     "enabled; `systemctl enable --now hotcache-metrics.timer` does it")
    return {"changed": bool(changed), "files": changed, "enabled": live and units is not None,
            "unit_dir": str(unit_dir), "notes": notes, "check": check}

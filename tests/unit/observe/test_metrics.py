"""Metrics for node_exporter's textfile collector, built from status rows and real hot
copy folders, checked by `promtool check metrics`; and the systemd units that refresh
them, checked by `systemd-analyze verify`."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hotcache.provision import mapping
from hotcache.provision.hotcopy import format as hotcopy_format
from hotcache.provision.observe import metrics
from hotcache.provision.errors import UsageError
from hotcache.provision.system.runner import Runner
from tests.helpers import recorded_entry

NOW = 1_800_000_000.0


def row(name, *, backend="bcache", stats=None, mounted=True, mp="/mnt/hot", ok=True,
        devices=None, state="ready"):
    """A `hotcache status` row (engine/statusrow.StatusRow: every key it always has)."""
    problems = [] if ok else ["not mounted at /mnt/hot"]
    return {"name": name, "backend": backend, "mode": "writethrough", "state": state,
            "devices": devices or {"origin": {"node": "/dev/vdb", "present": True},
                                   "cache": {"node": "/dev/vdc", "present": True}},
            "cached_device": "/dev/bcache0", "mountpoint": mp, "mounted": mounted,
            "noatime": mounted, "fs_uuid_matches": mounted, "options": [],
            "size_bytes": 1000 if mounted else None, "free_bytes": 250 if mounted else None,
            "used_bytes": 750 if mounted else None, "persistent": None, "cache_failed": None,
            **({"cache": stats} if stats else {}),
            "working_set": {"sizing": None, "activity": None}, "problems": problems,
            "findings": [{"code": "NOT_MOUNTED", "message": p} for p in problems], "ok": ok}


def make_copy(dest: Path, *, name="imagenet", verify_ok=True, verified_at="2027-01-15T00:00:00+00:00"):
    dest.mkdir(parents=True)
    (dest / "a.jpg").write_bytes(b"x" * 10)
    (dest / hotcopy_format.MANIFEST).write_text("0" * 64 + "  a.jpg\n")
    meta = {"format": hotcopy_format.FORMAT, "complete": True, "name": name, "version": "v1",
            "files": 1, "bytes": 10, "copied_at": "2027-01-14T00:00:00+00:00",
            "verified_at": verified_at, "verify_ok": verify_ok}
    (dest / hotcopy_format.METADATA).write_text(json.dumps(meta))


def write_state(path: Path, caches: dict, *, record_copies: bool = True) -> Path:
    """A mapping of `caches`, each given only the fields a test needs; the hot copies
    already under their mountpoints are recorded as `hotcache copy` records the copies it
    makes (a copy hotcache did not record is never published as verified)."""
    mapping.save(path, {"caches": {n: recorded_entry(n, **e) for n, e in caches.items()}})
    if record_copies:
        for entry in caches.values():
            mp = entry.get("filesystem", {}).get("mountpoint")
            for dest in copies_under(Path(mp)) if mp else []:
                record_copy(dest, path)
    return path


def copies_under(mp: Path) -> list[Path]:
    """Copies one or two folders below `mp`, not inside another copy."""
    out = []
    for child in sorted(p for p in mp.iterdir() if p.is_dir()) if mp.is_dir() else []:
        if (child / hotcopy_format.METADATA).exists():
            out.append(child)
        else:
            out += [g for g in sorted(child.iterdir()) if (g / hotcopy_format.METADATA).exists()]
    return out


def record_copy(dest: Path, state: Path) -> None:
    """What `hotcache copy` does once it has published `dest`."""
    from hotcache.provision.hotcopy import catalog

    catalog.record(dest, json.loads((dest / hotcopy_format.METADATA).read_text()), state,
                   os.lstat(dest))


def samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def render(rows, state: Path) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry_for(rows, state, now=NOW)).decode()


def promtool_check(text: str) -> None:
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


FULL_STATS = {"hits": 900, "misses": 100, "hit_ratio": 0.9, "dirty_bytes": 4096,
              "cache_used_bytes": 2048, "cache_total_bytes": 8192, "promotions": 17,
              "policy": "smq", "state": "clean", "mode": "writeback"}


def test_cache_with_full_statistics(tmp_path):
    state = write_state(tmp_path / "m.yaml", {"fast": {}})
    text = render([row("fast", stats=FULL_STATS)], state)
    promtool_check(text)
    got = samples(text)
    c = (("cache", "fast"),)
    assert got[("hotcache_cache_hits_total", c)] == 900
    assert got[("hotcache_cache_misses_total", c)] == 100
    assert got[("hotcache_cache_promotions_total", c)] == 17
    assert got[("hotcache_cache_hit_ratio", c)] == 0.9
    assert got[("hotcache_cache_dirty_bytes", c)] == 4096
    assert got[("hotcache_cache_used_bytes", c)] == 2048
    assert got[("hotcache_cache_size_bytes", c)] == 8192
    assert got[("hotcache_cache_up", c)] == 1
    # The live mode from the backend wins over the mapping's.
    info = [k for k in got if k[0] == "hotcache_cache_info"]
    assert dict(info[0][1])["mode"] == "writeback" and dict(info[0][1])["policy"] == "smq"
    fs = (("cache", "fast"), ("mountpoint", "/mnt/hot"))
    assert got[("hotcache_filesystem_free_bytes", fs)] == 250
    assert got[("hotcache_metrics_refresh_timestamp_seconds", ())] == NOW


def test_backend_none_and_partial_statistics_have_no_made_up_numbers(tmp_path):
    state = write_state(tmp_path / "m.yaml", {"plain": {}, "half": {}})
    text = render([row("plain", backend="none"),
                   row("half", stats={"hits": 5, "misses": None, "hit_ratio": "n/a"})], state)
    promtool_check(text)
    got = samples(text)
    names = {k[0] for k in got}
    assert ("hotcache_cache_hits_total", (("cache", "half"),)) in got
    assert not any(k[0] == "hotcache_cache_hits_total" and k[1] == (("cache", "plain"),)
                   for k in got)
    assert "hotcache_cache_misses_total" not in names
    assert "hotcache_cache_hit_ratio" not in names
    assert "hotcache_cache_dirty_bytes" not in names


def test_down_and_unmounted_cache(tmp_path):
    state = write_state(tmp_path / "m.yaml", {"gone": {}})
    rows = [row("gone", mounted=False, ok=False,
                devices={"origin": {"present": True}, "cache": {"present": False}})]
    got = samples(render(rows, state))
    assert got[("hotcache_cache_up", (("cache", "gone"),))] == 0
    assert got[("hotcache_cache_ok", (("cache", "gone"),))] == 0
    assert got[("hotcache_cache_problems", (("cache", "gone"),))] == 1
    assert got[("hotcache_cache_mounted", (("cache", "gone"), ("mountpoint", "/mnt/hot")))] == 0
    assert got[("hotcache_cache_device_present", (("cache", "gone"), ("role", "cache")))] == 0
    assert not any(k[0] == "hotcache_filesystem_size_bytes" for k in got)


def test_hot_copies_found_recorded_and_missing(tmp_path):
    mp = tmp_path / "mnt"
    make_copy(mp / "imagenet")                                   # found by scanning
    make_copy(mp / "sets" / "coco", name="coco", verify_ok=False)  # two levels down
    make_copy(mp / "imagenet" / "nested", name="inside")        # inside a copy: not searched
    make_copy(mp / "raw", name="raw", verify_ok=None, verified_at=None)  # never verified
    (mp / ".x.hotcache-staging").mkdir()
    entry = {"filesystem": {"mountpoint": str(mp)},
             "hot_copies": {str(mp / "gone"): {"name": "gone", "files": 3, "bytes": 30}}}
    state = write_state(tmp_path / "m.yaml", {"fast": entry})
    text = render([row("fast", mp=str(mp))], state)
    promtool_check(text)
    got = samples(text)

    def key(metric, copy, path):
        return (metric, (("cache", "fast"), ("copy", copy), ("path", str(path))))

    assert got[key("hotcache_hot_copy_files", "imagenet", mp / "imagenet")] == 1
    assert got[key("hotcache_hot_copy_bytes", "imagenet", mp / "imagenet")] == 10
    assert got[key("hotcache_hot_copy_verify_ok", "imagenet", mp / "imagenet")] == 1
    verified = dt.datetime(2027, 1, 15, tzinfo=dt.timezone.utc).timestamp()
    assert got[key("hotcache_hot_copy_verified_timestamp_seconds", "imagenet",
                   mp / "imagenet")] == pytest.approx(verified)
    assert got[key("hotcache_hot_copy_verification_age_seconds", "imagenet",
                   mp / "imagenet")] == pytest.approx(NOW - verified)
    assert got[key("hotcache_hot_copy_verify_ok", "coco", mp / "sets" / "coco")] == 0
    assert got[key("hotcache_hot_copy_present", "gone", mp / "gone")] == 0
    assert got[key("hotcache_hot_copy_verify_ok", "gone", mp / "gone")] == 0
    assert not any("inside" in dict(k[1]).get("copy", "") for k in got)
    # Never verified: no verify_ok sample (it did not fail), but as old as can be.
    assert key("hotcache_hot_copy_verify_ok", "raw", mp / "raw") not in got
    assert got[key("hotcache_hot_copy_verified_timestamp_seconds", "raw", mp / "raw")] == 0
    assert got[key("hotcache_hot_copy_present", "raw", mp / "raw")] == 1


@pytest.mark.parametrize("odd", [[None, "text", {"dest": "/x"}], "nonsense", {"/x": "text"}])
def test_odd_hot_copies_entries_are_refused_naming_the_field(tmp_path, odd):
    """hotcache writes hot_copies as {path: record}; any other shape (edited by hand) is
    refused when the mapping is read, never half-read (records.CacheEntry)."""
    state = write_state(tmp_path / "m.yaml", {"fast": {}})
    data = yaml.safe_load(state.read_text())
    data["caches"]["fast"]["hot_copies"] = odd
    state.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UsageError, match=r"caches\.fast\.hot_copies"):
        mapping.load(state)


def test_write_textfile_replaces_atomically(tmp_path):
    state = write_state(tmp_path / "m.yaml", {"fast": {}})
    target = tmp_path / "collector" / "hotcache.prom"
    metrics.write_textfile(target, [row("fast")], state)
    first = target.stat().st_ino
    metrics.write_textfile(target, [row("fast", mounted=False, ok=False)], state)
    # A new file renamed over the old one (a reader never sees half a file), no leftovers.
    assert target.stat().st_ino != first
    assert sorted(p.name for p in target.parent.iterdir()) == ["hotcache.prom"]
    promtool_check(target.read_text())


def test_timer_units_verify_and_install_idempotently(tmp_path):
    units = metrics.timer_units("/opt/hotcache/venv/bin/hotcache", "/var/lib/x/hotcache.prom",
                                "1min", {"HOTCACHE_STATE": "/srv/m.yaml"})
    unit_dir = tmp_path / "units"
    check = metrics.install_timer(unit_dir, units, Runner(), check=True)
    assert check["changed"] and not unit_dir.exists()
    first = metrics.install_timer(unit_dir, units, Runner())
    assert first["changed"] and not first["enabled"]  # not the live systemd folder
    assert metrics.install_timer(unit_dir, units, Runner())["changed"] is False
    service = (unit_dir / "hotcache-metrics.service").read_text()
    assert "Environment=HOTCACHE_STATE=/srv/m.yaml" in service
    assert "SuccessExitStatus=5" in service
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no",
                           str(unit_dir / "hotcache-metrics.timer")],
                          capture_output=True, text=True, timeout=60)
    # ExecStart's program does not exist here; everything else must be clean.
    problems = [l for l in proc.stderr.splitlines() if l and "/opt/hotcache" not in l]
    assert problems == []
    removed = metrics.install_timer(unit_dir, None, Runner())
    assert removed["changed"] and list(unit_dir.iterdir()) == []


@pytest.mark.parametrize("bad", [{"interval": "1 min; rm -rf /"}, {"textfile": "/a b.prom"},
                                 {"env": {"HOTCACHE_STATE": "/x/$HOME"}}])
def test_timer_refuses_what_systemd_would_misread(bad):
    args = {"hotcache": "/usr/bin/hotcache", "textfile": "/x.prom", "interval": "1min",
            "environment": {}}
    if "env" in bad:
        args["environment"] = bad["env"]
    else:
        args.update(bad)
    with pytest.raises(UsageError):
        metrics.timer_units(**args)


def test_a_real_dm_cache_status_line_becomes_valid_metrics(tmp_path):
    """The keys the dm-cache and lvmcache backends really return (a status line from a
    6.1 guest kernel, through the backend's own parser) all reach the file."""
    from hotcache.provision.backends.parts.dmtable import cache_stats, parse_status

    line = ("0 974848 cache 8 15/2048 128 13/1088 92 20 3 1 0 7 5 2 metadata2 writeback "
            "2 migration_threshold 2048 smq 0 rw - ")
    stats = cache_stats(parse_status(line))
    state = write_state(tmp_path / "m.yaml", {"dm": {}})
    text = render([row("dm", backend="dm-cache", stats=stats)], state)
    promtool_check(text)
    got = samples(text)
    c = (("cache", "dm"),)
    assert got[("hotcache_cache_hits_total", c)] == 95       # read + write hits
    assert got[("hotcache_cache_misses_total", c)] == 21
    assert got[("hotcache_cache_promotions_total", c)] == 7
    assert got[("hotcache_cache_demotions_total", c)] == 0
    assert got[("hotcache_cache_dirty_bytes", c)] == 5 * 128 * 512
    assert got[("hotcache_cache_used_bytes", c)] == 13 * 128 * 512
    assert got[("hotcache_cache_size_bytes", c)] == 1088 * 128 * 512
    assert got[("hotcache_cache_hit_ratio", c)] == pytest.approx(95 / 116, abs=1e-4)

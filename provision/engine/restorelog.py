"""Whether this boot's restore of a cache failed, for doctor and the metrics to say.

`hotcache restore` records its outcome per cache under /run/hotcache (HOTCACHE_RUN_DIR):
/run is emptied at every boot, so what is there speaks of this boot only. A restore unit
that could not even start hotcache (hotcache on a filesystem mounted later, a broken
install) leaves no record; systemd's own verdict on the unit covers that, asked only
where systemd runs the machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hotcache.provision.engine.bootunit import unit_name
from hotcache.provision.system.atomic import write_atomic
from hotcache.provision.system.clock import now
from hotcache.provision.system.runner import Runner

DEFAULT_RUN_DIR = "/run/hotcache"


def run_dir() -> Path:
    return Path(os.environ.get("HOTCACHE_RUN_DIR") or DEFAULT_RUN_DIR)


def _path(cache: str) -> Path:
    return run_dir() / f"restore-{cache}.json"


def record(caches: list[str], error: str | None) -> None:
    """The outcome of a restore of `caches`: None when it succeeded."""
    for cache in caches:
        write_atomic(_path(cache), json.dumps({"cache": cache, "ok": error is None,
                                               "when": now(), "error": error}) + "\n")


def failure(cache: str, runner: Runner | None = None) -> str | None:
    """Why this boot's restore of `cache` failed; None when it did not (or never ran)."""
    try:
        seen = json.loads(_path(cache).read_text())
    except (OSError, ValueError):
        seen = None
    if isinstance(seen, dict) and not seen.get("ok", True):
        return f"`hotcache restore {cache}` failed at {seen.get('when')}: {seen.get('error')}"
    if runner is not None and os.path.isdir("/run/systemd/system"):
        unit = unit_name(cache)
        res = runner.query(["systemctl", "is-failed", "--quiet", unit], check=False)
        if res.returncode == 0:
            return f"systemd reports {unit} failed (`journalctl -b -u {unit}` says why)"
    return None

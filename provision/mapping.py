"""The mapping: what hotcache built on this host, as YAML, with a schema version.

Default /etc/hotcache/mappings.yaml; `--state` or HOTCACHE_STATE to change it. Every
change is read-modify-write under an exclusive lock and written atomically.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from pathlib import Path

import yaml

from hotcache.provision import __version__
from hotcache.provision.system.atomic import locked, write_atomic
from hotcache.provision.errors import UsageError

SCHEMA_VERSION = 1
DEFAULT_STATE = "/etc/hotcache/mappings.yaml"


def state_path(option: str | None = None) -> Path:
    return Path(option or os.environ.get("HOTCACHE_STATE") or DEFAULT_STATE)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def empty() -> dict:
    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "caches": {}}


def load(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return empty()
    try:
        data = yaml.safe_load(text) or empty()
    except yaml.YAMLError as exc:
        raise UsageError(f"mapping {path} is not valid YAML: {exc}",
                         hint="restore it from a backup or point --state at the right file") from None
    if not isinstance(data, dict) or not isinstance(data.get("caches", {}), dict):
        raise UsageError(f"mapping {path} is not a hotcache mapping (no `caches:` mapping)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UsageError(f"mapping {path} has schema_version {version!r}; this hotcache "
                         f"({__version__}) reads version {SCHEMA_VERSION}",
                         hint="use the hotcache version that wrote it")
    data.setdefault("caches", {})
    return data


def save(path: Path, data: dict) -> None:
    data["schema_version"] = SCHEMA_VERSION
    data["tool_version"] = __version__
    data["updated"] = now()
    write_atomic(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


@contextlib.contextmanager
def editing(path: Path):
    """Lock, load, let the caller change the dict, save atomically."""
    with locked(path):
        data = load(path)
        yield data
        save(path, data)

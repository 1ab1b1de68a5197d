"""The mapping: what hotcache built on this host, as YAML, with a schema version.

Default /etc/hotcache/mappings.yaml; `--state` or HOTCACHE_STATE to change it. Every
change is read-modify-write under an exclusive lock and written atomically.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from hotcache.provision import __version__
from hotcache.provision.errors import UsageError
from hotcache.provision.records import CacheEntry, ValidationError, problems
from hotcache.provision.system.atomic import locked, write_atomic
from hotcache.provision.system.clock import now
from hotcache.provision.system.statepath import DEFAULT_STATE as DEFAULT_STATE  # re-exported
from hotcache.provision.system.statepath import state_path as state_path  # re-exported

SCHEMA_VERSION = 1
# libyaml's parser and emitter where PyYAML has them (its wheels do): a command reads the
# mapping several times, and the pure-Python parser took ten times as long.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def empty() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "caches": {}}


BROKEN_HINT = ("restore it from a backup (or point --state at the right file); only if "
               "hotcache never built a cache on this host, delete it. Until then every "
               "device hotcache built looks foreign to it, so nothing is changed")


def load(path: Path) -> dict[str, Any]:
    """The mapping, each of its `caches` a `records.CacheEntry`; a missing file is "no
    caches", but an empty, unparsable, truncated or hand-broken one is an error: read as
    "no caches" (or an entry read without a field) it would make devices hotcache built
    look foreign (and a later apply could take them for another cache)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return empty()
    if not text.strip():
        raise UsageError(f"mapping {path} is empty (hotcache never writes an empty "
                         "mapping: it was truncated or overwritten)", hint=BROKEN_HINT)
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise UsageError(f"mapping {path} is not valid YAML: {exc}", hint=BROKEN_HINT) from None
    if not isinstance(data, dict) or not isinstance(data.get("caches"), dict):
        raise UsageError(f"mapping {path} is not a hotcache mapping (no `caches:` mapping)",
                         hint=BROKEN_HINT)
    broken = [str(name) for name, entry in data["caches"].items() if not isinstance(entry, dict)]
    if broken:
        raise UsageError(f"mapping {path}: the entries of {', '.join(broken)} are not "
                         "mappings: the file was truncated or edited", hint=BROKEN_HINT)
    version = data.get("schema_version")
    if version is not None and version != SCHEMA_VERSION:
        raise UsageError(f"mapping {path} has schema_version {version!r}; this hotcache "
                         f"({__version__}) reads version {SCHEMA_VERSION}",
                         hint="use the hotcache version that wrote it")
    _check_whole(path, data)
    if version is None:
        raise UsageError(f"mapping {path} has no schema_version", hint=BROKEN_HINT)
    data["caches"] = {name: _entry(path, name, entry) for name, entry in data["caches"].items()}
    return data


def _entry(path: Path, name: object, entry: dict[str, Any]) -> CacheEntry:
    """An entry whole, or an error naming each field that is missing or of the wrong
    type (deleted or edited by hand: the file is whole, so _check_whole cannot tell)."""
    try:
        return CacheEntry.model_validate(entry)
    except ValidationError as exc:
        where = "; ".join(f"caches.{name}.{p}" for p in problems(exc))
        raise UsageError(f"mapping {path}: the entry of cache {name} is not one hotcache "
                         f"writes ({where})",
                         hint="put the field back as hotcache wrote it, or "
                              + BROKEN_HINT) from None


def _check_whole(path: Path, data: dict[str, Any]) -> None:
    """A mapping cut at a line boundary still parses: as fewer caches, or as an entry
    with fields missing (a cut inside the last one). save() writes `entries` (how many
    caches) and then `updated`, last, so a file cut anywhere lacks `updated`, and one
    whose entries were cut out of the middle lists fewer than `entries`."""
    if not isinstance(data.get("updated"), str) or list(data)[-1] != "updated":
        raise UsageError(f"mapping {path} does not end with the `updated:` line hotcache "
                         "writes last: the file was cut short (or not written by hotcache)",
                         hint=BROKEN_HINT)
    count = data.get("entries")
    if count is not None and count != len(data["caches"]):
        raise UsageError(f"mapping {path} lists {len(data['caches'])} caches where it was "
                         f"written with {count}: entries were cut out or edited",
                         hint=BROKEN_HINT)


def save(path: Path, data: dict[str, Any]) -> None:
    """Write `data` (its caches CacheEntry records, or dicts checked into them here: an
    entry hotcache could not load again is never written)."""
    caches = data.setdefault("caches", {})
    for name, entry in caches.items():
        if not isinstance(entry, CacheEntry):
            caches[name] = CacheEntry.model_validate(entry)
    # The version first, `entries` and `updated` last: a file cut short lacks them.
    body = {k: v for k, v in data.items()
            if k not in ("schema_version", "tool_version", "entries", "updated")}
    data.clear()
    data.update(schema_version=SCHEMA_VERSION, tool_version=__version__, **body,
                entries=len(caches), updated=now())
    text = {**data, "caches": {name: entry.dump() for name, entry in caches.items()}}
    write_atomic(path, yaml.dump(text, Dumper=_DUMPER, sort_keys=False, default_flow_style=False))


LOCK_TIMEOUT = 600.0    # seconds a run waits for another to finish (HOTCACHE_LOCK_TIMEOUT)


def lock_timeout() -> float:
    raw = os.environ.get("HOTCACHE_LOCK_TIMEOUT")
    try:
        return float(raw) if raw else LOCK_TIMEOUT
    except ValueError:
        raise UsageError(f"HOTCACHE_LOCK_TIMEOUT={raw!r} is not a number of seconds") from None


@contextlib.contextmanager
def holding(path: Path, holder: str,
            waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the mapping's lock for a whole command (plan, confirmation, every step), so
    two runs (an administrator's apply and the boot's restore) never interleave. A second
    run waits, told who holds it, and gives up after lock_timeout() (exit 8)."""
    with locked(path, holder=holder, timeout=lock_timeout(), waiting=waiting):
        yield


@contextlib.contextmanager
def editing(path: Path) -> Iterator[dict[str, Any]]:
    """Lock, load, let the caller change the dict (and its CacheEntry records), save
    atomically."""
    with locked(path, timeout=lock_timeout()):
        data = load(path)
        yield data
        save(path, data)

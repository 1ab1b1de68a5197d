"""Node labels from the mapping: a node-feature-discovery local feature file.

nfd-worker reads every file in `features.d/` (one `<namespace>/<name>[=<value>]` a line,
`#` comments) and turns the lines into node labels, so the scheduler can send a job that
needs a dataset to a node that already holds a verified hot copy of it. hotcache writes
one file there, `hotcache`, from the same timer run that writes the metrics:

    # +expiry-time=2027-01-15T00:10:00Z
    hotcache.feature.node.kubernetes.io/ds-imagenet_v3=verified
    hotcache.feature.node.kubernetes.io/cache-fast=bcache
    hotcache.feature.node.kubernetes.io/cache-fast.mode=writethrough

Only copies that are present, complete and whose last verification passed get a label;
one that fails verification or is deleted is simply not written at the next refresh, so
nfd-worker drops its label at its next discovery. The expiry line makes nfd-worker ignore
the whole file when the timer stops refreshing it (a dead host keeps no stale promise).
The file is written atomically: a temp file whose name starts with a dot (nfd-worker
ignores dot files) renamed over the old one.

Names follow Kubernetes' label rules (a DNS-subdomain prefix; a name part of at most 63
characters, alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric; values the
same or empty). `feature.node.kubernetes.io` and its sub-namespaces are the one namespace
nfd-master accepts without extra flags.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from hotcache.provision import mapping
from hotcache.provision.backends import PLAIN
from hotcache.provision.errors import HotcacheError
from hotcache.provision.observe.metrics import CopyRow, Version, hot_copies
from hotcache.provision.records import CacheEntry
from hotcache.provision.system.atomic import write_atomic

if TYPE_CHECKING:
    from hotcache.provision.engine.statusrow import StatusRow

PREFIX = "hotcache.feature.node.kubernetes.io"
DEFAULT_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
DEFAULT_FILE = f"{DEFAULT_FEATURES_DIR}/hotcache"
DEFAULT_EXPIRY_SECONDS = 600
VERIFIED = "verified"
MAX_NAME = 63
MAX_FILE = 64 * 1024          # nfd-worker ignores a larger feature file

_PLAIN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?")
_DOTTED = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def slug(text: str, dots: bool = False, limit: int = 40) -> str:
    """`text` as part of a label name: itself when it already fits (alphanumerics and `-`,
    plus `.` when `dots`), else a cleaned form with a short hash of the original, so two
    different names never share a label."""
    text = str(text)
    pattern = _DOTTED if dots else _PLAIN
    if pattern.fullmatch(text) and len(text) <= limit:
        return text
    allowed = r"[^A-Za-z0-9.-]" if dots else r"[^A-Za-z0-9-]"
    clean = re.sub(allowed, "-", text).strip("-.")[: limit - 9].strip("-.")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean}-{digest}" if clean else digest


def value(text: str) -> str:
    """A label value: at most 63 characters, alphanumerics and `-_.`, alphanumeric ends."""
    text = re.sub(r"[^A-Za-z0-9_.-]", "-", str(text))[:MAX_NAME]
    return text.strip("-_.")


def copy_label(name: str, version: Version) -> str:
    """The label of a verified hot copy of dataset `name` at `version`: the name part is
    `ds-<name>_<version>` (`_` appears in neither slug, so it splits them unambiguously)."""
    return f"{PREFIX}/ds-{slug(name)}_{slug(str(version if version is not None else 'none'), dots=True, limit=18)}"


def cache_label(cache: str) -> str:
    return f"{PREFIX}/cache-{slug(cache, limit=50)}"


# Findings that make a mounted cache unfit to serve: the bare origin of a block cache
# serves and takes writes the cache does not see; a shut-down filesystem serves nothing.
NOT_SERVING = {"ORIGIN_WITHOUT_CACHE", "FILESYSTEM_SHUT_DOWN"}


def is_up(row: StatusRow) -> bool:
    """Up: mounted, built, from its cache, and answering."""
    return row["mounted"] and row["state"] == "ready" and \
        not NOT_SERVING & {f["code"] for f in row.get("findings", [])}


class UpCopy(CopyRow):
    """A hot copy on a cache that is up, with that cache and its backend."""
    cache: str
    backend: str


def up_copies(rows: list[StatusRow], caches: dict[str, CacheEntry]) -> list[UpCopy]:
    """Every hot copy on the caches that are up, each with its `cache` and `backend`:
    read once, for callers that sort them (`rows` are `hotcache status` rows, `caches`
    the mapping's entries)."""
    return [{**copy, "cache": row["name"], "backend": row["backend"]}
            for row in filter(is_up, rows) for copy in hot_copies(caches.get(row["name"]), True)]


def verified_copies(rows: list[StatusRow], caches: dict[str, CacheEntry],
                    listed: list[UpCopy] | None = None) -> list[UpCopy]:
    """The hot copies on caches that are up which are present, complete, and whose last
    verification passed, recorded by hotcache and still that folder. `listed`: what
    `up_copies` returned, when the caller has it already."""
    return [c for c in (up_copies(rows, caches) if listed is None else listed) if c["verified"]]


def labels(rows: list[StatusRow], caches: dict[str, CacheEntry]) -> dict[str, str]:
    """{label: value} for the caches that are up and the verified hot copies on them."""
    out: dict[str, str] = {}
    for row in filter(is_up, rows):
        key = cache_label(row["name"])
        out[key] = value(row["backend"] or PLAIN)
        stats = row.get("cache")
        mode = (stats.get("mode") if stats else None) or row["mode"]
        if mode:
            out[f"{key}.mode"] = value(mode)
    for copy in verified_copies(rows, caches):
        out[copy_label(copy["name"], copy["version"])] = VERIFIED
    return out


def feature_file(found: dict[str, str], now: dt.datetime | None = None,
                 expiry_seconds: int = DEFAULT_EXPIRY_SECONDS) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    expires = (now + dt.timedelta(seconds=expiry_seconds)).astimezone(dt.timezone.utc)
    lines = [
        "# Written by hotcache (`hotcache status --node-labels`) from its mapping:",
        "# caches that are up, and hot copies whose last verification passed.",
        "# Do not edit: the next refresh replaces it. nfd-worker ignores it once expired.",
        f"# +expiry-time={expires.strftime('%Y-%m-%dT%H:%M:%SZ')}",
    ]
    lines += [f"{k}={v}" for k, v in sorted(found.items())]
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_FILE:
        raise HotcacheError(f"the node feature file would be {len(text.encode())} bytes; "
                            f"nfd-worker ignores files over {MAX_FILE}",
                            hint="fewer hot copies per host, or label fewer datasets")
    return text


def write(path: str | Path, rows: list[StatusRow], state: Path,
          expiry_seconds: int = DEFAULT_EXPIRY_SECONDS,
          caches: dict[str, CacheEntry] | None = None) -> dict[str, str]:
    """Write the feature file atomically; returns the labels written. `caches`: the
    mapping's entries, when the caller has loaded them already."""
    found = labels(rows, caches if caches is not None else mapping.load(state)["caches"])
    write_atomic(path, feature_file(found, expiry_seconds=expiry_seconds))
    return found

"""Slurm node features and job environment from the mapping's verified hot copies.

A Slurm job asks for a node holding its dataset with `sbatch --constraint=FEATURE`.
hotcache names one feature per verified hot copy on this node: `hc_<name>_<version>`.
Slurm 22.05's helpers.conf refuses a feature name with `-` or starting with a digit (the
whole file then fails to parse and slurmctld stops), and takes a comma list only in
newer releases, so a name is letters, digits, `_` and `.`, starting with a letter. The
dataset name keeps only letters and digits and the version letters, digits and `.`
(`_` appears in neither, so it splits them unambiguously); a name or version with
anything else is cleaned and given a short hash of the original, so two datasets never
share a feature.

Which copies count is decided in one place, `nodelabels.verified_copies` (the same
copies Kubernetes' node labels report): present, complete, last verification passed.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from hotcache.provision.observe.nodelabels import verified_copies

if TYPE_CHECKING:
    from hotcache.provision.engine.statusrow import StatusRow

PREFIX = "hc_"
MAX_FEATURE = 60
_NAME = re.compile(r"[A-Za-z0-9]+")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.]*")


def _part(text: str, pattern: re.Pattern, drop: str, limit: int) -> str:
    if pattern.fullmatch(text) and len(text) <= limit:
        return text
    clean = re.sub(drop, "", text)[: limit - 9]
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean}x{digest}" if clean else f"x{digest}"


def feature_name(name: str, version) -> str:
    """The Slurm feature of a verified hot copy of `name` at `version`."""
    version = "none" if version is None else str(version)
    return (f"{PREFIX}{_part(str(name), _NAME, r'[^A-Za-z0-9]', 32)}_"
            f"{_part(version, _VERSION, r'[^A-Za-z0-9.]', 20)}")


def features(rows: list[StatusRow], caches: dict) -> list[dict]:
    """One entry per verified hot copy: its feature, dataset, version, path and cache,
    plus `source` and `partial` from the copy's metadata (for DATA_COLD_ROOT)."""
    from pathlib import Path

    from hotcache.provision.hotcopy.format import read_metadata

    out = []
    for copy in verified_copies(rows, caches):
        meta = read_metadata(Path(copy["path"])) or {}
        out.append({"feature": feature_name(copy["name"], copy["version"]),
                    "name": copy["name"], "version": copy["version"], "path": copy["path"],
                    "cache": copy["cache"], "source": meta.get("source"),
                    "partial": bool(meta.get("partial"))})
    return sorted(out, key=lambda f: (f["feature"], f["path"]))


def is_ours(feature: str) -> bool:
    return feature.startswith(PREFIX)


def merged(current: list[str], ours: list[str]) -> list[str]:
    """The node's features after a push: the admin's own features kept, hotcache's
    replaced by `ours`."""
    kept = [f for f in current if f and not is_ours(f)]
    return kept + [f for f in dict.fromkeys(ours) if f not in kept]


def parse_node(text: str) -> dict[str, list[str]]:
    """AvailableFeatures and ActiveFeatures from `scontrol show node -o NAME`."""
    out: dict[str, list[str]] = {"available": [], "active": []}
    for word in text.split():
        key, _, val = word.partition("=")
        if key in ("AvailableFeatures", "ActiveFeatures"):
            feats = [] if val in ("", "(null)") else val.split(",")
            out["available" if key == "AvailableFeatures" else "active"] = feats
    return out


def parse_job_features(text: str) -> list[str]:
    """The feature names in a job's constraint, from `scontrol show job -o ID`
    (`Features=a&b|c` with brackets and counts stripped)."""
    for word in text.split():
        key, _, val = word.partition("=")
        if key == "Features" and val not in ("", "(null)"):
            return [w for w in re.split(r"[&|,\[\]()*]+", val) if w and not w.isdigit()]
    return []


def choose(found: list[dict], wanted: list[str], dataset: str | None) -> dict | None:
    """The copy a job asked for: by HOTCACHE_DATASET (`name` or `name@version`, or a
    feature name), else the first of its constraint's features that is ours."""
    if dataset:
        name, _, version = dataset.partition("@")
        for f in found:
            if dataset == f["feature"] or (name == f["name"] and
                                          (not version or version == str(f["version"]))):
                return f
        return None
    for want in wanted:
        for f in found:
            if f["feature"] == want:
                return f
    return None


def _value(text: str) -> str:
    """slurmstepd takes the rest of an `export NAME=value` line literally (no quoting),
    so a value is written as it is; one with a line break cannot be and is refused."""
    if "\n" in text or "\r" in text:
        from hotcache.provision.errors import UsageError

        raise UsageError(f"the path {text!r} holds a line break; a TaskProlog cannot "
                         "export it", hint="rename the hot copy's folder")
    return text


def task_prolog_lines(copy: dict | None, asked: str | None) -> list[str]:
    """What a TaskProlog prints: `export` lines slurmstepd adds to the task's
    environment. With no verified copy for a job that asked for one, DATA_ROOT_EXPECT=hot
    is still set (and DATA_ROOT left unset) so data_root() fails loudly in the job."""
    if copy is None:
        if not asked:
            return []
        return [f"print hotcache: no verified hot copy of {asked} on this node",
                "export DATA_ROOT_EXPECT=hot"]
    lines = [f"export DATA_ROOT={_value(copy['path'])}"]
    if copy.get("partial") and copy.get("source"):
        lines.append(f"export DATA_COLD_ROOT={_value(copy['source'])}")
        lines.append("export DATA_ROOT_EXPECT=partial")
    else:
        lines.append("export DATA_ROOT_EXPECT=hot")
    return lines


_FEATURE = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,62}")


def valid(feature: str) -> bool:
    """A feature name helpers.conf takes (see the module's docstring)."""
    return bool(_FEATURE.fullmatch(feature))


def push(rows: list[StatusRow], caches: dict, node: str | None = None, dry_run: bool = False,
         runner=None) -> dict:
    """Set `node`'s hc_ features in slurmctld to the verified hot copies now (`scontrol
    update NodeName=... AvailableFeatures=... ActiveFeatures=...`), its other features
    kept. Returns what was (or, with dry_run, would be) set."""
    import socket

    from hotcache.provision.system.runner import Runner

    runner = runner or Runner()
    node = node or socket.gethostname().split(".")[0]
    ours = [f["feature"] for f in features(rows, caches)]
    now = parse_node(runner.query(["scontrol", "show", "node", "-o", node]).stdout)
    available, active = merged(now["available"], ours), merged(now["active"], ours)
    argv = ["scontrol", "update", f"NodeName={node}",
            f"AvailableFeatures={','.join(available)}", f"ActiveFeatures={','.join(active)}"]
    if not dry_run:
        runner.run(argv)
    return {"node": node, "features": ours, "available": available, "active": active,
            "argv": argv, "dry_run": dry_run}

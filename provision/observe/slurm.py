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
Root finds them by probing the host; any other account (the TaskProlog runs as the job's
user) reads what root last proved from the verified-copies index (verified_index.py),
checked against the live folders.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from hotcache.provision.errors import HotcacheError, UsageError
from hotcache.provision.observe import verified_index
from hotcache.provision.system.statepath import state_path

if TYPE_CHECKING:
    from hotcache.provision.engine.statusrow import StatusRow
    from hotcache.provision.observe.metrics import Version
    from hotcache.provision.records import CacheEntry
    from hotcache.provision.system.runner import Runner

PREFIX = "hc_"
MAX_FEATURE = 60
_NAME = re.compile(r"[A-Za-z0-9]+")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.]*")


def _part(text: str, pattern: re.Pattern[str], drop: str, limit: int) -> str:
    if pattern.fullmatch(text) and len(text) <= limit:
        return text
    clean = re.sub(drop, "", text)[: limit - 9]
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean}x{digest}" if clean else f"x{digest}"


def feature_name(name: str, version: Version) -> str:
    """The Slurm feature of a verified hot copy of `name` at `version`."""
    text = "none" if version is None else str(version)
    return (f"{PREFIX}{_part(str(name), _NAME, r'[^A-Za-z0-9]', 32)}_"
            f"{_part(text, _VERSION, r'[^A-Za-z0-9.]', 20)}")


class Feature(TypedDict):
    """A verified hot copy as a Slurm feature, with what a TaskProlog exports for it."""
    feature: str
    name: str
    version: Version
    path: str
    cache: str | None
    source: str | None
    partial: bool


def features(rows: list[StatusRow], caches: dict[str, CacheEntry]) -> list[Feature]:
    """One entry per verified hot copy: its feature, dataset, version, path and cache,
    plus `source` and `partial` from the copy's metadata (for DATA_COLD_ROOT)."""
    return from_index(verified_index.entries(rows, caches))


def from_index(found: Sequence[Mapping[str, Any]]) -> list[Feature]:
    """The feature entries of verified-copies index entries (verified_index.py), as root
    wrote them (`Entry`) or as a reader found them in the index."""
    out: list[Feature] = [
        {"feature": feature_name(e["name"], e.get("version")), "name": e["name"],
         "version": e.get("version"), "path": e["path"], "cache": e.get("cache"),
         "source": e.get("source"), "partial": bool(e.get("partial"))} for e in found]
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
        if key == "Features":
            return constraint_features(val)
    return []


def constraint_features(expr: str) -> list[str]:
    """The feature names in a constraint expression (`a&b|c`, `[a*2&b]`, `(null)`)."""
    if expr in ("", "(null)"):
        return []
    return [w for w in re.split(r"[&|,\[\]()*:]+", expr) if w and not w.isdigit()]


def choose(found: list[Feature], wanted: list[str], dataset: str | None) -> Feature | None:
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
        raise UsageError(f"the path {text!r} holds a line break; a TaskProlog cannot "
                         "export it", hint="rename the hot copy's folder")
    return text


def task_prolog_lines(copy: Feature | None, asked: str | None, why: str = "") -> list[str]:
    """What a TaskProlog prints: `export` lines slurmstepd adds to the task's
    environment. With no verified copy for a job that asked for one, DATA_ROOT_EXPECT=hot
    is still set (and DATA_ROOT left unset) so data_root() fails loudly in the job, and
    DATA_ROOT_UNSET_REASON says why (data_root() names it)."""
    if copy is None:
        if not asked:
            return []
        reason = f"no verified hot copy of {asked} on this node" + (f": {why}" if why else "")
        reason = " ".join(reason.split())           # one line, whatever the notes held
        return [f"print hotcache: {reason}", "unset DATA_ROOT",
                f"export DATA_ROOT_UNSET_REASON={reason}", "export DATA_ROOT_EXPECT=hot"]
    lines = [f"export DATA_ROOT={_value(copy['path'])}"]
    source = copy.get("source")
    if copy.get("partial") and source:
        lines.append(f"export DATA_COLD_ROOT={_value(source)}")
        lines.append("export DATA_ROOT_EXPECT=partial")
    else:
        lines.append("export DATA_ROOT_EXPECT=hot")
    return lines


def why_not(asked: str, notes: list[tuple[str | None, str]]) -> str:
    """Why `asked` has no copy: the notes on its dataset's stale entries, else those on
    the index itself (missing, unreadable, not answering)."""
    asks = asked.split(",")
    names = {a.partition("@")[0] for a in asks} | set(asks)

    def about(name: str | None) -> bool:     # by dataset name, or by its features
        return name is not None and (name in names or any(
            a.startswith(f"{PREFIX}{_part(name, _NAME, r'[^A-Za-z0-9]', 32)}_") for a in asks))

    mine = [text for name, text in notes if about(name)]
    mine = mine or [text for name, text in notes if name is None]
    return "; ".join(mine[:3])


_FEATURE = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,62}")


def valid(feature: str) -> bool:
    """A feature name helpers.conf takes (see the module's docstring)."""
    return bool(_FEATURE.fullmatch(feature))


class Push(TypedDict):
    """What `push` set (or, with dry_run, would set) in slurmctld."""
    node: str
    features: list[str]
    available: list[str]
    active: list[str]
    argv: list[str]
    dry_run: bool


def push(rows: list[StatusRow], caches: dict[str, CacheEntry], node: str | None = None,
         dry_run: bool = False, runner: Runner | None = None) -> Push:
    """Set `node`'s hc_ features in slurmctld to the verified hot copies now (`scontrol
    update NodeName=... AvailableFeatures=... ActiveFeatures=...`), its other features
    kept. Returns what was (or, with dry_run, would be) set."""
    # the TaskProlog loads this module: socket and subprocess (the Runner) only for scontrol
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


def job_features(env: Mapping[str, str], runner: Runner | None = None) -> list[str]:
    """hotcache's features in the job's constraint: from SLURM_JOB_CONSTRAINTS where
    slurmstepd set it, else from `scontrol show job` (an unanswered query: none)."""
    expr = env.get("SLURM_JOB_CONSTRAINTS")
    if expr is not None:
        return [f for f in constraint_features(expr) if is_ours(f)]
    job = env.get("SLURM_JOB_ID")
    if not job:
        return []
    # the TaskProlog's start-up: subprocess only where slurmstepd set no constraints
    from hotcache.provision.system.runner import Runner

    try:
        out = (runner or Runner(timeout=10)).query(["scontrol", "show", "job", "-o", job],
                                                   check=False).stdout
    except (HotcacheError, OSError):
        return []
    return [f for f in parse_job_features(out) if is_ours(f)]


def run_task_prolog(state: str | os.PathLike[str] | None, env: Mapping[str, str],
                    runner: Runner | None = None, limit: float | None = None) -> list[str]:
    """The TaskProlog's lines for a job with environment `env` (as the job's user): from
    the verified-copies index, checked against the live folders; never a device probe,
    never an error (a job that named its dataset and cannot have it gets the reason)."""
    dataset = env.get("HOTCACHE_DATASET") or None
    wanted = [] if dataset else job_features(env, runner)
    if not dataset and not wanted:
        return []
    asked = dataset or ",".join(wanted)
    try:
        found, notes = verified_index.offered(
            state_path(state and str(state)),
            verified_index.CHECK_SECONDS if limit is None else limit)
        feats = from_index(found)
        copy = choose(feats, wanted, dataset)
        return task_prolog_lines(copy, asked, "" if copy else why_not(asked, notes))
    except (HotcacheError, OSError) as exc:
        return task_prolog_lines(None, asked, str(exc).splitlines()[0])

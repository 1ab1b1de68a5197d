"""CLI commands for Slurm: `hotcache slurm features`, `push`, `helpers-conf` and
`task-prolog`. Registered on the app by cli/app.py; the work is in observe/slurm.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from hotcache.provision.cli.common import FstabOpt, JsonOpt, StateOpt, emit
from hotcache.provision.errors import UsageError
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.statepath import state_path

if TYPE_CHECKING:
    from hotcache.provision.observe.slurm import Feature

slurm_app = typer.Typer(
    help="Send Slurm jobs to the nodes that hold their hot data.\n\n"
         "`hotcache slurm features` prints one node feature per verified hot copy "
         "(hc_<dataset>_<version>), for the node_features/helpers plugin; `hotcache slurm "
         "push` sets the same list with scontrol where that plugin is not configured; "
         "`hotcache slurm task-prolog` is the TaskProlog that exports DATA_ROOT for a job "
         "that names its dataset. See docs/slurm.md.",
    no_args_is_help=True, rich_markup_mode=None)

NodeOpt = typer.Option(None, "--node", help="Slurm node name [default: this host's short "
                       "name, as slurmd uses it].")


def _found(state: Optional[Path], fstab: Optional[Path]) -> list[Feature]:
    """The verified hot copies on this node. Root probes the host (and writes what it
    found to the verified-copies index); any other account reads that index, checked
    against the live folders, and never opens a device."""
    # start-up: the index and Slurm's rules, for these commands only
    from hotcache.provision.observe import verified_index
    from hotcache.provision.observe.slurm import from_index

    path = state_path(state and str(state))
    if os.geteuid() != 0:
        return from_index(verified_index.offered(path)[0])
    # start-up: root's host probe and the mapping's pydantic models
    from hotcache.provision.engine.status import host_status
    from hotcache.provision.mapping import load

    caches = load(path)["caches"]
    rows = host_status(path, fstab, Runner(), None)
    verified_index.write(path, rows, caches)
    return from_index(verified_index.entries(rows, caches))


def features(as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
             fstab: Optional[Path] = FstabOpt) -> None:
    """One Slurm feature a line, one per verified hot copy on this node; nothing for a
    copy that failed verification, is incomplete or is gone. The node_features/helpers
    plugin runs this (through `hotcache slurm helpers-conf`'s Helper line)."""
    found = _found(state, fstab)
    if as_json:
        return emit({"features": found}, "slurm-features")
    for f in found:
        sys.stdout.write(f["feature"] + "\n")


def helpers_conf(helper: str = typer.Option(
        "/usr/local/libexec/hotcache-slurm-features", "--helper", metavar="PROGRAM",
        help="The program helpers.conf names (it runs `hotcache slurm features`)."),
        extra: list[str] = typer.Option([], "--feature", metavar="FEATURE",
                                        help="Also list this feature (one this node may "
                                             "hold later); repeat for more."),
        as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
        fstab: Optional[Path] = FstabOpt) -> None:
    """helpers.conf lines, one `Feature=... Helper=...` per verified hot copy now on this
    node plus each --feature. Slurm reads helpers.conf only when slurmd starts, so a
    feature must be listed there before slurmd can report it."""
    from hotcache.provision.observe.slurm import valid   # start-up: this command only

    names = list(dict.fromkeys([f["feature"] for f in _found(state, fstab)] + list(extra)))
    for name in names:
        if not valid(name):
            raise UsageError(f"--feature {name!r} is not a name Slurm's helpers.conf takes",
                             hint="letters, digits, `_` and `.`, starting with a letter; "
                                  "`hotcache slurm features` prints the names to use")
    lines = [f"Feature={n} Helper={helper}" for n in names]
    if as_json:
        return emit({"lines": lines, "features": names}, "slurm-helpers-conf")
    sys.stdout.write("".join(line + "\n" for line in lines))


def push(node: Optional[str] = NodeOpt,
         dry_run: bool = typer.Option(False, "--dry-run", help="Print the scontrol command "
                                      "without running it."),
         as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
         fstab: Optional[Path] = FstabOpt) -> None:
    """Set this node's hotcache features in slurmctld with `scontrol update NodeName=...
    AvailableFeatures=... ActiveFeatures=...`: the node's other features are kept, its
    hc_ features replaced by the verified hot copies now. For clusters without the
    node_features/helpers plugin (with it, scontrol would ask for a node reboot); the
    metrics timer can run it after each refresh."""
    # start-up: the host probe and the mapping's pydantic models, for this command only
    from hotcache.provision.engine.status import host_status
    from hotcache.provision.mapping import load
    from hotcache.provision.observe.slurm import push as push_features

    path = state_path(state and str(state))
    doc = push_features(host_status(path, fstab, Runner(), None), load(path)["caches"],
                        node, dry_run)
    if as_json:
        return emit(doc, "slurm-push")
    sys.stdout.write(" ".join(doc["argv"]) + "\n")


def task_prolog(state: Optional[Path] = StateOpt, fstab: Optional[Path] = FstabOpt) -> None:
    """Slurm's TaskProlog, run as the job's user: for a job that names its dataset
    (HOTCACHE_DATASET=name or name@version in its environment, or a --constraint with a
    hotcache feature), print `export DATA_ROOT=<the verified hot copy>` and `export
    DATA_ROOT_EXPECT=hot` (DATA_COLD_ROOT and expect=partial for a partial copy). A job
    that names none gets nothing; one whose dataset has no verified copy here gets
    DATA_ROOT_EXPECT=hot without DATA_ROOT, and DATA_ROOT_UNSET_REASON, so data_root()
    fails loudly, naming why, instead of reading the slow origin. It decides from the
    verified-copies index root writes, checked against the live folders: no device is
    opened, and it never fails the job (exit 0 whatever it finds)."""
    from hotcache.provision.observe.slurm import run_task_prolog   # start-up: this command only

    sys.stdout.write("".join(line + "\n" for line in run_task_prolog(state, dict(os.environ))))


def register(app: typer.Typer) -> None:
    slurm_app.command("features")(features)
    slurm_app.command("helpers-conf")(helpers_conf)
    slurm_app.command("push")(push)
    slurm_app.command("task-prolog")(task_prolog)
    app.add_typer(slurm_app, name="slurm")

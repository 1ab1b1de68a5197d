"""`hotcache failover`: switch a cache whose SSD failed to its origin, under the mounted
filesystem (tend/failover.py); `--watch` is what hotcache-failover.service runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from hotcache.provision.cli.common import DryRunOpt, JsonOpt, StateOpt, emit, need_root
from hotcache.provision.errors import ExitCode
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.statepath import state_path


def register(app: typer.Typer) -> None:
    app.command()(failover)


def failover(
    names: Optional[List[str]] = typer.Argument(None, help="Caches to look at (default: all)."),
    watch: bool = typer.Option(False, "--watch", help="Look again and again, --interval "
                               "seconds apart, until stopped (what the service runs); each "
                               "change is one line on stderr (the journal)."),
    interval: float = typer.Option(1.0, "--interval", min=0.1,
                                   help="Seconds between two looks with --watch."),
    dry_run: bool = DryRunOpt, as_json: bool = JsonOpt, state: Optional[Path] = StateOpt,
) -> None:
    """Look at each dm-cache and lvmcache as the kernel reports it and, where the kernel
    stopped using the SSD and no dirty block is on it (writethrough, passthrough, or a
    dirty count of zero), switch the cache in place to a linear mapping of its origin:
    the filesystem stays mounted, reads go to the origin, and the mapping records it.
    With dirty data at risk nothing is switched: exit 9, and the choice stays with
    `hotcache teardown NAME --cache-failed --accept-loss`."""
    # start-up: the watcher, the backends and the mapping's pydantic models, for this command only
    from hotcache.provision.block.host import Host
    from hotcache.provision.tend.failover import Watcher

    need_root("failover")
    watcher = Watcher(state_path(state and str(state)), Host(Runner()),
                      say=None if watch else (lambda line: None))
    if watch:
        watcher.watch(names or None, interval)
        return
    outcomes = watcher.check(names or None, act=not dry_run)
    if as_json:
        emit({"dry_run": dry_run, "caches": [o.to_json() for o in outcomes]}, "failover")
    else:
        for o in outcomes:
            sys.stdout.write(o.message() + "\n")
    if any(o.decision.alarm or (o.switched and o.switched.error) for o in outcomes):
        raise typer.Exit(ExitCode.UNHEALTHY)

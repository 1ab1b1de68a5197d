"""What every `hotcache` command shares: the options declared once (--json, --state,
--fstab, --yes, --unit-dir, --jobs), JSON and console output, the root check, the Env a
command plans in (and the mapping's lock around it), and showing, confirming and running
a plan. Only typer at import time: `hotcache --help` must start fast."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Optional

import typer

from hotcache.provision.errors import NotRoot, RefusedError

JsonOpt = typer.Option(False, "--json", help="Print a JSON document instead of text.")
StateOpt = typer.Option(None, "--state", envvar="HOTCACHE_STATE", show_envvar=True,
                        help="Mapping file [default: /etc/hotcache/mappings.yaml].")
FstabOpt = typer.Option(None, "--fstab", envvar="HOTCACHE_FSTAB", show_envvar=True,
                        help="fstab file that persistent mounts go to [default: /etc/fstab].")
YesOpt = typer.Option(False, "--yes", "-y", help="Do it without asking for confirmation.")
UnitDirOpt = typer.Option(None, "--unit-dir", envvar="HOTCACHE_UNIT_DIR", show_envvar=True,
                          help="Folder of systemd units [default: /etc/systemd/system].")
JobsOpt = typer.Option(0, "--jobs", "-j", min=0, show_default=False,
                       help="Parallel reader threads [default: 4 per CPU, at most 16].")


def emit(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def console():
    from rich.console import Console
    # soft_wrap: a long path is never cut into two lines (piped output is 80 columns wide).
    return Console(highlight=False, soft_wrap=True)


def preload(*modules: str) -> None:
    """Import, in a background thread, what a long command needs only at its end: the
    mapping's pydantic models and rich's console take 0.1-0.2 s with a cold page cache,
    time that would otherwise come after the work instead of during it (the copy's
    threads spend it in syscalls, without the GIL). Not a daemon: the interpreter never
    stops with an import half done. A module that fails to import, for whatever reason,
    is left to the command's own import of it, which reports the error once and in the
    command's words, not as a thread's traceback in the middle of the progress."""
    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:   # reported by the command's own import, see above
                continue

    threading.Thread(target=load, name="preload").start()


def need_root(command: str) -> None:
    if os.geteuid() != 0:
        raise NotRoot(command)


def make_env(state: Optional[Path], fstab_file: Optional[Path], dry_run: bool = False):
    from hotcache.provision.engine.apply import Env
    from hotcache.provision.system.fstab import fstab_path
    from hotcache.provision.mapping import state_path
    from hotcache.provision.system.runner import Runner

    return Env(Runner(dry_run=dry_run), state_path(state and str(state)),
               fstab_path(fstab_file and str(fstab_file)))


@contextlib.contextmanager
def holding_state(env, command: str):
    """One lock on the mapping from plan through confirmation to the last step."""
    from hotcache.provision.mapping import holding

    def waiting(who: str) -> None:
        sys.stderr.write(f"hotcache: waiting for {who} to finish (it holds the lock on "
                         f"{env.state})\n")
        sys.stderr.flush()
    with holding(env.state, f"hotcache {command}", waiting):
        yield


def confirm(what: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise RefusedError(f"{what}: confirmation needed and there is no terminal to ask on",
                           hint="read `hotcache plan` and pass --yes")
    if not typer.confirm(f"{what}?", default=False):
        raise RefusedError(f"{what}: not confirmed; nothing was changed")


def show_plan(plan, title: str) -> None:
    c = console()
    for name in plan.unchanged:
        c.print(f"[green]{name}[/]: already as specified, nothing to do")
    current = None
    for i, step in enumerate(plan.steps, 1):
        if step.cache != current:
            current = step.cache
            c.print(f"[bold]{current}[/]:")
        mark = "[red]![/]" if step.destructive else " "
        c.print(f" {mark}{i:>2}. {step.summary}", soft_wrap=True)
        if step.argv:
            c.print(f"       [cyan]{step.shown()}[/]", soft_wrap=True)
    for note in plan.notes:
        c.print(f"[yellow]note[/]: {note}", soft_wrap=True)
    if plan.empty:
        c.print(f"{title}: no changes")


def carry_out(result, env, title: str, *, yes: bool, as_json: bool, done: str) -> None:
    """Show a plan, confirm it, run it with progress, report (apply, restore)."""
    if result.empty:
        if as_json:
            return emit({"changed": False, **result.to_json()})
        return show_plan(result, title)
    if not as_json:
        show_plan(result, title)
    confirm(f"{title} {len(result.steps)} steps", yes)
    run_steps(result, env, quiet=as_json)
    if as_json:
        return emit({"changed": True, **result.to_json()})
    console().print(f"[green]done[/]: {len(result.steps)} steps {done}")


def run_steps(result, env, quiet: bool) -> None:
    from hotcache.provision.engine.apply import execute

    if quiet or not sys.stderr.isatty():
        return execute(result, env.runner)
    from rich.progress import Progress

    from rich.console import Console

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("applying", total=len(result.steps))

        def tick(i, step):
            bar.update(task, completed=i, description=step.summary[:60])

        execute(result, env.runner, tick)

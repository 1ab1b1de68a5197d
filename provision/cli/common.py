"""What every `hotcache` command shares: the options declared once (--json, --state,
--fstab, --yes, --dry-run, --unit-dir, --jobs), JSON and console output, the root check, the Env a
command plans in (and the mapping's lock around it), and showing, confirming and running
a plan. Only typer at import time: `hotcache --help` must start fast."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import typer

from hotcache.provision.errors import NotRoot, RefusedError
from hotcache.provision.system.runner import Runner
from hotcache.provision.system.statepath import state_path

if TYPE_CHECKING:
    from rich.console import Console

    from hotcache.provision.engine.apply import Env
    from hotcache.provision.plan import Plan, Step

JsonOpt = typer.Option(False, "--json", help="Print a JSON document instead of text.")
StateOpt = typer.Option(None, "--state", envvar="HOTCACHE_STATE", show_envvar=True,
                        help="Mapping file [default: /etc/hotcache/mappings.yaml].")
FstabOpt = typer.Option(None, "--fstab", envvar="HOTCACHE_FSTAB", show_envvar=True,
                        help="fstab file that persistent mounts go to [default: /etc/fstab].")
YesOpt = typer.Option(False, "--yes", "-y", help="Do it without asking for confirmation.")
UnitDirOpt = typer.Option(None, "--unit-dir", envvar="HOTCACHE_UNIT_DIR", show_envvar=True,
                          help="Folder of systemd units [default: /etc/systemd/system].")
DryRunOpt = typer.Option(False, "--dry-run",
                         help="Show what would change, each step exactly, and change nothing.")
JobsOpt = typer.Option(0, "--jobs", "-j", min=0, show_default=False,
                       help="Parallel readers: threads, and as many worker processes for many small "
                            "files [default: 4 per CPU, at most 16].")


# The version of every --json document's layout, beside its `kind` (the command that
# printed it). Raised only when a key is removed or changes meaning; new keys may appear
# within one version. docs/cli.md states this contract.
JSON_FORMAT = 1


def emit(doc: Mapping[str, Any], kind: str | None) -> None:
    """Print a --json document: `kind` and `format_version` first, then `doc`'s keys in
    the order the command built them. kind None: a document that names itself in its own
    standard's terms (a Kubernetes List, a JSON Schema)."""
    if kind is not None:
        clash = {"kind", "format_version"} & doc.keys()
        if clash:
            raise ValueError(f"a --json document may not carry {sorted(clash)} itself")
        doc = {"kind": kind, "format_version": JSON_FORMAT, **doc}
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def console() -> Console:
    from rich.console import Console   # start-up: rich only for what is printed with it
    # soft_wrap: a long path is never cut into two lines (piped output is 80 columns wide).
    return Console(highlight=False, soft_wrap=True)


Cell = str | Sequence[str]      # one value, or several (a device's by-id links)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Cell]]) -> None:
    """A table on stdout, never cut. On a terminal: rich's, folding a long cell over
    lines instead of ending it with an ellipsis, several values one a line. Anywhere
    else (a pipe, a file, a log), as lsblk, lvs and kubectl do: a header line and one line
    a row, whole, its cells separated by tabs and several values by commas, control
    characters written as \\xNN, so that `cut -f3` or `awk -F'\\t'` read it."""
    if not sys.stdout.isatty():
        def plain(cell: Cell) -> str:
            text = cell if isinstance(cell, str) else ",".join(cell)
            return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)

        out = ["\t".join(columns)]
        out += ["\t".join(plain(cell) for cell in row) for row in rows]
        sys.stdout.write("\n".join(out) + "\n")
        return
    # start-up: rich only for a table on a terminal
    from rich.table import Table
    from rich.text import Text

    table = Table(*columns)
    for column in table.columns:
        column.overflow = "fold"
    for row in rows:      # Text: a path with [brackets] is not markup
        table.add_row(*(Text(cell if isinstance(cell, str) else "\n".join(cell))
                        for cell in row))
    console().print(table)


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


def refresh_index(state: Optional[Path], fstab: Optional[Path] = None) -> None:
    """Root: after a command that changed what is true, rewrite the verified-copies
    index that jobs and other accounts read (observe/verified_index.py)."""
    from hotcache.provision.observe.verified_index import refresh   # start-up: root's commands only

    warning = refresh(state_path(state and str(state)), fstab)
    if warning:
        sys.stderr.write(f"warning: {warning}\n")


def need_root(command: str, why: str | None = None, hint: str | None = None) -> None:
    if os.geteuid() != 0:
        raise NotRoot(command, why or "changes block devices and mounts", hint=hint)


def make_env(state: Optional[Path], fstab_file: Optional[Path], dry_run: bool = False) -> Env:
    # start-up: the engine (pydantic) and fstab's writer, for the commands that plan
    from hotcache.provision.engine.apply import Env
    from hotcache.provision.system.fstab import fstab_path

    return Env(Runner(dry_run=dry_run), state_path(state and str(state)),
               fstab_path(fstab_file and str(fstab_file)), preview=dry_run)


@contextlib.contextmanager
def holding_state(env: Env, command: str) -> Iterator[None]:
    """One lock on the mapping from plan through confirmation to the last step (none for
    a dry run, which writes nothing, not even the lock file)."""
    from hotcache.provision.mapping import holding   # start-up: the mapping's pydantic models

    if env.preview:
        yield
        return

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


def show_plan(plan: Plan, title: str) -> None:
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


def dry_run_report(result: Plan, title: str, as_json: bool) -> None:
    """What --dry-run prints: the plan, and nothing run."""
    if as_json:
        return emit({"changed": False, "dry_run": True, **result.to_json()}, title)
    show_plan(result, title)
    if not result.empty:
        console().print(f"dry run: nothing was changed; run it without --dry-run to make "
                        f"these {len(result.steps)} changes")


def carry_out(result: Plan, env: Env, title: str, *, yes: bool, as_json: bool, done: str,
              dry_run: bool = False) -> None:
    """Show a plan, confirm it, run it with progress, report (apply, restore)."""
    if dry_run:
        return dry_run_report(result, title, as_json)
    if result.empty:
        if as_json:
            return emit({"changed": False, **result.to_json()}, title)
        return show_plan(result, title)
    if not as_json:
        show_plan(result, title)
    confirm(f"{title} {len(result.steps)} steps", yes)
    run_steps(result, env, quiet=as_json)
    if as_json:
        return emit({"changed": True, **result.to_json()}, title)
    console().print(f"[green]done[/]: {len(result.steps)} steps {done}")


def run_steps(result: Plan, env: Env, quiet: bool) -> None:
    from hotcache.provision.engine.apply import execute   # start-up: the engine, for plans only

    if quiet or not sys.stderr.isatty():
        return execute(result, env.runner)
    # start-up: rich only for the progress bar on a terminal
    from rich.console import Console
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("applying", total=len(result.steps))

        def tick(i: int, step: Step) -> None:
            bar.update(task, completed=i, description=step.summary[:60])

        execute(result, env.runner, tick)

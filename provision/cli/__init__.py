"""The `hotcache` command: parsing and presentation only. app.py builds the typer app;
common.py holds the options and output every command shares; one module per group of
commands (commands, copies, cache, observe, kube, slurm), each with `register(app)`.

`hotcache slurm task-prolog` runs for every task of every Slurm job, so `main` answers it
without loading typer (prolog.py); every other command goes through the app."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer


def main() -> None:
    # start-up: the TaskProlog never loads typer and the app (see the docstring)
    if sys.argv[1:3] == ["slurm", "task-prolog"]:
        from hotcache.provision.cli.prolog import fast

        rc = fast(sys.argv[3:])
        if rc is not None:
            sys.exit(rc)
    from hotcache.provision.cli.app import main as full    # typer and every command

    full()


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        from hotcache.provision.cli.app import app   # start-up: typer only when asked for

        return app
    raise AttributeError(name)

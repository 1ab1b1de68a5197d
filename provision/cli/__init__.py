"""The `hotcache` command: parsing and presentation only. app.py builds the typer app;
common.py holds the options and output every command shares; one module per group of
commands (commands, copies, cache, observe, kube), each with `register(app)`."""

from hotcache.provision.cli.app import app, main

__all__ = ["app", "main"]

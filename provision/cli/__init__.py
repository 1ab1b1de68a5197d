"""The `hotcache` command: parsing and presentation only (commands.py and one module per group)."""

from hotcache.provision.cli.commands import app, main

__all__ = ["app", "main"]

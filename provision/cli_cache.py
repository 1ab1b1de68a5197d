"""CLI commands for block-cache upkeep (restore after boot): registered on the main app."""

from __future__ import annotations


def register(app) -> None:
    pass

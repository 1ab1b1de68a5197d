"""CLI commands for observability (doctor, metrics): registered on the main app."""

from __future__ import annotations


def register(app) -> None:
    pass

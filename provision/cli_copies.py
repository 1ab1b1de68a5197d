"""CLI commands for hot copies (copy, verify, warm, copies): registered on the main app."""

from __future__ import annotations


def register(app) -> None:
    pass

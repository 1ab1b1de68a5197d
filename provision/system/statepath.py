"""Where the mapping is: `--state`, else HOTCACHE_STATE, else /etc/hotcache/mappings.yaml.
Standard library only, so that a reader that needs no YAML (the Slurm TaskProlog) finds
the files beside the mapping without loading a parser."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STATE = "/etc/hotcache/mappings.yaml"


def state_path(option: str | os.PathLike[str] | None = None) -> Path:
    return Path(option or os.environ.get("HOTCACHE_STATE") or DEFAULT_STATE)

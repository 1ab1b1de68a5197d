"""The one timestamp format of what hotcache writes (the mapping, a hot copy's metadata):
UTC, whole seconds, ISO 8601. Standard library only: a copy's metadata is written
without yaml or pydantic, which load meanwhile (cli/common.preload)."""

from __future__ import annotations

import datetime as dt


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()

"""Backend `bcache` (built in issue 3; for now it only reports availability)."""

from __future__ import annotations

from pathlib import Path

from .base import Backend


class Bcache(Backend):
    name = "bcache"
    programs = ("make-bcache", "wipefs", "mkfs.xfs")

    def unavailable(self):
        if not Path("/sys/fs/bcache").is_dir():
            return "the kernel has no bcache (no /sys/fs/bcache; `modprobe bcache` failed or was not run)"
        return "not implemented yet"

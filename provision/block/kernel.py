"""What the running kernel offers the block-cache backends (bcache, device-mapper)."""

from __future__ import annotations

from pathlib import Path

from hotcache.provision.system.runner import Runner, which


def kernel_has(feature: str) -> bool:
    """A kernel feature is usable when it is built in or its module is loaded."""
    if feature == "device-mapper":
        return Path("/dev/mapper/control").exists() and _dm_answers()
    if feature == "bcache":
        return Path("/sys/fs/bcache").is_dir()
    return False


def _dm_answers() -> bool:
    if not which("dmsetup"):
        return False
    return Runner().run(["dmsetup", "version"], check=False).returncode == 0

"""Guest session setup: modules, partitions, and where persistent state lives."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from vmlib import HDD, PERSIST, SSD, partition_disks, sh

# HOTCACHE_VM_TRACE=FILE: one line per command the guest runs (seconds, test, argv), to
# find where a slow case spends its emulated time.
TRACE = os.environ.get("HOTCACHE_VM_TRACE")
if TRACE:
    _run = subprocess.run

    def _traced(argv, *args, **kwargs):
        start = time.monotonic()
        try:
            return _run(argv, *args, **kwargs)
        finally:
            words = argv if isinstance(argv, (list, tuple)) else [argv]
            with open(TRACE, "a") as f:
                f.write(f"{time.monotonic() - start:.2f}\t"
                        f"{os.environ.get('PYTEST_CURRENT_TEST', '-')}\t"
                        f"{' '.join(map(str, words))[:300]}\n")

    subprocess.run = _traced


@pytest.fixture(scope="session", autouse=True)
def guest_env():
    assert os.path.exists(SSD) and os.path.exists(HDD), "guest disks virtio-ssd/hdd missing"
    PERSIST.mkdir(parents=True, exist_ok=True)
    os.environ["HOTCACHE_STATE"] = str(PERSIST / "mappings.yaml")
    os.environ["HOTCACHE_FSTAB"] = str(PERSIST / "fstab")
    os.environ["HOTCACHE_UNIT_DIR"] = str(PERSIST / "units")
    os.environ.setdefault("HOTCACHE_FLUSH_TIMEOUT", "300")
    sh("modprobe", "-a", "dm-mod", "dm-cache", "dm-cache-smq", "dm-cache-cleaner", "dm-delay", "bcache",
       "xfs", "loop")
    partition_disks()
    yield

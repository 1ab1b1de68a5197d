"""Guest session setup: modules, partitions, and where persistent state lives."""

from __future__ import annotations

import os

import pytest
from vmlib import HDD, PERSIST, SSD, partition_disks, sh


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

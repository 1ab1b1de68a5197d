"""Guest session setup: modules, partitions, and where persistent state lives."""

from __future__ import annotations

import os

import pytest
from vmlib import HDD, PERSIST, SSD, poll, sh

from cases import HDD_PARTS_MIB, SSD_PARTS_MIB


@pytest.fixture(scope="session", autouse=True)
def guest_env():
    assert os.path.exists(SSD) and os.path.exists(HDD), "guest disks virtio-ssd/hdd missing"
    PERSIST.mkdir(parents=True, exist_ok=True)
    os.environ["HOTCACHE_STATE"] = str(PERSIST / "mappings.yaml")
    os.environ["HOTCACHE_FSTAB"] = str(PERSIST / "fstab")
    os.environ["HOTCACHE_UNIT_DIR"] = str(PERSIST / "units")
    os.environ.setdefault("HOTCACHE_FLUSH_TIMEOUT", "300")
    sh("modprobe", "-a", "dm-mod", "dm-cache", "dm-cache-smq", "dm-cache-cleaner", "bcache",
       "xfs", "loop")
    for disk, parts in ((SSD, SSD_PARTS_MIB), (HDD, HDD_PARTS_MIB)):
        if not os.path.exists(f"{disk}-part1"):   # fresh images; never after the reboot
            layout = "label: gpt\n" + "".join(f",{m}M\n" for m in parts) + ",\n"
            sh("sfdisk", "--quiet", disk, input=layout)
    sh("udevadm", "settle")
    poll("partition links", lambda: all(os.path.exists(f"{d}-part4") for d in (SSD, HDD)))
    yield

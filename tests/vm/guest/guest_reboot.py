"""Boot 2, on the same disk images: nothing is registered, loaded or mounted by hotcache
yet; `hotcache restore` must bring back each cache, its tunables and its mount."""

from __future__ import annotations

import json

import pytest
from vmlib import PERSIST, checksums, hotcache, name_of, sh, status

from cases import BACKENDS
from guest_backends import REBOOT_TUNABLES, data_dir


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


def test_restore_after_reboot(backend):
    res = hotcache("restore", name_of(backend), "--yes")
    assert res.code == 0, res.out
    st = status(backend)
    assert st["ok"], st["problems"]
    assert st["mounted"] and st["fs_uuid_matches"]
    assert st["cache"]["mode"] == "writeback"
    sums = json.loads((PERSIST / f"sums-r-{backend}.json").read_text())
    assert checksums(data_dir(backend), "r") == sums
    tunables = REBOOT_TUNABLES[backend]
    if backend == "bcache":
        from hotcache.provision.backends import bcache_sysfs as sb
        from hotcache.provision.block.host import Host
        host = Host()
        node = st["devices"]["origin"]["node"]
        bdev = sb.bdev_dir(host, node)
        assert host.read(f"{bdev}/writeback_percent") == "20"
        assert sb.parse_human(host.read(f"{bdev}/sequential_cutoff")) == 0
        cset = sb.set_dir(sb.attached_set(host, node))
        assert host.read(f"{cset}/congested_read_threshold_us") == "0"
    else:
        import os
        rdev = os.stat(st["cached_device"]).st_rdev
        table = sh("dmsetup", "table", "-j", os.major(rdev), "-m", os.minor(rdev)).stdout
        assert f"migration_threshold {tunables['migration_threshold']}" in table, table


def test_restore_again_changes_nothing(backend):
    res = hotcache("restore", name_of(backend), "--yes", "--json")
    assert res.code == 0, res.out
    assert res.json["changed"] is False, res.json["steps"]

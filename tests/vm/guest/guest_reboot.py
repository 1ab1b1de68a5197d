"""Boot 2, on the same disk images: nothing is registered, loaded or mounted by hotcache
yet; `hotcache restore` must bring back each cache, its tunables and its mount."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from vmlib import PERSIST, checksums, hotcache, name_of, sh, status

from cases import BACKENDS
from guest_backends import REBOOT_TUNABLES, data_dir, live_tunables


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


def test_restore_after_reboot(backend):
    res = hotcache("restore", name_of(backend), "--yes")
    assert res.code == 0, res.out
    st = status(backend)
    assert st["ok"], st["problems"]
    # The cache came back with what it held: restore reloaded dm-cache's table on the
    # recorded metadata without zeroing it (zeroed, it would hold nothing, dirty or not).
    before = json.loads((PERSIST / f"cache-before-reboot-{backend}.json").read_text())
    used = st["cache"]["cache_used_bytes"]
    assert used and used >= 0.9 * before["cache_used_bytes"], (before, st["cache"])
    if backend == "dm-cache":   # its dirty blocks are held (migration_threshold 64)
        assert st["cache"]["dirty_bytes"] >= before["dirty_bytes"] > 0, (before, st["cache"])
    assert st["mounted"] and st["fs_uuid_matches"]
    assert st["cache"]["mode"] == "writeback"
    sums = json.loads((PERSIST / f"sums-r-{backend}.json").read_text())
    assert checksums(data_dir(backend), "r") == sums
    tunables = REBOOT_TUNABLES[backend]
    if backend == "bcache":
        from hotcache.provision.backends.parts import bcache_sysfs as sb
        from hotcache.provision.block.host import Host
        host = Host()
        node = st["devices"]["origin"]["node"]
        bdev = sb.bdev_dir(host, node)
        assert host.read(f"{bdev}/writeback_percent") == "20"
        assert sb.parse_human(host.read(f"{bdev}/sequential_cutoff")) == 0
        cset = sb.set_dir(sb.attached_set(host, node))
        assert host.read(f"{cset}/congested_read_threshold_us") == "0"
    else:
        table = live_tunables(backend)
        assert f"migration_threshold {tunables['migration_threshold']}" in table, table


def test_restore_again_changes_nothing(backend):
    res = hotcache("restore", name_of(backend), "--yes", "--json")
    assert res.code == 0, res.out
    assert res.json["changed"] is False, res.json["steps"]


def test_hot_copies_survive_the_power_cut():
    """Boot 1 ended in a power cut (guest/powercut.py): copy A had returned, copy B was
    running. syncfs before journaling and before publishing is what makes this hold:
    A's published copy is whole (real `sha256sum -c`, every source file, nothing else),
    and every file B's journal names is on disk with the journal's sha256."""
    from powercut import mountpoint, partition

    facts_file = PERSIST / "powercut.json"
    assert facts_file.exists(), "boot 1 never reached the power cut: see powercut.log"
    facts = json.loads(facts_file.read_text())
    assert facts["a"]["code"] == 0, facts["a"]["out"]
    assert facts["b"]["running"] and facts["b"]["journal_lines_before"] > 0, facts["b"]
    for copy in "ab":
        mountpoint(copy).mkdir(parents=True, exist_ok=True)
        sh("mount", partition(copy), mountpoint(copy))      # replays XFS's log
    try:
        # A returned: published (the parent folder was fsync'd), and complete
        hot = mountpoint("a") / "hot"
        assert hot.is_dir(), "copy A returned 0 but its published folder is gone"
        check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=hot,
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr
        assert checksums(hot) == facts["sums"]["a"]
        assert json.loads((hot / ".hotcache-copy.json").read_text())["complete"] is True
        # B was cut mid-way: never published partially; what its journal vouches for is there
        staged = mountpoint("b") / ".hot.hotcache-staging"
        assert not (mountpoint("b") / "hot").exists(), "copy B was published while running"
        lines = (staged / ".hotcache-journal").read_text().splitlines()
        journal = []
        for i, line in enumerate(lines):
            try:
                journal.append(json.loads(line))
            except ValueError:      # only the last line may be cut short (resume skips it)
                assert i == len(lines) - 1, lines
        assert len(journal) >= facts["b"]["journal_lines_before"], \
            (len(journal), facts["b"])   # a later checkpoint's syncfs made these durable
        for rel, size, _mtime, digest in journal:
            data = (staged / rel).read_bytes()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (size, digest), rel
            assert digest == facts["sums"]["b"][rel], rel
    finally:
        for copy in "ab":
            sh("umount", mountpoint(copy), check=False)

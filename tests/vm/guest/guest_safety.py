"""Storage safety, boot 1 of 2 (docs/safety.md): a bcache and two dm-cache caches, all writeback,
built from a spec that names the disks by kernel name (/dev/vda1...), each holding files;
the dm-caches keep dirty blocks (migration_threshold below one block). A fourth disk, the
bystander, holds ext4 with data. Boot 2 (guest_safety_reboot.py) comes up with the disks
in another order (cases.SAFETY_ORDERS): the SSD's kernel names now point at the
bystander, and the second dm-cache's names (on ssd2) at the first one's SSD and at
bcache's SSD."""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from pathlib import Path

import pytest
import yaml
from vmlib import (MOUNTS, PERSIST, SSD2, behind_header, checksums, dm_ssd, drop_caches,
                   hotcache, one_cache_spec, partition_ssd2, poll, sh, status, write_files)

BYSTANDER = "/dev/disk/by-id/virtio-by"
# Boot 1 order: ssd, hdd, ssd2, by -> vda, vdb, vdc, vdd. Pairs 1 and 2 of guest/conftest's
# layout, and ssd2's two partitions. name -> (backend, origin, cache, tunables, origin by-id)
HOLD = {"migration_threshold": 64}     # below one block: dm-cache keeps its dirty blocks
CACHES = {"sbcache": ("bcache", "/dev/vdb1", "/dev/vda1", {}, "virtio-hdd-part1"),
          "sdmcache": ("dm-cache", "/dev/vdb2", "/dev/vda2", HOLD, "virtio-hdd-part2"),
          "sdmcache2": ("dm-cache", "/dev/vdc1", "/dev/vdc2", HOLD, "virtio-ssd2-part1")}
CACHE_BY_ID = {"sbcache": "virtio-ssd-part1", "sdmcache": "virtio-ssd-part2",
               "sdmcache2": "virtio-ssd2-part2"}


def device_sum(path) -> str:
    """A checksum of a whole device, to tell that not one byte of it changed: crc32, which
    a stray write escapes with odds of 1 in 2**32. sha256 of an 80 MiB partition costs
    2.2 s of emulated CPU against 0.85 s (reading alone: 0.65 s), and the bystander's two
    are summed at every step of the second boot."""
    value = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            value = zlib.crc32(chunk, value)
    return f"{value:08x}"


def dirty(name: str) -> int:
    """Dirty bytes of a cache: from `status`, or (status reads the cache's counters only
    when it finds no problem, e.g. once unmounted) from its live dm-cache table."""
    st = status(name)
    if "cache" in st:
        return st["cache"]["dirty_bytes"]
    print(f"status of {name}: {st['problems']}", flush=True)
    fields = sh("dmsetup", "status", f"hc-{name}-cache").stdout.split()
    assert fields[2] == "cache", fields
    return int(fields[13]) * int(fields[5]) * 512      # dirty blocks x block sectors


def test_bystander_holds_ext4_data():
    partition_ssd2()
    sh("sfdisk", "--quiet", BYSTANDER, input="label: gpt\n,80M\n,80M\n")
    sh("udevadm", "settle")
    poll("bystander partitions", lambda: os.path.exists(f"{BYSTANDER}-part2"))
    sums = {}
    for n in (1, 2):
        part = f"{BYSTANDER}-part{n}"
        sh("mkfs.ext4", "-q", "-F", part)
        mp = MOUNTS / f"by{n}"
        mp.mkdir(parents=True, exist_ok=True)
        sh("mount", part, mp)
        write_files(mp, 5, 256 * 1024, "p")
        sh("umount", mp)
        sums[n] = device_sum(part)
    (PERSIST / "bystander.json").write_text(json.dumps(sums))


def test_build_on_kernel_names():
    assert os.path.realpath("/dev/disk/by-id/virtio-ssd") == "/dev/vda", "boot 1 disk order"
    assert os.path.realpath(SSD2) == "/dev/vdc", "boot 1 disk order"
    poll("ssd2 partitions", lambda: os.path.exists(f"{SSD2}-part2"))
    caches = [{"name": name, "backend": backend, "mode": "writeback", "tunables": tunables,
               "origin": {"path": origin, "wipe": True}, "cache": {"path": cache, "wipe": True},
               "filesystem": {"mountpoint": str(MOUNTS / name)}}
              for name, (backend, origin, cache, tunables, _) in CACHES.items()]
    spec = PERSIST / "spec-safety.yaml"
    spec.write_text(yaml.safe_dump({"version": 1, "caches": caches}))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    entry = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"]["sdmcache"]
    assert entry["devices"]["cache"]["identity"]["serial"] == "ssd"
    for name in CACHES:
        folder = MOUNTS / name / "data"
        write_files(folder, 30, 128 * 1024, "s")
        for _ in range(4):      # smq promotes blocks read again and again
            drop_caches()
            checksums(folder, "s")
        for i in range(30):     # overwritten in place: writeback hits stay dirty on the SSD
            with open(folder / f"s{i:04d}.bin", "r+b") as f:
                f.write(os.urandom(128 * 1024))
        sh("sync")
        (PERSIST / f"sums-{name}.json").write_text(json.dumps(checksums(folder, "s")))
    for name in ("sdmcache", "sdmcache2"):
        assert poll(f"dirty blocks held in {name}", lambda: dirty(name), timeout=20) > 0


def test_shutdown():
    """What shutdown does: unmount; the caches stay as they are (dm tables just vanish)."""
    for name in CACHES:
        sh("umount", MOUNTS / name)
    for name in ("sdmcache", "sdmcache2"):
        assert dirty(name) > 0                  # still dirty at power-off
    sh("sync")


def fail(dm: str, table: str) -> None:
    """Swap the table of dm device `dm` in place (lvm2's own tests inject faults so)."""
    sh("dmsetup", "suspend", "--noflush", dm)
    sh("dmsetup", "load", dm, "--table", table)
    sh("dmsetup", "resume", dm)


def origin_fails_under_the_mount(name: str, dm: str, sectors: int, linear: str) -> None:
    """A writeback bcache, mounted and holding dirty data, whose origin fails: a read the
    cache cannot serve meets the error and the kernel stops the bcache device under the
    mounted filesystem (at once here; by default after 64 errors). Once the origin is
    back, following hotcache's messages brings the cache back: teardown names the stopped
    device and points at restore, which unmounts the dead mount, waits for the kernel to
    let go of the device and registers the backing device again (the dirty data is
    still in the cache set)."""
    from hotcache.provision.backends.parts import bcache_sysfs as sb
    from hotcache.provision.block.host import Host

    host = Host()
    origin = f"/dev/mapper/{dm}"
    host.write(f"{sb.bdev_dir(host, origin)}/io_error_limit", "1")
    device = os.path.realpath(yaml.safe_load((PERSIST / "mappings.yaml").read_text())[
        "caches"][name]["cached_device"])
    fail(dm, f"0 {sectors} error")
    # the last MiB: never written, so never in the cache, so read from the origin
    sh("dd", f"if={device}", "of=/dev/null", "bs=4k", "count=1", "iflag=direct",
       f"skip={(sectors // 8) - 256}", check=False)
    poll("the kernel to stop the bcache device", lambda: not sb.is_registered(host, origin),
         timeout=60)
    assert os.path.ismount(MOUNTS / name)       # a dead mount of a stopped device
    fail(dm, linear)                            # the origin is back
    res = hotcache("teardown", name, "--yes")
    assert res.code == 3, res.out
    assert f"the kernel stopped {device}" in res.out and f"hotcache restore {name}" in res.out
    res = hotcache("restore", name, "--yes")
    assert res.code == 0, (res.out, bcache_state())
    assert f"unmount {MOUNTS / name}: the kernel stopped its device" in res.out, res.out
    assert status(name)["cache"]["dirty_bytes"] > 0, "the dirty data came back"


def bcache_state() -> str:
    """What the kernel shows of bcache, for a failure's message."""
    return "\n".join(sh(*argv, check=False).stdout for argv in (
        ["ls", "-l", "/dev/bcache/by-uuid", "/sys/fs/bcache"],
        ["sh", "-c", "ls -d /sys/block/*/bcache /sys/block/*/*/bcache; ls /sys/block"],
        ["sh", "-c", "dmesg | grep -i bcache | tail -20"]))


@pytest.mark.parametrize("backend, n", [("bcache", 3), ("dm-cache", 4)])
def test_origin_failing_during_teardown_keeps_everything(backend, n, monkeypatch):
    """Guest tier (c): a writeback cache on a dm-linear origin that starts returning I/O
    errors as teardown's flush begins: teardown fails and keeps the entry, the unit and
    the cache; once the origin is back, following hotcache's messages (restore, then
    teardown, where the kernel stopped the device) puts every file on it. For bcache,
    first the origin fails under the mounted filesystem and the cache is brought back
    (origin_fails_under_the_mount)."""
    from hotcache.provision.backends import bcache
    from hotcache.provision.backends.parts import bcache_sysfs as sb
    from hotcache.provision.block.host import Host

    host = Host()

    # The flush cannot finish on a failing origin: it ends in an error or at this timeout.
    monkeypatch.setenv("HOTCACHE_FLUSH_TIMEOUT", "20")
    hdd = f"/dev/disk/by-id/virtio-hdd-part{n}"
    sectors = int(sh("blockdev", "--getsz", hdd).stdout)
    dm, name = f"flaky{n}", f"f{n}"
    linear = f"0 {sectors} linear {os.path.realpath(hdd)} 0"
    # A dm UUID gives the origin an identity (udev's by-id/dm-uuid-* link): hotcache
    # proves a device by what it is, and a dm-cache origin carries no signature of its
    # own while its filesystem's first blocks are dirty in the cache.
    sh("dmsetup", "create", dm, "--uuid", f"HOTCACHE-TEST-{dm}", "--table", linear)
    sh("udevadm", "settle")
    spec = one_cache_spec(
        name, backend=backend, mode="writeback",
        tunables={"migration_threshold": 64} if backend == "dm-cache" else {},
        origin=f"/dev/mapper/{dm}", cache=f"/dev/disk/by-id/virtio-ssd-part{n}")
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    folder = MOUNTS / name / "data"
    write_files(folder, 20, 128 * 1024, "f")
    if backend == "bcache":     # hold the dirty data on the SSD until the teardown
        host.write(f"{sb.bdev_dir(host, f'/dev/mapper/{dm}')}/writeback_running", "0")
    else:
        for _ in range(4):
            drop_caches()
            checksums(folder, "f")
    for i in range(20):
        with open(folder / f"f{i:04d}.bin", "r+b") as f:
            f.write(os.urandom(128 * 1024))
    sh("sync")
    want = checksums(folder, "f")
    if backend == "bcache":
        assert poll("dirty data", lambda: status(name)["cache"]["dirty_bytes"], timeout=20) > 0
        origin_fails_under_the_mount(name, dm, sectors, linear)
        assert checksums(folder, "f") == want
        host.write(f"{sb.bdev_dir(host, f'/dev/mapper/{dm}')}/writeback_running", "0")
    else:
        assert poll("dirty data", lambda: dirty(name), timeout=20) > 0

    if backend == "bcache":     # the origin fails as the detach (bcache's flush) starts
        detach = bcache.detach

        def origin_fails_then_detach(*args, **kw):
            fail(dm, f"0 {sectors} error")
            return detach(*args, **kw)
        monkeypatch.setattr(bcache, "detach", origin_fails_then_detach)
    else:
        # dm-cache's cleaner starts writing back the moment its table is resumed, and 2.5
        # MiB is clean before any later step of the teardown: the origin fails first.
        # (Unmounted while it is healthy, so only the cleaner's writes meet the errors.)
        sh("umount", MOUNTS / name)
        fail(dm, f"0 {sectors} error")
        assert dirty(name) > 0
    res = hotcache("teardown", name, "--yes")
    assert res.code in (1, 8), res.out                  # the flush did not complete
    monkeypatch.undo()
    monkeypatch.setenv("HOTCACHE_FLUSH_TIMEOUT", "300")
    mapping = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"]
    assert name in mapping, "the entry must be kept"
    assert (PERSIST / "units" / f"hotcache-restore-{name}.service").exists()
    if backend == "bcache":
        assert host.is_dir(sb.set_dir(mapping[name]["backend_state"]["cset_uuid"])), "set kept"

    fail(dm, linear)                                    # the origin is back
    res = hotcache("teardown", name, "--yes")
    if res.code == 3:       # bcache stopped the device on the errors: restore, as told
        assert f"hotcache restore {name}" in res.out, res.out
        res = hotcache("restore", name, "--yes")
        assert res.code == 0, (res.out, bcache_state())
        res = hotcache("teardown", name, "--yes")
    assert res.code == 0, (res.out, bcache_state() if backend == "bcache" else "")
    mp = MOUNTS / f"bare-{name}"
    mp.mkdir(exist_ok=True)
    device, loop = f"/dev/mapper/{dm}", None
    if backend == "dm-cache":   # the filesystem starts after hotcache's header
        loop = device = behind_header(device)
    if backend == "bcache":     # the filesystem starts after the bcache superblock
        show = sh("bcache-super-show", device).stdout
        first = int(next(line.split()[1] for line in show.splitlines()
                         if line.startswith("dev.data.first_sector")))
        loop = device = sh("losetup", "--find", "--show", "--read-only", "--offset",
                           first * 512, f"/dev/mapper/{dm}").stdout.strip()
    sh("mount", "-o", "ro", device, mp)
    try:
        assert checksums(mp / "data", "f") == want, \
            bcache_state() if backend == "bcache" else "the files differ"
    finally:
        sh("umount", mp)
        if loop:
            sh("losetup", "--detach", loop)


@pytest.mark.parametrize("backend, n, hdd", [("bcache", 3, 5), ("dm-cache", 4, 6)])
def test_failed_ssd_named_and_torn_down(backend, n, hdd):
    """A writethrough cache whose SSD (a dm-linear device with a dm UUID) switches to the
    error target after the data was read through it: status and doctor name the failure
    within a bounded time (never "unproven" or "another filesystem"), `teardown
    --cache-failed` ends with exit 0, the entry, unit and fstab line gone, and the
    filesystem mounted from the origin holds every file. Then a new SSD: `hotcache apply`
    attaches a new cache to that filesystem (never formatting it) and every file reads
    back through it."""
    ssd = f"/dev/disk/by-id/virtio-ssd-part{n}"       # free again after the case above
    dm, name = f"ssdfail{n}", f"w{n}"
    sectors = dm_ssd(ssd, dm)
    spec = one_cache_spec(name, backend=backend, mode="writethrough",
                          origin=f"/dev/disk/by-id/virtio-hdd-part{hdd}",
                          cache=f"/dev/mapper/{dm}")
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    fs_uuid = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name][
        "filesystem"]["uuid"]
    folder = MOUNTS / name / "data"
    sums = write_files(folder, 40, 64 * 1024, "s")
    for _ in range(3):                  # read through the cache (smq promotes re-reads)
        drop_caches()
        assert checksums(folder, "s") == sums
    fail(dm, f"0 {sectors} error")

    def readable() -> int:
        drop_caches()
        good = 0
        for file, want in sums.items():
            try:
                good += hashlib.sha256((folder / file).read_bytes()).hexdigest() == want
            except OSError:             # dm-cache errors reads of blocks on the SSD
                pass
        return good
    if backend == "bcache":             # the kernel detaches the failed cache by itself
        poll("every file readable through bcache", lambda: readable() == len(sums),
             timeout=120, interval=5)
    else:
        print(f"{backend}: {readable()}/40 files readable during the failure", flush=True)

    failed_ssd_named(name)
    found = hotcache("doctor", "--json").json["findings"]
    fix = next(f["fix"] for f in found if f["code"] == "CACHE_FAILED" and f["subject"] == name)
    assert f"hotcache teardown {name} --cache-failed" in fix

    res = hotcache("teardown", name, "--cache-failed", "--yes")
    assert res.code == 0, res.out
    assert name not in yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"]
    assert not (PERSIST / "units" / f"hotcache-restore-{name}.service").exists()
    assert fs_uuid not in (PERSIST / "fstab").read_text()
    assert f"UUID={fs_uuid}" in res.out               # the plan says how to mount it
    sh("udevadm", "settle")
    mp = MOUNTS / f"origin-{name}"
    mp.mkdir(exist_ok=True)
    sh("mount", "-o", "noatime", f"UUID={fs_uuid}", mp)
    try:
        assert checksums(mp / "data", "s") == sums
    finally:
        sh("umount", mp)

    # A new SSD (the same partition, zeroed, under a new dm UUID), while the filesystem
    # is mounted from the origin on the cache's mountpoint as the teardown's note says:
    # apply attaches a new cache to that filesystem and formats nothing.
    sh("dmsetup", "remove", dm)
    new = f"ssdnew{n}"
    sectors = dm_ssd(ssd, new)
    sh("mount", "-o", "noatime", f"UUID={fs_uuid}", MOUNTS / name)
    new_ssd_attached(name, spec, dm, new, fs_uuid)
    assert f"UUID={fs_uuid}" in (PERSIST / "fstab").read_text()
    assert (PERSIST / "units" / f"hotcache-restore-{name}.service").exists()
    assert checksums(folder, "s") == sums
    row = status(name)
    assert not [f for f in row["findings"] if f["code"] == "CACHE_FAILED"], row["findings"]
    assert row["cache"]["mode"] == "writethrough", row

    res = hotcache("teardown", name, "--yes")        # flushed and taken down, as usual
    assert res.code == 0, res.out
    sh("dmsetup", "remove", new)


def test_failed_writeback_ssd_needs_the_loss_acknowledged():
    """A writeback dm-cache holding dirty blocks (migration_threshold below one block)
    whose SSD switches to the error target: status reports dirty data at risk, never "no
    dirty data"; the fail-over watcher switches nothing and raises the alarm; `teardown
    --cache-failed` is refused (exit 3, nothing changed) until
    `--accept-loss` covers what status reported, and then ends with exit 0 and the
    filesystem check in its notes. Reuses the dm-cache pair the case above freed."""
    ssd = "/dev/disk/by-id/virtio-ssd-part4"
    dm, name = "ssdwb", "wb"
    sectors = dm_ssd(ssd, dm)
    spec = one_cache_spec(name, backend="dm-cache", mode="writeback", tunables=HOLD,
                          origin={"path": "/dev/disk/by-id/virtio-hdd-part6", "wipe": True},
                          cache=f"/dev/mapper/{dm}")
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    write_files(MOUNTS / name / "data", 40, 64 * 1024, "d")
    assert dirty(name) > 0
    fail(dm, f"0 {sectors} error")

    def failed():
        row = status(name)
        return row if "CACHE_FAILED" in [f["code"] for f in row["findings"]] else None
    row = poll("status to name the failed SSD", failed, timeout=120, interval=5)
    message = next(f["message"] for f in row["findings"] if f["code"] == "CACHE_FAILED")
    assert "dirty data at risk" in message and "no dirty data" not in message, message
    # The fail-over watcher's look: dirty blocks on the dead SSD, so nothing is switched,
    # the alarm is raised (exit 9) and nothing claims the cache runs on its origin.
    table = sh("dmsetup", "table", f"hc-{name}-cache").stdout
    res = hotcache("failover", name, "--json")
    assert res.code == 9, res.out
    (look,) = res.json["caches"]
    assert look["switched"] is False and look["action"] == "alarm", look
    assert sh("dmsetup", "table", f"hc-{name}-cache").stdout == table, "the table was switched"
    assert "on_origin" not in yaml.safe_load((PERSIST / "mappings.yaml").read_text())[
        "caches"][name]

    res = hotcache("teardown", name, "--cache-failed", "--yes")
    assert res.code == 3, res.out
    assert "--accept-loss" in res.out, res.out
    assert name in yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"]
    assert sh("dmsetup", "table", f"hc-{name}-cache").stdout.strip(), "tables kept"
    accept = re.search(r"--accept-loss (\S+?)`", res.out).group(1)
    res = hotcache("teardown", name, "--cache-failed", "--accept-loss", accept, "--yes")
    assert res.code == 0, res.out
    assert "xfs_repair -n" in res.out, res.out
    mapping = yaml.safe_load((PERSIST / "mappings.yaml").read_text())
    assert name not in mapping["caches"] and name in mapping["detached"]
    # No new SSD for this one: the administrator drops the record, as status advises.
    res = hotcache("teardown", name, "--forget", "--yes")
    assert res.code == 0, res.out
    assert name not in yaml.safe_load((PERSIST / "mappings.yaml").read_text()).get(
        "detached", {})
    # --forget touches no device: the mapping that shows the filesystem past hotcache's
    # header on the origin stays until the administrator removes it, as here
    for part in ("", "-cache"):
        sh("dmsetup", "remove", "--retry", f"hc-{name}{part}")
    sh("dmsetup", "remove", dm)
    sh("dd", "if=/dev/zero", f"of={ssd}", "bs=1M", "count=2", "oflag=direct")


def quiesce(mp) -> None:
    """Leave XFS's journal clean, as a filesystem that training only reads has it: the
    journal is written again only when something changes. Writes in the seconds before
    the switch fail, and XFS shuts the filesystem down when its own journal write fails:
    a guest under load, whose switch comes late, would meet that when XFS covers the
    journal of the files this case wrote just before (docs/safety.md)."""
    sh("xfs_freeze", "-f", mp)
    sh("xfs_freeze", "-u", mp)


def _read_uncached(path) -> bytes:
    """The file's bytes from the device: its pages dropped from the page cache first."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


class Readers:
    """Two readers looping over the files `sums` names (name -> sha256) in `folder`, each
    read from the device, from `with` to its end: a plain one, whose failed reads are
    counted, and one that retries EIO as the loaders do (adapters/retry.py), which must
    get every file right in every pass. Both count reads made while `mp` was not
    mounted."""

    def __init__(self, mp, folder, sums: dict[str, str]):
        import threading

        self.mp, self.folder, self.sums = mp, folder, sums
        self.stop = threading.Event()
        self.seen: dict = {"plain_failed": 0, "plain_reads": 0, "retried_passes": 0,
                           "wrong": [], "unmounted": 0}
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._plain, self._retried)]

    def _plain(self) -> None:
        while not self.stop.is_set():
            for file in self.sums:
                self.seen["unmounted"] += not os.path.ismount(self.mp)
                self.seen["plain_reads"] += 1
                try:
                    _read_uncached(self.folder / file)
                except OSError:
                    self.seen["plain_failed"] += 1

    def _retried(self) -> None:
        from hotcache.adapters.retry import retrying
        try:
            while not self.stop.is_set():
                for file, want in self.sums.items():
                    path = self.folder / file
                    # bounded generously: the guests run under emulation, beside others
                    data = retrying(lambda: _read_uncached(path), path, 600)
                    if hashlib.sha256(data).hexdigest() != want:
                        self.seen["wrong"].append(file)
                self.seen["retried_passes"] += 1
        except OSError as exc:      # said by more_passes, not lost with the thread
            self.seen["error"] = f"{type(exc).__name__}: {exc}"

    def more_passes(self, n: int) -> None:
        """Wait for `n` more whole passes of the retrying reader, every file right."""
        done = self.seen["retried_passes"]
        poll(f"{n} more passes of the reader", lambda: self.seen["retried_passes"] >= done + n
             or self.seen.get("error"), timeout=900)
        assert not self.seen.get("error"), self.seen

    def __enter__(self) -> "Readers":
        for t in self.threads:
            t.start()
        self.more_passes(1)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


def test_failover_keeps_the_filesystem_mounted_and_readers_reading():
    """A writethrough dm-cache whose SSD switches to the error target while two readers
    loop over its files (each read from the device): the watcher, as its service runs it
    (`hotcache failover --watch`), switches the cache to a linear mapping of its origin;
    the filesystem stays mounted throughout; the reader that retries EIO as the loaders
    do (adapters/retry.py) gets every file right in every pass, the plain reader's failed
    reads are counted; afterwards every file is right, status says "running on the origin
    since", and the mapping records it for the reboot (guest_safety_reboot.py). Reuses
    the dm-cache pair the cases above freed."""
    import subprocess
    import sys
    import time

    ssd = "/dev/disk/by-id/virtio-ssd-part4"
    dm, name = "fossd", "fo"
    sectors = dm_ssd(ssd, dm)
    spec = one_cache_spec(name, backend="dm-cache", mode="writethrough",
                          origin={"path": "/dev/disk/by-id/virtio-hdd-part6", "wipe": True},
                          cache=f"/dev/mapper/{dm}")
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    assert (PERSIST / "units" / "hotcache-failover.service").exists()
    mp = MOUNTS / name
    folder = mp / "data"
    sums = write_files(folder, 40, 64 * 1024, "f")
    for _ in range(3):                  # read through the cache (smq promotes re-reads)
        drop_caches()
        assert checksums(folder, "f") == sums
    (PERSIST / f"sums-{name}.json").write_text(json.dumps(sums))

    log = PERSIST / "failover-watch.log"
    watcher = subprocess.Popen([str(os.path.join(os.path.dirname(sys.executable), "hotcache")),
                                "failover", "--watch", "--interval", "0.5"],
                               stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        poll("the watcher to start", lambda: "watching" in log.read_text(), timeout=120)
        with Readers(mp, folder, sums) as readers:
            quiesce(mp)
            start = time.monotonic()
            fail(dm, f"0 {sectors} error")
            poll("the cache switched to its origin", lambda: sh(
                "dmsetup", "table", f"hc-{name}-cache").stdout.split()[2:3] == ["linear"],
                timeout=120, interval=0.05)
            took = time.monotonic() - start
            readers.more_passes(2)
        seen = readers.seen
        # the watcher's line comes once its resume returns, which may be well after the
        # switch (the kernel tears down the failed cache table first)
        poll("the watcher to say where the cache runs",
             lambda: "running on the origin since" in log.read_text(), timeout=300)
        print(f"failover: the watcher's line came {time.monotonic() - start - took:.1f} s "
              "after the switch", flush=True)
    finally:
        watcher.terminate()
        watcher.wait(60)
    (PERSIST / "failover-figures.json").write_text(json.dumps({**seen, "switch_s": took}))
    print(f"failover: switched {took:.2f} s after the SSD failed; plain reader: "
          f"{seen['plain_failed']} of {seen['plain_reads']} reads failed; retrying reader: "
          f"{seen['retried_passes']} passes, every file right", flush=True)
    assert not seen["wrong"] and seen["unmounted"] == 0, seen
    assert "running on the origin since" in log.read_text(), log.read_text()
    drop_caches()
    assert checksums(folder, "f") == sums
    res = hotcache("status", name, "--json")
    assert res.code == 5, res.out
    (found,) = [f for f in res.json["caches"][0]["findings"] if f["code"] == "CACHE_FAILED"]
    assert re.match(r"running on the origin since \S+: cache failed \(dm-cache reports "
                    r"(Fail|Error)", found["message"]), found
    entry = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name]
    assert entry["on_origin"]["table"].split()[2] == "linear"
    new_ssd_attached_under_the_mount(name, spec, dm, sums)
    # Left so for the reboot: guest_safety_reboot.py mounts it from the origin.


def mount_id(mp) -> str:
    """The kernel's ID of the mount at `mp` (a new mount gets a new one)."""
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] == str(mp):
            return fields[0]
    raise AssertionError(f"nothing mounted at {mp}")


def new_ssd_attached_under_the_mount(name: str, spec, failed_dm: str,
                                     sums: dict[str, str]) -> None:
    """A cache running on its origin gets a new SSD from `hotcache apply`, with no
    teardown and no unmount: the mount stays the same mount, a file opened before reads
    on after, and the device is a cache again. Then that SSD dies in turn and the cache
    is switched to its origin again, as the reboot expects it."""
    mp = MOUNTS / name
    folder = mp / "data"
    part = "/dev/disk/by-id/virtio-ssd-part3"       # free in this chain
    new = "fonew1"
    sectors = dm_ssd(part, new)
    before = mount_id(mp)
    first = next(iter(sums))
    held = open(folder / first, "rb")
    spec.write_text(spec.read_text().replace(f"/dev/mapper/{failed_dm}", f"/dev/mapper/{new}"))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    assert "warm-up starts over" in res.out and "umount" not in res.out, res.out
    assert mount_id(mp) == before, "the filesystem was never unmounted"
    with held:
        assert hashlib.sha256(held.read()).hexdigest() == sums[first]
    assert sh("dmsetup", "table", f"hc-{name}-cache").stdout.split()[2] == "cache"
    entry = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name]
    assert "on_origin" not in entry and entry["state"] == "ready", entry
    row = status(name)
    assert row["ok"] and row["cache"]["mode"] == "writethrough", row
    drop_caches()
    assert checksums(folder, "f") == sums

    quiesce(mp)
    fail(new, f"0 {sectors} error")

    def switched():
        drop_caches()
        for file in sums:           # reads of cached blocks fail until the switch
            try:
                _read_uncached(folder / file)
            except OSError:
                pass
        (look,) = hotcache("failover", name, "--json").json["caches"]
        return look if look["switched"] else None
    poll("the watcher to switch the new cache to its origin", switched, timeout=300,
         interval=2)
    assert mount_id(mp) == before
    drop_caches()
    assert checksums(folder, "f") == sums


def fails_over_under_the_mounted_filesystem(name: str, dm: str, sectors: int, folder,
                                            sums: dict[str, str], prefix: str) -> None:
    """lvmcache's fail-over: the new SSD dies under the mounted filesystem while two
    readers loop over the files (guest_safety.Readers); the watcher's look (`hotcache
    failover`, as the service runs it once a second) switches the LV's top device to its
    origin sub-LV in place: still mounted throughout, the retrying reader gets every file
    right in every pass, the plain reader's failed reads are counted, status says where
    it runs, and the mapping records it."""
    mp = MOUNTS / name
    with Readers(mp, folder, sums) as readers:
        quiesce(mp)
        sh("dmsetup", "suspend", "--noflush", dm)
        sh("dmsetup", "load", dm, "--table", f"0 {sectors} error")
        sh("dmsetup", "resume", dm)

        def switched():
            (look,) = hotcache("failover", name, "--json").json["caches"]
            return look if look["switched"] else None
        look = poll("the watcher to switch the cache to its origin", switched, timeout=300,
                    interval=1)
        readers.more_passes(2)
    seen = readers.seen
    print(f"lvmcache failover: plain reader: {seen['plain_failed']} of {seen['plain_reads']} "
          f"reads failed; retrying reader: {seen['retried_passes']} passes, every file right",
          flush=True)
    assert not seen["wrong"] and seen["unmounted"] == 0, seen
    assert os.path.ismount(mp)
    assert sh("dmsetup", "table", look["device"]).stdout.split()[2] == "linear", look
    drop_caches()
    assert checksums(folder, prefix) == sums
    res = hotcache("status", name, "--json")
    assert res.code == 5, res.out
    (found,) = [f for f in res.json["caches"][0]["findings"] if f["code"] == "CACHE_FAILED"]
    assert found["message"].startswith("running on the origin since "), found
    entry = yaml.safe_load((PERSIST / "mappings.yaml").read_text())["caches"][name]
    assert entry["on_origin"]["table"].split()[2] == "linear", entry


def new_ssd_attached(name: str, spec: Path, old: str, new: str, fs_uuid: str) -> dict:
    """`hotcache apply` of `spec` naming the new SSD `new` instead of `old`: a new cache
    on the filesystem the origin kept (nothing formatted, the warm-up starting over).
    Returns the cache's mapping entry."""
    spec.write_text(spec.read_text().replace(f"/dev/mapper/{old}", f"/dev/mapper/{new}"))
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    assert "warm-up starts over" in res.out, res.out
    mapping = yaml.safe_load((PERSIST / "mappings.yaml").read_text())
    assert name not in mapping.get("detached", {})
    entry = mapping["caches"][name]
    assert entry["state"] == "ready"
    assert entry["filesystem"]["uuid"] == fs_uuid       # not formatted
    return entry


def failed_ssd_named(name: str) -> None:
    """`status` names cache `name`'s failed SSD within two minutes as the kernel reports
    it (never as an unproven device or another filesystem), with no dirty data at risk."""
    def failed():
        row = status(name)
        return row if "CACHE_FAILED" in [f["code"] for f in row["findings"]] else None
    row = poll("status to name the failed SSD", failed, timeout=120, interval=5)
    codes = [f["code"] for f in row["findings"]]
    assert not {"DEVICE_UNPROVEN", "WRONG_FILESYSTEM"} & set(codes), row["findings"]
    message = next(f["message"] for f in row["findings"] if f["code"] == "CACHE_FAILED")
    assert message.startswith("cache failed: ") and "no dirty data at risk" in message


def lvmcache_on_a_wrapped_ssd(name: str, dm: str, ssd: str, origin: str, tag: str,
                              tmp_path, monkeypatch) -> tuple[str, int, Path, Path, dict]:
    """lvmcache `name` in writethrough on virtio-`origin`, its SSD the dm-linear device
    `dm` (with a dm UUID) over virtio-`ssd`. LVM is shown the wrapper only: a
    global_filter hides the partition under it, which would show the same PV twice.
    Files tagged `tag` are written and read through the cache until smq promotes them.
    Returns the partition, the SSD's sectors, the spec, the data folder and the sums."""
    part = os.path.realpath(f"/dev/disk/by-id/virtio-{ssd}")
    conf = tmp_path / "lvm"
    conf.mkdir()
    (conf / "lvm.conf").write_text(
        f'devices {{ global_filter = [ "r|^{part}$|", "r|{ssd}$|" ] }}\n')
    monkeypatch.setenv("LVM_SYSTEM_DIR", str(conf))
    sectors = dm_ssd(part, dm)
    spec = one_cache_spec(name, backend="lvmcache", mode="writethrough",
                          origin={"path": f"/dev/disk/by-id/virtio-{origin}", "wipe": True},
                          cache=f"/dev/mapper/{dm}")
    res = hotcache("apply", spec, "--yes")
    assert res.code == 0, res.out
    folder = MOUNTS / name / "data"
    sums = write_files(folder, 40, 64 * 1024, tag)
    for _ in range(3):                  # read through the cache (smq promotes re-reads)
        drop_caches()
        assert checksums(folder, tag) == sums
    return part, sectors, spec, folder, sums


def test_lvmcache_switched_to_its_origin_is_left_so_for_the_reboot(monkeypatch, tmp_path):
    """lvmcache in writethrough (origin hdd part 1; its SSD a dm-linear device with a dm
    UUID over ssd part 1, which a global_filter hides from LVM, as the partition would
    show the same PV twice), its SSD failing while two readers read: switched to its
    origin sub-LV under the mounted filesystem. Then the SSD is gone for good (its PV
    label erased, as a dead disk shows none at the next boot); guest_safety_reboot.py
    checks what the boot's restore makes of it."""
    dm, name = "lvmfo", "lo"
    part, sectors, _, folder, sums = lvmcache_on_a_wrapped_ssd(
        name, dm, "ssd-part1", "hdd-part1", "o", tmp_path, monkeypatch)
    (PERSIST / f"sums-{name}.json").write_text(json.dumps(sums))
    fails_over_under_the_mounted_filesystem(name, dm, sectors, folder, sums, "o")
    sh("dd", "if=/dev/zero", f"of={part}", "bs=1M", "count=2", "oflag=direct")

"""Whole disks and their partitions, and the disk under `/`, on a fake sysfs (host loop
devices show no partitions, and this host's / is plain ext4): one device named twice, as
a disk and as its partition, is one owner."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotcache.provision.backends.plain import Plain
from hotcache.provision.block import blockdev
from hotcache.provision.block.blockdev import Mount
from hotcache.provision.block.host import Host
from hotcache.provision.engine import apply, owners
from hotcache.provision.plan import Plan
from hotcache.provision.engine.spec import CacheSpec
from hotcache.provision.system.runner import Result, Runner


class Blkid(Runner):
    """blkid answers per device (TYPE=...), lsblk a fixed JSON; every argv recorded."""

    def __init__(self, types: dict[str, str] | None = None, lsblk: str = ""):
        super().__init__()
        self.types, self.lsblk, self.asked = types or {}, lsblk, []

    def query(self, argv, *, check=True):
        argv = [str(a) for a in argv]
        self.asked.append(argv)
        if argv[0] == "blkid":
            kind = self.types.get(argv[-1])
            return Result(argv, 0, f"TYPE={kind}\n", "") if kind else Result(argv, 0, "", "")
        if argv[0] == "wipefs":
            return Result(argv, 0, "", "")
        return Result(argv, 0, self.lsblk, "")

    run = query


class Tree(Host):
    """The fake sysfs tree under the test's folder, with `mounted` as its mount table."""

    mounted: list = []

    def mounts(self):
        return self.mounted


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    """sdb (8:16) with partitions sdb1 (8:17) and sdb2 (8:18); sdc (8:32) alone."""
    devices = tmp_path / "devices"
    disks = {"sdb": ("8:16", {"sdb1": "8:17", "sdb2": "8:18"}), "sdc": ("8:32", {}),
             "sdd": ("8:48", {})}
    klass, by_num = tmp_path / "sys" / "class" / "block", tmp_path / "sys" / "dev" / "block"
    klass.mkdir(parents=True)
    by_num.mkdir(parents=True)

    def node(path: Path, num: str, part: bool) -> None:
        (path / "holders").mkdir(parents=True)
        (path / "dev").write_text(num + "\n")
        (path / "size").write_text("2097152\n")
        if part:
            (path / "partition").write_text("1\n")
        (klass / path.name).symlink_to(path)
        (by_num / num).symlink_to(path)

    for disk, (num, parts) in disks.items():
        node(devices / disk, num, False)
        for part, pnum in parts.items():
            node(devices / disk / part, pnum, True)
    monkeypatch.setattr(owners, "SYS_DEV_BLOCK", by_num)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "swaps").write_text("Filename Type Size Used Priority\n")
    monkeypatch.setattr(Tree, "mounted", [])
    return tmp_path


def on(sysfs: Path, runner: Runner) -> Tree:
    return Tree(runner, sysfs)


def test_a_partition_and_its_disk_overlap_siblings_do_not(sysfs):
    disk, p1, p2 = (owners.block_tokens(n) for n in ("8:16", "8:17", "8:18"))
    claim = lambda name, t: owners.Claim(name, name, frozenset(t[0]), frozenset(t[1]))  # noqa
    assert p1 == ({"blk:8:17"}, {"blk:8:16"})
    assert claim("a", disk).overlaps(claim("b", p1)) and claim("b", p1).overlaps(claim("a", disk))
    assert not claim("a", p1).overlaps(claim("b", p2))


@pytest.mark.parametrize("setup, why", [
    (lambda s: {"/dev/sdb1": "LVM2_member"}, "its partition /dev/sdb1 is an LVM physical volume"),
    (lambda s: {"/dev/sdb2": "linux_raid_member"}, "its partition /dev/sdb2 is an md RAID member"),
    (lambda s: {"/dev/sdb1": "crypto_LUKS"}, "its partition /dev/sdb1 is a LUKS device"),
    (lambda s: [(s / "devices/sdb/sdb2/holders/dm-3").mkdir(), {}][1],
     "its partition /dev/sdb2 is in use by dm-3 (holders)"),
    (lambda s: [(s / "proc/swaps").write_text("Filename Type\n/dev/sdb1 partition 8 0 -2\n"), {}][1],
     "its partition /dev/sdb1 is active swap"),
])
def test_a_whole_disk_with_a_partition_in_use_is_refused_even_with_wipe(sysfs, setup, why):
    runner = Blkid(setup(sysfs))
    host = on(sysfs, runner)
    assert why in blockdev.partitions_in_use(host, "/dev/sdb")
    report = blockdev.report(host, "/dev/sdb", roots=blockdev.RootDevices())
    plan = Plan()
    p = apply.Planner(apply.Env(runner, sysfs / "m.yaml", sysfs / "fstab", host), "hot", plan)
    spec = CacheSpec.model_validate({"name": "hot", "backend": "none",
                                     "origin": {"path": "/dev/sdb", "wipe": True},
                                     "filesystem": {"mountpoint": "/mnt/hot"}})
    dev = apply.Device("origin", spec.origin, "/dev/sdb", True, report.size, report, {})
    apply.preflight(p, Plain(host), spec, None, dev, 0)
    assert len(p.refusals) == 1 and why in p.refusals[0]
    assert "even with wipe: true" in p.refusals[0]
    assert plan.steps == [], "no wipefs is planned"


def test_an_idle_partitioned_disk_is_only_a_signature_matter(sysfs):
    assert blockdev.partitions_in_use(on(sysfs, Blkid({"/dev/sdb1": "ext4"})), "/dev/sdb") == []
    assert blockdev.partitions_in_use(on(sysfs, Blkid()), "/dev/sdc") == []


def mount(num, mp, fstype, source, *options):
    return Mount(num, mp, fstype, tuple(options), source)


def test_root_on_btrfs_protects_every_device_of_the_filesystem(sysfs, monkeypatch):
    fs = sysfs / "sys" / "fs" / "btrfs" / "0a1b" / "devices"
    fs.mkdir(parents=True)
    (fs / "sdb2").symlink_to(sysfs / "devices/sdb/sdb2")
    (fs / "sdc").symlink_to(sysfs / "devices/sdc")
    monkeypatch.setattr(Tree, "mounted", [mount("0:35", "/", "btrfs", "/dev/sdb2")])
    roots = blockdev.root_devices(on(sysfs, Blkid()))
    assert roots.unknown is None and roots == {"sdb2", "sdb", "sdc"}


def test_root_on_overlay_follows_its_upper_and_lower_folders(sysfs, monkeypatch):
    monkeypatch.setattr(Tree, "mounted", [
        mount("0:40", "/", "overlay", "overlay", "rw", "lowerdir=/lower/a:/lower/b",
              "upperdir=/data/up", "workdir=/data/work"),
        mount("8:17", "/data", "ext4", "/dev/sdb1"),
        mount("8:32", "/lower", "ext4", "/dev/sdc")])
    roots = blockdev.root_devices(on(sysfs, Blkid()))
    assert roots.unknown is None and roots == {"sdb1", "sdb", "sdc"}


def test_root_on_an_overlay_whose_folders_are_not_visible_refuses_every_device(sysfs,
                                                                               monkeypatch):
    monkeypatch.setattr(Tree, "mounted", [
        mount("0:40", "/", "overlay", "overlay", "upperdir=/var/lib/docker/x/diff",
              "lowerdir=/var/lib/docker/y")])
    roots = blockdev.root_devices(on(sysfs, Blkid()))
    assert roots.unknown and "no filesystem visible here" in roots.unknown
    report = blockdev.report(on(sysfs, Blkid()), "/dev/sdd", roots=roots)
    assert not report.holds_root
    assert any("refuses every device" in why for why in report.problems())


def test_root_on_zfs_protects_the_pool_members_lsblk_names(sysfs, monkeypatch):
    monkeypatch.setattr(Tree, "mounted", [mount("0:30", "/", "zfs", "rpool/ROOT/debian")])
    lsblk = ('{"blockdevices": [{"kname": "sdb1", "fstype": "zfs_member", "label": "rpool"},'
             '{"kname": "sdc", "fstype": "zfs_member", "label": "tank"},'
             '{"kname": "sdd", "fstype": null, "label": null}]}')
    runner = Blkid(lsblk=lsblk)
    roots = blockdev.root_devices(on(sysfs, runner))
    assert roots.unknown is None and roots == {"sdb1", "sdb"}
    assert ["lsblk", "--json", "--output", "KNAME,FSTYPE,LABEL"] in runner.asked
    roots = blockdev.root_devices(on(sysfs, Blkid(lsblk='{"blockdevices": []}')))
    assert roots.unknown and "rpool" in roots.unknown


def test_root_on_an_unknown_filesystem_refuses_every_device(sysfs, monkeypatch):
    monkeypatch.setattr(Tree, "mounted", [mount("0:50", "/", "mystery", "thing")])
    roots = blockdev.root_devices(on(sysfs, Blkid()))
    assert "mystery" in roots.unknown


def test_lsblk_failure_for_zfs_root_is_an_error(sysfs, monkeypatch):
    from hotcache.provision.errors import ProbeFailed

    class Broken(Blkid):
        def query(self, argv, *, check=True):
            return Result([str(a) for a in argv], 1, "", "lsblk: unknown column: LABEL")
    monkeypatch.setattr(Tree, "mounted", [mount("0:30", "/", "zfs", "rpool/ROOT")])
    with pytest.raises(ProbeFailed) as info:
        blockdev.root_devices(on(sysfs, Broken()))
    assert "lsblk" in str(info.value) and "unknown column" in str(info.value)


def test_a_failing_probe_while_planning_is_an_error_not_a_blank_disk(sysfs):
    from hotcache.provision.errors import ProbeFailed

    class Failing(Blkid):
        def query(self, argv, *, check=True):
            argv = [str(a) for a in argv]
            return Result(argv, 1, "", f"{argv[0]}: error: /dev/sdc: Input/output error")
    runner = Failing()
    host = on(sysfs, runner)
    report = blockdev.report(host, "/dev/sdc", roots=blockdev.RootDevices(), strict=False)
    assert report.unreadable and not report.hard_problems()
    p = apply.Planner(apply.Env(runner, sysfs / "m.yaml", sysfs / "fstab", host), "hot", Plan())
    spec = CacheSpec.model_validate({"name": "hot", "backend": "none",
                                     "origin": {"path": "/dev/sdc", "wipe": True},
                                     "filesystem": {"mountpoint": "/mnt/hot"}})
    dev = apply.Device("origin", spec.origin, "/dev/sdc", True, report.size, report, {})
    with pytest.raises(ProbeFailed) as info:
        apply.preflight(p, Plain(host), spec, None, dev, 0)
    assert info.value.exit_code == 4 and "Input/output error" in str(info.value)
    assert p.plan.steps == []

"""A fake host for planning tests: block devices in a fake sysfs and /dev/disk/by-id tree,
their signatures answered by a recording runner (blkid, wipefs, dmsetup), nothing mounted.
Planning reads the host only through sysfs paths and probes, so a plan can be computed
against a named host state (disks moved, tables not loaded, a probe failing) and its
exact argv asserted. Nothing here runs a program."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hotcache.provision.system.runner import Result, Runner


@dataclass
class Disk:
    serial: str | None
    mib: int
    sig: dict = field(default_factory=dict)        # blkid TYPE/UUID
    partn: int | None = None


class FakeRunner(Runner):
    """Records every run(); answers the read-only probes from the fake host."""

    def __init__(self, host: "FakeHost"):
        super().__init__(dry_run=True)
        self.host = host
        self.failing: set[str] = set()      # programs whose probes fail

    def query(self, argv, *, check=True):
        argv = [str(a) for a in argv]
        prog = argv[0]
        if prog in self.failing:
            return Result(argv, 1, "", f"{prog}: simulated failure")
        if prog == "blkid":
            disk = self.host.disks.get(os.path.basename(argv[-1]))
            if disk is None:
                return Result(argv, 2, "", "")
            out = "".join(f"{k}={v}\n" for k, v in disk.sig.items())
            return Result(argv, 0, f"DEVNAME={argv[-1]}\n{out}" if out else "", "")
        if prog == "wipefs":
            disk = self.host.disks[os.path.basename(argv[-1])]
            sigs = [{"type": disk.sig["TYPE"], "offset": "0x0"}] if disk.sig.get("TYPE") else []
            import json
            return Result(argv, 0, json.dumps({"signatures": sigs}), "")
        if prog == "dmsetup" and argv[1] == "table":
            table = self.host.tables.get(argv[2])
            if table is None:
                return Result(argv, 1, "", f"Device {argv[2]} does not exist.")
            return Result(argv, 0, table + "\n", "")
        if prog == "dmsetup" and argv[1] == "status":
            status = self.host.statuses.get(argv[2])
            return Result(argv, 0 if status else 1, status or "", "" if status else "gone")
        if prog == "cache_metadata_size":
            return Result(argv, 0, "8192 sectors\n", "")
        raise AssertionError(f"the fake host has no answer for {argv}")

    def run(self, argv, *, check=True, input=None, timeout=None):
        argv = [str(a) for a in argv]
        if argv[0] == "dmsetup" and argv[1] == "status":
            return self.query(argv)
        return super().run(argv, check=check, input=input, timeout=timeout)


class FakeHost:
    def __init__(self, root: Path):
        self.root = root
        self.sys = root / "sys" / "class" / "block"
        self.dev = root / "dev"
        self.by_id = self.dev / "disk" / "by-id"
        self.udev = root / "run" / "udev" / "data"
        for d in (self.sys, self.by_id, self.udev):
            d.mkdir(parents=True, exist_ok=True)
        self.disks: dict[str, Disk] = {}
        self.tables: dict[str, str] = {}
        self.statuses: dict[str, str] = {}
        self.runner = FakeRunner(self)
        self._minor = 0

    def disk(self, name: str, serial: str | None, mib: int, **sig) -> Disk:
        """A whole disk `name` (vda...) with `serial` (its by-id link virtio-SERIAL)."""
        d = self.sys / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "size").write_text(f"{mib * 2048}\n")
        self._minor += 16
        (d / "dev").write_text(f"254:{self._minor}\n")
        if serial:
            (d / "serial").write_text(serial + "\n")
            link = self.by_id / f"virtio-{serial}"
            link.symlink_to(f"../../{name}")
        (self.dev / name).touch()
        disk = Disk(serial, mib, {k.upper(): v for k, v in sig.items()})
        self.disks[name] = disk
        return disk

    def unplug(self, name: str) -> None:
        import shutil

        shutil.rmtree(self.sys / name)
        for link in self.by_id.iterdir():
            if os.path.basename(os.readlink(link)) == name:
                link.unlink()
        self.disks.pop(name)


def install(monkeypatch, tmp_path: Path) -> FakeHost:
    """Point every host read of planning at a fresh fake host under tmp_path."""
    from hotcache.provision.backends import bcache_sysfs as sb
    from hotcache.provision.block import blockdev, identity, kernel
    from hotcache.provision.engine import apply

    host = FakeHost(tmp_path / "host")
    for attr, value in (("sys_block", host.sys), ("by_id", host.by_id),
                        ("udev_data", host.udev), ("dev", host.dev)):
        monkeypatch.setattr(identity.HOST, attr, value)
    monkeypatch.setattr(blockdev, "SYS_BLOCK", host.sys)
    monkeypatch.setattr(blockdev, "root_devices", lambda *a, **k: set())
    monkeypatch.setattr(blockdev, "mount_at", lambda mp: None)
    monkeypatch.setattr(blockdev, "mounts", lambda: [])
    monkeypatch.setattr(blockdev, "loop_for_file", lambda image: None)
    monkeypatch.setattr(blockdev, "mountpoints_of", lambda node: [])
    monkeypatch.setattr(blockdev, "devnum", lambda node: "254:0")
    monkeypatch.setattr(blockdev.probe, "readable", lambda node: True)
    monkeypatch.setattr(apply, "require", lambda program: program)
    monkeypatch.setattr(kernel, "kernel_has", lambda feature: True)
    (tmp_path / "host" / "sys" / "fs" / "bcache").mkdir(parents=True)
    monkeypatch.setattr(sb, "SYS_FS", tmp_path / "host" / "sys" / "fs" / "bcache")
    monkeypatch.setattr(sb, "SYS_BLOCK", host.sys)
    monkeypatch.setattr(sb, "BY_UUID", tmp_path / "host" / "dev" / "bcache" / "by-uuid")
    monkeypatch.setenv("HOTCACHE_UNIT_DIR", str(tmp_path / "units"))
    return host

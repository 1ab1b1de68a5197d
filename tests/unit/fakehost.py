"""A fake host for planning tests: a `Host` (provision/block/host.py) whose root is a
folder holding a fake sysfs, /dev (by-id links, bcache by-uuid links), /proc and /etc,
and whose runner answers the read-only probe commands (blkid, wipefs, dmsetup, lvs, pvs,
cache_metadata_size) from tables. The real planning code runs against it unchanged, so a
plan can be computed for a named host state (blank disks, built and loaded, built but not
loaded after a reboot, half built) and its exact argv asserted. Nothing here runs a
program.

It fails closed like the real probes: a command it has no answer for raises
AssertionError; it is never read as "nothing there".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hotcache.provision.block.host import Host
from hotcache.provision.engine.apply import Env
from hotcache.provision.system.runner import Result, Runner


@dataclass
class Disk:
    serial: str | None
    mib: int
    sig: dict = field(default_factory=dict)        # blkid TYPE/UUID
    inner: dict = field(default_factory=dict)      # bytes in -> blkid TYPE/UUID there
    partn: int | None = None


class FakeRunner(Runner):
    """Records every run(); answers the read-only probes from the fake host."""

    def __init__(self, host: "FakeHost"):
        super().__init__(dry_run=True)
        self.host = host
        self.failing: set[str] = set()      # programs whose probes fail

    def query(self, argv, *, check=True):
        argv = [str(a) for a in argv]
        prog, h = argv[0], self.host
        if prog in self.failing:
            return Result(argv, 1, "", f"{prog}: simulated failure")
        if prog == "blkid":
            disk = h.disks.get(h.kname(argv[-1]))
            if disk is None:
                return Result(argv, 2, "", "")
            sig = disk.inner.get(int(argv[argv.index("--offset") + 1]), {}) \
                if "--offset" in argv else disk.sig
            out = "".join(f"{k}={v}\n" for k, v in sig.items())
            return Result(argv, 0, f"DEVNAME={argv[-1]}\n{out}" if out else "", "")
        if prog == "wipefs":
            disk = h.disks[h.kname(argv[-1])]
            sigs = [{"type": disk.sig["TYPE"], "offset": "0x0"}] if disk.sig.get("TYPE") else []
            return Result(argv, 0, json.dumps({"signatures": sigs}), "")
        if argv[:2] == ["dmsetup", "version"]:
            return Result(argv, 0, "Library version:   1.02.185\nDriver version:    4.47.0\n", "")
        if argv[:2] == ["dmsetup", "table"]:
            # by name, or by device number (`-j MAJOR -m MINOR`, keyed "MAJOR:MINOR")
            key = f"{argv[3]}:{argv[5]}" if argv[2] == "-j" else argv[2]
            table = h.tables.get(key)
            if table is None:
                return Result(argv, 1, "", f"Device {key} does not exist.")
            return Result(argv, 0, table + "\n", "")
        if argv[:2] == ["dmsetup", "status"]:
            # by name, or by device number (`-j MAJOR -m MINOR`, keyed "MAJOR:MINOR")
            key = f"{argv[3]}:{argv[5]}" if argv[2] == "-j" else argv[2]
            status = h.statuses.get(key)
            return Result(argv, 0 if status else 1, status or "", "" if status else "gone")
        if prog == "cache_metadata_size":
            return Result(argv, 0, "8192 sectors\n", "")
        if prog in ("lvs", "pvs", "vgs"):
            return h.lvm_report(argv)
        raise AssertionError(f"the fake host has no answer for {argv}")

    def run(self, argv, *, check=True, input=None, timeout=None):
        argv = [str(a) for a in argv]
        if argv[:2] == ["dmsetup", "status"]:
            return self.query(argv)
        return super().run(argv, check=check, input=input, timeout=timeout)


MOUNTINFO = "1 0 0:20 / / rw,relatime - tmpfs rootfs rw\n"   # a diskless root


class FakeHost(Host):
    def __init__(self, root: Path):
        super().__init__(FakeRunner(self), root)
        for d in ("sys/class/block", "sys/fs/bcache", "dev/disk/by-id", "dev/mapper",
                  "dev/bcache/by-uuid", "proc/self", "etc"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "proc/self/mountinfo").write_text(MOUNTINFO)
        (root / "dev/mapper/control").touch()
        self.disks: dict[str, Disk] = {}
        self.tables: dict[str, str] = {}
        self.statuses: dict[str, str] = {}
        self.lvs: dict[str, dict] = {}      # "vg/lv" -> lvs row
        self.pvs: dict[str, str] = {}       # node -> vg
        self.pv_uuids: dict[str, str] = {}  # node -> PV UUID (pvs -o pv_uuid)
        self.vgs: dict[str, dict] = {}      # vg -> vgs row
        self.missing: set[str] = set()      # programs not installed
        self.udev: dict[str, dict] = {}     # kernel name -> udev's properties
        self._minor = 0

    def which(self, program: str) -> str | None:
        return None if program in self.missing else f"/usr/sbin/{program}"

    def udev_properties(self, name: str) -> dict[str, str]:
        return dict(self.udev.get(name, {}))

    def env(self, tmp_path: Path) -> Env:
        return Env(self.runner, tmp_path / "mappings.yaml", tmp_path / "fstab", host=self)

    def disk(self, name: str, serial: str | None, mib: int, **sig) -> Disk:
        """A whole disk `name` (vda...) with `serial` (its by-id link virtio-SERIAL)."""
        d = self.path(f"/sys/class/block/{name}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "size").write_text(f"{mib * 2048}\n")
        self._minor += 16
        (d / "dev").write_text(f"254:{self._minor}\n")
        if serial:
            (d / "serial").write_text(serial + "\n")
            self.path(f"/dev/disk/by-id/virtio-{serial}").symlink_to(f"../../{name}")
        self.path(f"/dev/{name}").touch()
        disk = Disk(serial, mib, {k.upper(): v for k, v in sig.items()})
        self.disks[name] = disk
        return disk

    def unplug(self, name: str) -> None:
        import shutil

        shutil.rmtree(self.path(f"/sys/class/block/{name}"))
        for link in self.path("/dev/disk/by-id").iterdir():
            if os.path.basename(os.readlink(link)) == name:
                link.unlink()
        self.disks.pop(name)

    def fs(self, name: str, type: str, uuid: str) -> None:
        """What blkid and wipefs show on device `name` from now on."""
        self.disks[name].sig = {"TYPE": type, "UUID": uuid}

    def mount(self, node: str, mountpoint: str, *options: str) -> None:
        """`node` mounted (XFS) at `mountpoint`, as /proc/self/mountinfo shows it."""
        n = len(self.mounts()) + 1
        opts = ",".join(["rw", *options])
        with open(self.path("/proc/self/mountinfo"), "a") as f:
            f.write(f"{n} 1 {self.devnum(node)} / {mountpoint} {opts} - xfs {node} rw\n")

    def sysfs_file(self, path: str, value: str) -> None:
        """Write a sysfs attribute (or any file) of the fake host."""
        p = self.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value + "\n")

    def link(self, path: str, target: str) -> None:
        """A symlink of the fake host, `target` a host path (/sys/fs/bcache/<set>)."""
        p = self.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(os.path.relpath(self.path(target), p.parent))

    def lvm_report(self, argv: list[str]) -> Result:
        """lvs/pvs --reportformat json for one target (lvm2 exits 5 'not found' when it
        does not exist); a --select the fake host does not know is no answer."""
        what = argv[0]
        if "--select" in argv:
            raise AssertionError(f"the fake host has no answer for {argv}")
        target = argv[-1]
        if what == "lvs" and target in self.lvs:
            rows = [self.lvs[target]]
        elif what == "vgs" and target in self.vgs:
            rows = [self.vgs[target]]
        elif what == "pvs" and target in self.pvs:
            rows = [{"pv_name": target, "vg_name": self.pvs[target],
                     **({"pv_uuid": self.pv_uuids[target]} if target in self.pv_uuids else {})}]
        else:
            return Result(argv, 5, "", {
                "lvs": f"  Failed to find logical volume \"{target}\"\n",
                "vgs": f"  Volume group \"{target}\" not found\n"}.get(
                    what, f"  Failed to find physical volume \"{target}\".\n"))
        return Result(argv, 0, json.dumps({"report": [{what[:-1]: rows}]}), "")


def install(monkeypatch, tmp_path: Path) -> FakeHost:
    """A fresh fake host under tmp_path; boot units go to tmp_path/units."""
    monkeypatch.setenv("HOTCACHE_UNIT_DIR", str(tmp_path / "units"))
    return FakeHost(tmp_path / "host")

"""The host as planning sees it: the one object through which every read of the machine
goes (sysfs, /dev and its udev links, mountinfo, files under /etc, the programs
installed, the kernel's features, and the read-only probe commands: blkid, wipefs,
dmsetup, lvs, ...).

A real host is `Host(runner)`. Tests build a Host whose `root` is a folder holding a fake
sysfs/dev/proc tree and whose runner answers the probe commands
(tests/unit/fakehost.py): the same planning code then runs against it, so every backend
can be planned without a kernel. Paths given to and returned by a Host are the host's
own absolute paths (/dev/vdb, /sys/class/block/vdb); `path()` maps one to the file to
open.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast
from pathlib import Path

from hotcache.provision.errors import MissingProgram
from hotcache.provision.system import mountinfo
from hotcache.provision.system.runner import PACKAGES, SEARCH_PATH, Result, Runner, which


# A path of the host (/dev/vdb, /sys/class/block/vdb), as a string or a path object.
HostPath: TypeAlias = "str | os.PathLike[str]"
T = TypeVar("T")


@dataclass
class Roots:
    """Where block/identity.py reads devices' identities (sysfs, udev's links)."""

    sys_block: Path = Path("/sys/class/block")
    by_id: Path = Path("/dev/disk/by-id")
    dev: Path = Path("/dev")


class Host:
    def __init__(self, runner: Runner | None = None, root: HostPath = "/"):
        self.runner = runner if runner is not None else Runner()
        self.root = Path(root)
        self._udev: Any = None  # pyudev's Context, made on first use
        self._held: dict[tuple[str, ...], Any] | None = None   # see holding_probes

    # --- answers held while planning ------------------------------------------------
    @contextmanager
    def holding_probes(self) -> Iterator[None]:
        """Within: a read-only probe asked again with the same arguments (blkid of one
        device, the kernel's device-mapper) gets the answer it got the first time
        instead of running again. Planning one cache reads each of its devices'
        signatures several times (the device, its owners, the guard of each step that
        writes it), and each read is a program run. A plan is made without changing
        anything; what runs after it (a step, and the guard that proves its device again
        right before the step) reads afresh, since leaving drops every held answer."""
        if self._held is not None:
            yield
            return
        self._held = {}
        try:
            yield
        finally:
            self._held = None

    def held(self, key: tuple[str, ...], read: Callable[[], T]) -> T:
        """`read()`, or within holding_probes the answer it gave for `key` (a probe
        that failed is not held: asked again, it runs again)."""
        if self._held is None:
            return read()
        if key not in self._held:
            self._held[key] = read()
        return cast(T, self._held[key])

    @property
    def real(self) -> bool:
        return self.root == Path("/")

    # --- files ----------------------------------------------------------------------
    def path(self, host_path: HostPath) -> Path:
        """The file to open for a path of the host (itself on a real host)."""
        p = os.fspath(host_path)
        return Path(p) if self.real else self.root / p.lstrip("/")

    def realpath(self, host_path: HostPath) -> str:
        """Resolve links (/dev/disk/by-id/..., /dev/mapper/...) to the host's path."""
        p = os.fspath(host_path)
        if self.real:
            return os.path.realpath(p)
        local = os.path.realpath(self.path(p))
        rel = os.path.relpath(local, os.path.realpath(self.root))
        return os.path.normpath(p) if rel.startswith("..") else "/" + rel.replace(os.sep, "/")

    def exists(self, host_path: HostPath) -> bool:
        return self.path(host_path).exists()

    def is_dir(self, host_path: HostPath) -> bool:
        return self.path(host_path).is_dir()

    def listdir(self, host_path: HostPath) -> list[str]:
        d = self.path(host_path)
        return sorted(os.listdir(d)) if d.is_dir() else []

    def read(self, host_path: HostPath) -> str | None:
        """A small text file (a sysfs attribute), stripped; None when it cannot be read."""
        try:
            return self.path(host_path).read_text().strip()
        except OSError:
            return None

    def write(self, host_path: HostPath, value: str) -> None:
        with open(self.path(host_path), "w") as f:
            f.write(value)

    @property
    def roots(self) -> Roots:
        """Where block/identity.py reads devices' identities on this host."""
        return Roots(self.path("/sys/class/block"), self.path("/dev/disk/by-id"),
                     self.path("/dev"))

    def udev_properties(self, name: str) -> dict[str, str]:
        """udev's properties of kernel block device `name` (what `udevadm info` prints
        as E: lines: ID_SERIAL, ID_WWN, ID_PART_ENTRY_UUID...), read through libudev
        (pyudev) rather than udev's private database files. Empty when udev does not
        know the device, and on a host under a folder, which has no udev."""
        if not self.real:
            return {}
        import pyudev   # start-up: every command builds a Host, few ask udev (pyudev loads libudev)

        if self._udev is None:
            self._udev = pyudev.Context()
        try:
            device = pyudev.Devices.from_name(self._udev, "block", name)
        except pyudev.DeviceNotFoundError:
            return {}
        return {key: device.properties[key] for key in device.properties}

    # --- block devices --------------------------------------------------------------
    def kname(self, node: str) -> str:
        return os.path.basename(self.realpath(node))

    def sysfs(self, node: str) -> str:
        """/sys/class/block/<kernel name> of a device node."""
        return f"/sys/class/block/{self.kname(node)}"

    def devnum(self, node: str) -> str:
        """major:minor of a device node, as sysfs tells (what mountinfo compares with)."""
        num = self.read(f"{self.sysfs(node)}/dev")
        if num is None:
            st = os.stat(self.path(node))
            return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        return num

    def mounts(self) -> list[mountinfo.Mount]:
        """The kernel's mount table (/proc/self/mountinfo)."""
        return mountinfo.read(str(self.path(mountinfo.PATH)))

    # --- programs, probe commands, the kernel -----------------------------------------
    def which(self, program: str) -> str | None:
        if self.real:
            return which(program)
        for d in SEARCH_PATH.split(":"):
            if os.access(self.path(f"{d}/{program}"), os.X_OK):
                return f"{d}/{program}"
        return None

    def require(self, program: str) -> str:
        found = self.which(program)
        if found is None:
            raise MissingProgram(program, PACKAGES.get(program))
        return found

    def query(self, argv: list[str], *, check: bool = False) -> Result:
        """A read-only command; it runs even in dry-run mode (plans look at the host)."""
        return self.runner.query(argv, check=check)

    def kernel_has(self, feature: str) -> bool:
        """Whether the running kernel offers `feature` (a backend's kernel_feature):
        built in or its module loaded."""
        if feature == "bcache":
            return self.is_dir("/sys/fs/bcache")
        if feature == "device-mapper":
            if not self.exists("/dev/mapper/control") or self.which("dmsetup") is None:
                return False
            return self.held(("dmsetup", "version"),
                             lambda: self.query(["dmsetup", "version"]).returncode == 0)
        return False

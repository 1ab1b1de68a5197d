"""The one way hotcache runs an external program.

argv lists only (never a shell string), output captured, a typed error that carries the
command and its stderr, and a dry-run mode that records the argv instead of running it.
Backends never call subprocess: they build steps, and steps run through a Runner.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

from hotcache.provision.errors import CommandFailed, MissingProgram

# Which Debian package provides each program we call, so a missing one can be named.
PACKAGES = {
    "mkfs.xfs": "xfsprogs",
    "xfs_admin": "xfsprogs",
    "xfs_info": "xfsprogs",
    "losetup": "mount",
    "mount": "mount",
    "umount": "mount",
    "findmnt": "util-linux",
    "wipefs": "util-linux",
    "blkid": "util-linux",
    "lsblk": "util-linux",
    "blockdev": "util-linux",
    "truncate": "coreutils",
    "sync": "coreutils",
    "udevadm": "udev",
    "make-bcache": "bcache-tools",
    "bcache-super-show": "bcache-tools",
    "dmsetup": "dmsetup",
    "cache_metadata_size": "thin-provisioning-tools",
    "cache_check": "thin-provisioning-tools",
    "pvcreate": "lvm2",
    "vgcreate": "lvm2",
    "lvcreate": "lvm2",
    "lvconvert": "lvm2",
    "lvchange": "lvm2",
    "lvremove": "lvm2",
    "vgremove": "lvm2",
    "pvremove": "lvm2",
    "lvs": "lvm2",
    "vgs": "lvm2",
    "pvs": "lvm2",
    "systemctl": "systemd",
    "modprobe": "kmod",
    "fuser": "psmisc",
}

SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def which(program: str) -> str | None:
    """Find a program in the system folders first, then on PATH: root runs `wipefs` and
    `mkfs` from /usr/sbin even under `sudo -E` with a user's ~/bin first on PATH."""
    path = os.environ.get("PATH", "")
    return shutil.which(program, path=f"{SEARCH_PATH}:{path}" if path else SEARCH_PATH)


def require(program: str) -> str:
    found = which(program)
    if found is None:
        raise MissingProgram(program, PACKAGES.get(program))
    return found


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Runner:
    """Runs argv lists. With dry_run=True it records them in `recorded` and returns empty
    successful results, so a whole apply can be shown without touching the host."""

    dry_run: bool = False
    recorded: list[list[str]] = field(default_factory=list)
    timeout: float = 600.0

    def run(self, argv: list[str], *, check: bool = True, input: str | None = None,
            timeout: float | None = None) -> Result:
        argv = [str(a) for a in argv]
        if self.dry_run:
            self.recorded.append(argv)
            return Result(argv, 0, "", "")
        exe = require(argv[0])
        try:
            proc = subprocess.run(
                [exe, *argv[1:]], input=input, capture_output=True, text=True,
                timeout=timeout or self.timeout, check=False,
                env={**os.environ, "LC_ALL": "C"},
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(argv, -1, f"timed out after {exc.timeout:.0f}s") from exc
        result = Result(argv, proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise CommandFailed(argv, proc.returncode, proc.stderr or proc.stdout)
        return result

    def query(self, argv: list[str], *, check: bool = True) -> Result:
        """Run a read-only command even in dry-run mode: plans need to look at the host."""
        if self.dry_run:
            return Runner(dry_run=False, timeout=self.timeout).run(argv, check=check)
        return self.run(argv, check=check)

"""Promises of the docs checked on real loop devices and XFS: an external program's failure
(exit 4, its argv and stderr), a non-default device timeout in fstab, `restore`
re-attaching a loop device the kernel forgot, and data_root() detecting its device as
an unprivileged user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hotcache.provision import mapping
from tests.helpers import cleanup, hotcache, hotcache_json, loop_spec, loops_under

pytestmark = pytest.mark.root


def test_a_failing_program_exits_4_with_its_argv_and_stderr(sandbox):
    """mount refuses an option the kernel does not know: the real mount(8) fails."""
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox, options="[hotcache_no_such_option]"))
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == 4, proc.stderr
    assert "mount -t xfs" in proc.stderr and "hotcache_no_such_option" in proc.stderr
    real = subprocess.run(["mount", "-t", "xfs", "-o", "hotcache_no_such_option",
                           loops_under(sandbox)[0], str(sandbox / "mnt" / "hot")],
                          capture_output=True, text=True)
    assert real.returncode != 0 and real.stderr.strip().splitlines()[-1] in proc.stderr
    rc, doc = hotcache_json("apply", spec, "--yes")
    assert rc == 4 and doc["argv"][:2] == ["mount", "-t"] and doc["stderr"], doc


def test_a_non_default_device_timeout_reaches_fstab(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox, device_timeout=90))
    hotcache("apply", spec, "--yes", check=True)
    lines = [l for l in Path(os.environ["HOTCACHE_FSTAB"]).read_text().splitlines()
             if l.startswith("UUID=")]
    assert len(lines) == 1
    options = lines[0].split()[3].split(",")
    assert "x-systemd.device-timeout=90s" in options and "nofail" in options
    assert not any(o == "x-systemd.device-timeout=30s" for o in options)


def test_restore_reattaches_the_loop_device_and_mounts(sandbox):
    """After a boot the kernel has forgotten the loop device: restore finds the image
    again by its backing file, attaches it and mounts the same filesystem."""
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    mp = sandbox / "mnt" / "hot"
    (mp / "kept").write_bytes(b"survives the reboot")
    uuid = mapping.load(Path(os.environ["HOTCACHE_STATE"]))["caches"]["hot"].filesystem.uuid
    cleanup(sandbox)                      # "reboot": unmounted, loop device detached
    assert loops_under(sandbox) == []
    rc, doc = hotcache_json("status")
    assert rc == 5
    rc, doc = hotcache_json("restore", "--yes")
    assert rc == 0 and doc["changed"] is True, doc
    (loop,) = loops_under(sandbox)
    blkid = subprocess.run(["blkid", "-o", "value", "-s", "UUID", loop], capture_output=True,
                           text=True).stdout.strip()
    assert blkid == uuid and (mp / "kept").read_bytes() == b"survives the reboot"
    rc, doc = hotcache_json("status")
    assert rc == 0 and doc["ok"], doc
    rc, doc = hotcache_json("restore", "--yes")
    assert rc == 0 and doc["changed"] is False


@pytest.fixture
def open_sandbox(monkeypatch):
    """Like `sandbox`, but in a folder every user may enter (pytest's tmp folders are
    root's alone), so an unprivileged process can reach the mount."""
    root = Path(tempfile.mkdtemp(prefix="hotcache-open-", dir="/tmp"))
    root.chmod(0o755)
    monkeypatch.setenv("HOTCACHE_STATE", str(root / "state" / "mappings.yaml"))
    monkeypatch.setenv("HOTCACHE_FSTAB", str(root / "fstab"))
    (root / "mnt").mkdir()
    yield root
    cleanup(root)
    shutil.rmtree(root, ignore_errors=True)


def as_nobody(fn) -> dict:
    """Run fn() in a child process that dropped to uid/gid 65534; return what it returned."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = {"ok": fn(), "euid": os.geteuid()}
        except BaseException as exc:       # reported to the parent, which fails the test
            out = {"error": repr(exc)}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_data_root_detects_the_device_unprivileged(open_sandbox, monkeypatch):
    """CI runs as root, so the adapters' device detection is run as `nobody` here: it must
    find the XFS filesystem, the loop device and the verified hot copy from mountinfo,
    sysfs and the copy's metadata, without root."""
    spec = open_sandbox / "spec.yaml"
    spec.write_text(loop_spec(open_sandbox, mode="'0755'"))
    hotcache("apply", spec, "--yes", check=True)
    src = open_sandbox / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(b"x" * 5000)
    dest = open_sandbox / "mnt" / "hot" / "ds"
    hotcache("copy", src, dest, "--name", "ds", "--version", "7", "--verify", check=True)
    (loop,) = loops_under(open_sandbox)
    monkeypatch.setenv("DATA_ROOT", str(dest))

    def detect():
        from hotcache.adapters import data_root

        root = data_root()
        return {"fstype": root.backing.fstype, "device": root.backing.device,
                "hot": root.copy.is_hot, "version": root.copy.version}

    got = as_nobody(detect)
    assert got.get("euid") == 65534, got
    assert got["ok"] == {"fstype": "xfs", "device": os.path.basename(loop), "hot": True,
                         "version": "7"}, got

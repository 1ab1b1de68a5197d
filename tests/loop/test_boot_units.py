"""The units that run `hotcache` as root at every boot run only a hotcache that root alone
can change: a venv a user can write to is refused (by `metrics-timer` through the real
CLI, and by the restore unit that apply writes), and arguments are quoted by systemd's
rules. Root: the venv belongs to a user made for the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hotcache.provision.engine import bootunit
from hotcache.provision.errors import RefusedError, UsageError
from hotcache.provision.system import units

pytestmark = pytest.mark.root


def user_venv(root: Path, user) -> Path:
    """A venv the user owns, using this project's packages: its python, pyvenv.cfg and
    site-packages (a link to ours), and a `hotcache` script as pip writes it."""
    venv = root / "uvenv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv / "pyvenv.cfg")
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    site = venv / Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)
    site.parent.mkdir(parents=True)
    site.symlink_to(sysconfig.get_paths()["purelib"])
    script = venv / "bin" / "hotcache"
    script.write_text(f"#!{venv}/bin/python\nfrom hotcache.provision.cli import main\nmain()\n")
    script.chmod(0o755)
    for p in [root, *root.rglob("*")]:
        os.lchown(p, user.pw_uid, user.pw_gid)
    os.chmod(root, 0o755)
    return venv


def test_metrics_timer_refuses_a_user_writable_venv(tmp_path, user):
    venv = user_venv(tmp_path / "home", user)
    unit_dir = tmp_path / "units"
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "hotcache.provision",
                           "metrics-timer", "--unit-dir", str(unit_dir),
                           "--textfile", str(tmp_path / "m.prom")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == RefusedError.exit_code, proc.stdout + proc.stderr
    assert f"owned by {user.pw_name}" in proc.stderr and "/opt/hotcache" in proc.stderr
    assert not unit_dir.exists() or not any(unit_dir.iterdir())


def test_restore_unit_refuses_a_user_writable_venv_and_takes_a_root_one(tmp_path, user):
    venv = user_venv(tmp_path / "home", user)
    code = Path(bootunit.__file__).parents[1]
    with pytest.raises(RefusedError, match=f"owned by {user.pw_name}"):
        units.trusted_program(venv / "bin" / "hotcache", code)
    # the same venv given to root, but its folder left group-writable: still refused
    for p in [tmp_path / "home", *(tmp_path / "home").rglob("*")]:
        os.lchown(p, 0, 0)
    os.chmod(venv / "bin", 0o775)
    with pytest.raises(RefusedError, match="writable by group"):
        units.trusted_program(venv / "bin" / "hotcache", code)
    os.chmod(venv / "bin", 0o755)
    assert units.trusted_program(venv / "bin" / "hotcache", code) == str(venv / "bin/hotcache")


def test_unit_arguments_are_quoted_by_systemds_rules(tmp_path):
    text = bootunit.unit_text("c1", "/mnt/hot", Path("/etc/my state/m.yaml"),
                             Path("/etc/50%$HOME/fstab"))
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert line.endswith(' restore c1 --yes --state "/etc/my state/m.yaml" '
                         '--fstab "/etc/50%%$$HOME/fstab"')
    assert units.quote('a"b\\c') == '"a\\"b\\\\c"'
    with pytest.raises(UsageError):
        bootunit.unit_text("c1", "/mnt/hot", Path("/etc/evil\nExecStartPost=/bin/sh"),
                          Path("/etc/fstab"))


def test_restore_unit_passes_systemd_analyze_verify(tmp_path):
    """systemd itself reads the unit apply writes (device units escaped as systemd names
    them, ExecStart quoted), and finds nothing wrong; a unit with a mangled dependency
    fails the same check, so the check can fail."""
    program = units.trusted_program(Path(sys.executable).parent / "hotcache",
                                    Path(bootunit.__file__).parents[1])
    text = bootunit.unit_text("c1", "/mnt/hot data", Path("/etc/hotcache/mappings.yaml"),
                              Path("/etc/fstab"), program,
                              devices=["/dev/disk/by-id/virtio-hdd-part1",
                                       "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"])
    assert "Wants=dev-disk-by\\x2did-virtio\\x2dhdd\\x2dpart1.device " in text

    def verify(body: str) -> subprocess.CompletedProcess:
        unit = tmp_path / bootunit.unit_name("c1")
        unit.write_text(body)
        return subprocess.run(["systemd-analyze", "verify", str(unit)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    ok = verify(text)
    assert ok.returncode == 0 and not ok.stderr.strip(), ok.stderr
    bad = verify(text.replace("Wants=dev-disk", "Wants=dev disk/by-id"))
    assert "Failed to add dependency" in bad.stderr, bad.stderr

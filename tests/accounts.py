"""Ordinary accounts for the root tiers: hotcache installed as the docs say (a root-owned
venv under /opt, on /usr/bin/python3, which every account can execute, with a plain
`pip install` of the wheel), an account made for the test, and a way to run a command as
it with a clean environment. The venv is made once per session; the loop and Slurm
tiers share it."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import cleanup

SYSTEM_PYTHON = "/usr/bin/python3"
PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="session")
def opt_venv(tmp_path_factory) -> Path:
    """/opt/hotcache-test-<pid>: root-owned, mode 0755, hotcache's wheel installed with
    pip into a venv made by the system Python (the venvs here are built on a Python in
    root's home folder, which other accounts cannot execute). Returns its bin folder."""
    from tests.loop.test_wheel import build_wheel

    wheel = build_wheel(tmp_path_factory.mktemp("wheel-for-accounts"))
    venv = Path(f"/opt/hotcache-test-{os.getpid()}")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", venv], check=True, timeout=300)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", wheel], check=True, timeout=900)
    os.chmod(venv, 0o755)
    try:
        yield venv / "bin"
    finally:
        shutil.rmtree(venv, ignore_errors=True)


@pytest.fixture
def account():
    """An ordinary login account made for the test (removed afterwards)."""
    name = f"hcjob{os.getpid() % 100000}"
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["useradd", "-M", "-s", "/bin/bash", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def run_as(user, argv: list, env: dict | None = None, cwd: Path | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """`argv` as `user`, with only PATH, HOME and `env` in its environment."""
    clean = {"PATH": PATH, "HOME": "/", "LANG": "C.UTF-8", **(env or {})}
    cmd = ["runuser", "-u", user.pw_name, "--", "env", "-i",
           *(f"{k}={v}" for k, v in clean.items()), *map(str, argv)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)


@pytest.fixture
def open_sandbox(monkeypatch):
    """The loop tier's sandbox in a folder every account can reach (pytest's own temporary
    folders are root's, mode 0700): images, mountpoints, the mapping and fstab."""
    root = Path(tempfile.mkdtemp(prefix="hotcache-accounts-", dir="/tmp"))
    os.chmod(root, 0o755)
    monkeypatch.setenv("HOTCACHE_STATE", str(root / "state" / "mappings.yaml"))
    monkeypatch.setenv("HOTCACHE_FSTAB", str(root / "fstab"))
    (root / "mnt").mkdir()
    try:
        yield root
    finally:
        cleanup(root)
        shutil.rmtree(root, ignore_errors=True)

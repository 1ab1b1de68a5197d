from __future__ import annotations

import os
import pwd
import subprocess

import pytest

from tests.accounts import account, open_sandbox, opt_venv  # noqa: F401  (fixtures of both root tiers)
from tests.helpers import cleanup


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A folder for images and mountpoints, with the mapping and fstab redirected into
    it; whatever the test mounted or attached there is released afterwards."""
    monkeypatch.setenv("HOTCACHE_STATE", str(tmp_path / "state" / "mappings.yaml"))
    monkeypatch.setenv("HOTCACHE_FSTAB", str(tmp_path / "fstab"))
    (tmp_path / "mnt").mkdir()
    yield tmp_path
    cleanup(tmp_path)


@pytest.fixture
def user():
    """An unprivileged user made for the test (removed afterwards)."""
    name = f"hcuser{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)

from __future__ import annotations

import pytest

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

"""The boot-time restore unit and lvm argv (no kernel needed)."""

from __future__ import annotations

from hotcache.provision.engine import bootunit


def test_mount_unit_names_match_systemd_escape():
    assert bootunit.mount_unit("/mnt/hot") == "mnt-hot.mount"
    assert bootunit.mount_unit("/mnt/hot-data/x y/") == "mnt-hot\\x2ddata-x\\x20y.mount"


def test_unit_runs_restore_before_the_mount(tmp_path):
    text = bootunit.unit_text("c1", "/mnt/hot", tmp_path / "m.yaml", tmp_path / "fstab")
    assert "Before=mnt-hot.mount local-fs.target" in text
    assert f"restore c1 --yes --state {tmp_path}/m.yaml --fstab {tmp_path}/fstab" in text
    assert "DefaultDependencies=no" in text and "WantedBy=local-fs.target" in text


def test_unit_dir_is_redirectable(monkeypatch, tmp_path):
    monkeypatch.setenv("HOTCACHE_UNIT_DIR", str(tmp_path))
    assert bootunit.unit_dir() == tmp_path
    monkeypatch.delenv("HOTCACHE_UNIT_DIR")
    assert str(bootunit.unit_dir()) == "/etc/systemd/system"

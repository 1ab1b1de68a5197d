"""The boot-time restore unit and lvm argv (no kernel needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hotcache.provision.engine import bootunit

# Paths whose unit names exercise every escaping rule: dashes, spaces, colons and dots
# (kept), a leading dot, bytes outside ASCII, a trailing slash, the root.
PATHS = ["/dev/disk/by-id/virtio-ssd", "/dev/disk/by-id/ata-Foo_Bar-1.0:x", "/dev/vdb",
         "/dev/disk/by-path/pci-0000:00:05.0-scsi-0:0:0:0", "/dev/disk/by-id/wwn-0x5 \u00fc",
         "/dev/.hidden", "/.x", "/mnt/hot-data/x y/", "/", "//dev//vdb/"]


def test_mount_unit_names_match_systemd_escape():
    assert bootunit.mount_unit("/mnt/hot") == "mnt-hot.mount"
    assert bootunit.mount_unit("/mnt/hot-data/x y/") == "mnt-hot\\x2ddata-x\\x20y.mount"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("suffix", ["device", "mount"])
def test_unit_names_are_what_systemd_escape_prints(path, suffix):
    want = subprocess.run(["systemd-escape", "--path", f"--suffix={suffix}", path],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert bootunit.path_unit(path, suffix) == want


def test_unit_waits_for_its_devices_not_for_udev_settle(tmp_path):
    devices = ["/dev/disk/by-id/virtio-hdd-part1", "/dev/disk/by-id/virtio-ssd"]
    text = bootunit.unit_text("c1", "/mnt/hot", tmp_path / "m.yaml", tmp_path / "fstab",
                              devices=devices)
    want = "dev-disk-by\\x2did-virtio\\x2dhdd\\x2dpart1.device dev-disk-by\\x2did-virtio\\x2dssd.device"
    assert f"Wants={want}\n" in text and f"After={want}\n" in text
    assert "udev-settle" not in text
    # systemd reads each name back to the device path the spec names
    for name, path in zip(want.split(), devices):
        back = subprocess.run(["systemd-escape", "--unescape", "--path",
                               name.removesuffix(".device")], capture_output=True, text=True)
        assert back.stdout.strip() == path, back.stderr


def test_unit_of_a_loop_image_cache_waits_for_no_device():
    from hotcache.provision.engine.spec import CacheSpec

    spec = CacheSpec.model_validate({
        "name": "c1", "backend": "dm-cache",
        "origin": "/dev/disk/by-id/virtio-hdd",
        "cache": {"loop": {"file": "/var/lib/hotcache/ssd.img", "size": "1G"}},
        "filesystem": {"mountpoint": "/mnt/hot"}})
    assert bootunit.device_paths(spec) == ["/dev/disk/by-id/virtio-hdd"]


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


GENERATOR = "/lib/systemd/system-generators/systemd-fstab-generator"


def generated_mount_unit(tmp_path, line: str, mountpoint: str) -> str:
    """What systemd itself makes of an fstab line at boot: its fstab generator, run on
    a file holding only that line."""
    (tmp_path / "fstab").write_text(line + "\n")
    out = tmp_path / "generated"
    out.mkdir()
    subprocess.run([GENERATOR, out, out, out], check=True, capture_output=True, text=True,
                   env={"SYSTEMD_FSTAB": str(tmp_path / "fstab"), "SYSTEMD_PROC_CMDLINE": "",
                        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    return (out / bootunit.mount_unit(mountpoint)).read_text()


@pytest.mark.parametrize("backend", ["bcache", "dm-cache", "lvmcache"])
def test_a_block_caches_mount_requires_its_restore_as_systemd_reads_fstab(tmp_path, backend):
    """A restore that fails, is masked or never runs stops the mount: the bare origin,
    which may show the cache's filesystem UUID with stale data, is never mounted in its
    place (Requires= fails the mount job; After= keeps it from starting first)."""
    from hotcache.provision.engine.apply import fstab_options
    from hotcache.provision.engine.spec import CacheSpec
    from hotcache.provision.system import fstab

    spec = CacheSpec.model_validate({
        "name": "c1", "backend": backend, "origin": "/dev/disk/by-id/virtio-hdd",
        "cache": "/dev/disk/by-id/virtio-ssd", "filesystem": {"mountpoint": "/mnt/hot"}})
    line = fstab.entry("11111111-1111-4111-8111-111111111111", "/mnt/hot", "xfs",
                       fstab_options(spec))
    unit = generated_mount_unit(tmp_path, line, "/mnt/hot")
    assert "\nRequires=hotcache-restore-c1.service\n" in unit
    assert "\nAfter=hotcache-restore-c1.service\n" in unit


def test_a_cache_without_restore_unit_requires_none(tmp_path):
    from hotcache.provision.engine.apply import fstab_options
    from hotcache.provision.engine.spec import CacheSpec
    from hotcache.provision.system import fstab

    spec = CacheSpec.model_validate({
        "name": "c1", "backend": "none", "origin": "/dev/disk/by-id/virtio-ssd",
        "filesystem": {"mountpoint": "/mnt/hot"}})
    line = fstab.entry("11111111-1111-4111-8111-111111111111", "/mnt/hot", "xfs",
                       fstab_options(spec))
    assert "Requires=" not in generated_mount_unit(tmp_path, line, "/mnt/hot")


def test_unit_requires_the_mounts_its_program_mapping_and_fstab_live_on(tmp_path):
    """With /opt or /var on a filesystem of its own, a restore started before it is
    mounted fails at every boot: the unit names the paths, systemd adds the mounts."""
    text = bootunit.unit_text("c1", "/mnt/hot", Path("/var/lib/hotcache/my state.yaml"),
                              Path("/etc/fstab"), "/opt/hotcache/venv/bin/hotcache")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("RequiresMountsFor=")]
    assert line == ('RequiresMountsFor=/opt/hotcache/venv/bin/hotcache '
                    '"/var/lib/hotcache/my state.yaml" /etc/fstab')
    # a path on the cache's own filesystem would wait for the mount the restore precedes
    text = bootunit.unit_text("c1", "/mnt/hot", Path("/mnt/hot/m.yaml"), Path("/etc/fstab"),
                              "/opt/hc/bin/hotcache")
    assert "RequiresMountsFor=/opt/hc/bin/hotcache /etc/fstab\n" in text

"""`hotcache doctor` on a real loop-backed cache: quiet on a healthy host, then finds
each planted problem with its fix, and is quiet again once the fixes are applied.

Planted, as they happen on real hosts: an fstab entry that lost `nofail` (hotcache's
own file and the boot fstab), a fast tier that filled up, a hot copy that failed
verification and one not verified for a month, and a bcache cache in the mapping whose
devices are gone and whose tunables nothing restores at boot (on a kernel without
bcache, as this host's).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.observe import doctor
from hotcache.provision.hotcopy import catalog
from hotcache.provision.hotcopy import format as hotcopy_format
from tests.helpers import entry_record

pytestmark = pytest.mark.root

HOTCACHE = str(Path(sys.executable).with_name("hotcache"))


class Host:
    def __init__(self, root: Path):
        self.root = root
        self.image = root / "ssd.img"
        self.mnt = root / "mnt"
        self.name = f"doc{os.getpid() % 100000}"
        self.env = {**os.environ, "HOTCACHE_STATE": str(root / "mappings.yaml"),
                    "HOTCACHE_FSTAB": str(root / "fstab"),
                    "HOTCACHE_SYSTEM_FSTAB": str(root / "system-fstab"),
                    "HOTCACHE_UNIT_DIR": str(root / "units")}
        self.spec = root / "spec.yaml"
        self.spec.write_text(yaml.safe_dump({"version": 1, "caches": [{
            "name": self.name, "backend": "none",
            "origin": {"loop": {"file": str(self.image), "size": "320M"}},
            "filesystem": {"mountpoint": str(self.mnt)}}]}))
        (root / "system-fstab").write_text("# <file system> <mount point> <type> <options>\n"
                                           "proc /proc proc defaults 0 0\n")

    def hotcache(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([HOTCACHE, *args], capture_output=True, text=True,
                              env=self.env, timeout=300)

    def doctor(self) -> tuple[int, dict]:
        proc = self.hotcache("doctor", "--json")
        return proc.returncode, json.loads(proc.stdout)

    def state(self) -> dict:
        return yaml.safe_load(Path(self.env["HOTCACHE_STATE"]).read_text())

    def save_state(self, data: dict) -> None:
        # Through mapping.save: a hand-written file lacks its `entries` count and would be
        # refused as cut short.
        mapping.save(Path(self.env["HOTCACHE_STATE"]), data)


def make_copy(dest: Path, name: str, verify_ok: bool, verified: dt.datetime) -> None:
    dest.mkdir(parents=True)
    (dest / "part-0.tar").write_bytes(os.urandom(4096))
    (dest / hotcopy_format.MANIFEST).write_text("0" * 64 + "  part-0.tar\n")
    (dest / hotcopy_format.METADATA).write_text(json.dumps({
        "format": hotcopy_format.FORMAT, "complete": True, "name": name, "version": "1",
        "files": 1, "bytes": 4096, "copied_at": verified.isoformat(),
        "verified_at": verified.isoformat(), "verify_ok": verify_ok}))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    h = Host(tmp_path_factory.mktemp("doctor"))
    proc = h.hotcache("apply", str(h.spec), "--yes", "--json")
    assert proc.returncode == 0, proc.stderr
    try:
        yield h
    finally:
        h.hotcache("teardown", h.name, "--yes", "--json")


def problems(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] == "problem"]


def test_healthy_host_has_no_problem(host):
    rc, doc = host.doctor()
    assert rc == 0 and doc["ok"] and problems(doc) == [], doc
    checks = {f["check"] for f in doc["findings"]}
    assert {"kernel", "programs", "nofail", "drift", "free-space"} <= checks


def test_planted_problems_are_found_with_their_fixes(host):
    now = dt.datetime.now(dt.timezone.utc)
    # 1. hotcache's own fstab entry lost nofail (someone "tidied" it).
    fstab = Path(host.env["HOTCACHE_FSTAB"])
    fstab.write_text(fstab.read_text().replace("nofail,", ""))
    # 2. the boot fstab mounts the same filesystem again, without nofail.
    system = Path(host.env["HOTCACHE_SYSTEM_FSTAB"])
    system.write_text(system.read_text() + f"LABEL=hot {host.mnt} xfs defaults 0 0\n")
    # 3. and 4. a hot copy that failed verification, one verified a month ago.
    make_copy(host.mnt / "imagenet", "imagenet", False, now)
    make_copy(host.mnt / "sets" / "coco", "coco", True, now - dt.timedelta(days=30))
    for dest in (host.mnt / "imagenet", host.mnt / "sets" / "coco"):   # as `hotcache copy` does
        catalog.record(dest, json.loads((dest / hotcopy_format.METADATA).read_text()),
                       Path(host.env["HOTCACHE_STATE"]), os.lstat(dest))
    # 5. the fast tier fills up (under 10 % free).
    st = os.statvfs(host.mnt)
    fill = st.f_bavail * st.f_frsize - st.f_blocks * st.f_frsize // 20
    subprocess.run(["fallocate", "-l", str(fill), str(host.mnt / "filler")], check=True)
    # 6. a bcache cache whose devices are gone and whose tunables nothing restores.
    data = host.state()
    data["caches"]["ghost"] = {
        "backend": "bcache", "state": "ready", "mode": "writethrough",
        "tunables": {"sequential_cutoff": 0},
        "devices": {"origin": {"node": "/dev/hotcache-test-no-such-hdd", "size": 2**30,
                               "path": "/dev/disk/by-id/hotcache-test-no-such-hdd"},
                    "cache": {"node": "/dev/loop-hotcache-test", "size": 2**30,
                              "loop_file": str(host.root / "no-such-ssd.img")}},
        "cached_device": "/dev/bcache/by-uuid/00000000-0000-0000-0000-000000000000",
        "filesystem": {"mountpoint": str(host.root / "ghost"), "uuid": "x"},
        "persist": {"fstab": None}, "hot_copies": {}, "spec": {"name": "ghost"}}
    host.save_state(data)
    try:
        rc, doc = host.doctor()
        metrics = host.hotcache("status", "--prometheus", str(host.root / "m.prom"))
        prom = (host.root / "m.prom").read_text()
    finally:
        data["caches"].pop("ghost")
        host.save_state(data)

    assert rc == 9 and not doc["ok"]
    found = problems(doc)
    for f in found:
        assert f["fix"], f  # every problem says how to fix it
    by_check: dict[str, list[dict]] = {}
    for f in found:
        by_check.setdefault(f["check"], []).append(f)

    nofail = {f["subject"].rsplit(":", 1)[0] for f in by_check["nofail"]}
    assert nofail == {str(fstab), str(system)}
    assert any("hotcache apply" in f["fix"] for f in by_check["nofail"])
    assert all("nofail" in f["fix"] for f in by_check["nofail"])

    (space,) = by_check["free-space"]
    assert space["subject"] == host.name and "hotcache copies" in space["fix"]

    (bad_copy,) = by_check["hot-copy"]
    assert bad_copy["subject"] == str(host.mnt / "imagenet")
    assert "hotcache verify" in bad_copy["fix"]
    (old,) = [f for f in doc["findings"] if f["severity"] == "warning"]
    assert old["subject"] == str(host.mnt / "sets" / "coco") and "verify" in old["fix"]

    (restore,) = by_check["boot-restore"]
    assert restore["subject"] == "ghost" and "sequential_cutoff=0" in restore["message"]

    drift = {f["message"] for f in by_check["drift"] if f["subject"] == "ghost"}
    assert any("cache device is missing" in m for m in drift)
    assert any("not mounted" in m for m in drift)
    assert all("hotcache" in f["fix"] for f in by_check["drift"])
    # Each problem carries its code (doctor's advice is keyed on it, not on the wording).
    assert {"NO_NOFAIL", "LOW_FREE_SPACE", "HOT_COPY_FAILED_VERIFICATION", "RESTORE_MISSING",
            "DEVICE_MISSING", "NOT_MOUNTED"} <= {f["code"] for f in found}
    assert old["code"] == "HOT_COPY_VERIFY_OLD" and bad_copy["code"] == "HOT_COPY_FAILED_VERIFICATION"

    kernel = by_check.get("kernel", [])
    if Path("/sys/fs/bcache").is_dir():
        assert kernel == []
    else:
        assert [f["subject"] for f in kernel] == ["bcache"]
        assert "modprobe bcache" in kernel[0]["fix"]
    assert len(by_check) >= 5

    # The same host as metrics: drift and the failed copy show, and promtool accepts it.
    assert metrics.returncode == 5
    assert 'hotcache_cache_up{cache="ghost"} 0.0' in prom
    assert f'hotcache_hot_copy_verify_ok{{cache="{host.name}",copy="imagenet"' in prom
    check = subprocess.run(["promtool", "check", "metrics"], input=prom, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    # Applying the fixes makes the problems go away.
    assert host.hotcache("apply", str(host.spec), "--yes", "--json").returncode == 0
    system.write_text("".join(l + "\n" for l in system.read_text().splitlines()
                              if str(host.mnt) not in l))
    (host.mnt / "filler").unlink()
    subprocess.run(["rm", "-r", "--", str(host.mnt / "imagenet")], check=True)
    data = host.state()         # and its record, or doctor reports a recorded copy missing
    data["caches"][host.name]["hot_copies"].pop(str(host.mnt / "imagenet"))
    host.save_state(data)
    rc, doc = host.doctor()
    assert rc == 0 and problems(doc) == [], problems(doc)
    assert [f["check"] for f in doc["findings"] if f["severity"] == "warning"] == ["hot-copy"]


def test_missing_program_is_a_problem_only_for_a_backend_in_use(host, monkeypatch):
    """Uninstalling xfsprogs on a shared host is not an option, so `which` is told that
    mkfs.xfs and make-bcache are gone; everything else is this host's real state."""
    real = doctor.which
    monkeypatch.setattr(doctor, "which",
                        lambda p: None if p in ("mkfs.xfs", "make-bcache") else real(p))
    opts = doctor.Options(Path(host.env["HOTCACHE_STATE"]), Path(host.env["HOTCACHE_FSTAB"]),
                          Path(host.env["HOTCACHE_SYSTEM_FSTAB"]),
                          Path(host.env["HOTCACHE_UNIT_DIR"]))
    found = [f for f in doctor.run(opts) if f.check == "programs"]
    (none,) = [f for f in found if f.subject == "none"]
    assert none.severity == "problem" and none.fix == "apt-get install xfsprogs"
    (bcache,) = [f for f in found if f.subject == "bcache"]
    assert bcache.severity == "ok" and "bcache-tools" in bcache.message  # not in use


def test_boot_restore_unit_must_be_installed_and_enabled(tmp_path):
    from hotcache.provision.engine.bootunit import unit_name

    caches = {"fast": entry_record("fast", backend="bcache", tunables={"sequential_cutoff": 0}),
              "plain": entry_record("plain", backend="bcache", tunables={}),  # cache_mode survives alone
              "raw": entry_record("raw", backend="dm-cache", tunables={})}
    units = tmp_path / "units"
    units.mkdir()

    def severities():
        return {f.subject: f.severity for f in doctor.check_boot_restore(caches, units)}

    assert severities() == {"fast": "problem", "raw": "problem"}
    unit = units / unit_name("fast")
    unit.write_text("[Service]\nExecStart=/opt/hotcache/venv/bin/hotcache restore fast --yes\n")
    (found,) = [f for f in doctor.check_boot_restore(caches, units) if f.subject == "fast"]
    assert found.severity == "problem" and "not enabled" in found.message
    assert found.fix.startswith(f"systemctl enable {unit.name}")
    (units / "local-fs.target.wants").mkdir()
    (units / "local-fs.target.wants" / unit.name).symlink_to(unit)
    assert severities() == {"fast": "ok", "raw": "problem"}  # fast's unit is not raw's
    (units / "restore-all.service").write_text("[Service]\nExecStart=/usr/bin/hotcache restore --yes\n")
    assert severities() == {"fast": "ok", "raw": "ok"}


def test_unreadable_mapping_is_a_problem_with_a_fix(tmp_path):
    bad = tmp_path / "mappings.yaml"
    bad.write_text("caches: [this is: not, a mapping\n")
    env = {**os.environ, "HOTCACHE_STATE": str(bad),
           "HOTCACHE_SYSTEM_FSTAB": str(tmp_path / "fstab"),
           "HOTCACHE_UNIT_DIR": str(tmp_path / "units")}
    proc = subprocess.run([HOTCACHE, "doctor"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 9
    assert f"mapping: mapping {bad} is not valid YAML" in proc.stdout
    assert "fix: restore it from a backup" in proc.stdout

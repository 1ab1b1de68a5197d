"""Backend none on real loop devices: the administrator's own steps, checked with the
host's own tools (findmnt, blkid, losetup)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from hotcache.provision import mapping
from hotcache.provision.engine import apply as engine
from hotcache.provision.system.fstab import fstab_path
from hotcache.provision.mapping import state_path
from hotcache.provision.system.runner import Runner
from hotcache.provision.engine.spec import parse_spec
from tests.helpers import hotcache, hotcache_json, loop_spec, loops_under, mounts_under

pytestmark = pytest.mark.root


def findmnt(mp) -> dict | None:
    proc = subprocess.run(["findmnt", "--json", "--mountpoint", str(mp)], capture_output=True,
                          text=True)
    return json.loads(proc.stdout)["filesystems"][0] if proc.returncode == 0 else None


def test_apply_status_reapply_teardown(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox, owner="nobody:nogroup", mode="'2775'",
                              options="[logbsize=256k]"))
    rc, doc = hotcache_json("apply", spec, "--yes")
    assert rc == 0 and doc["changed"] is True
    mp = sandbox / "mnt" / "hot"
    fs = findmnt(mp)
    assert fs["fstype"] == "xfs" and "noatime" in fs["options"].split(",")
    assert "logbsize=256k" in fs["options"]
    st = os.stat(mp)
    assert (st.st_uid, oct(st.st_mode & 0o7777)) == (65534, "0o2775")

    state = yaml.safe_load(Path(os.environ["HOTCACHE_STATE"]).read_text())
    entry = state["caches"]["hot"]
    assert entry["state"] == "ready" and entry["backend"] == "none"
    assert entry["devices"]["origin"]["loop_file"] == str(sandbox / "hot.img")
    blkid = subprocess.run(["blkid", "-o", "value", "-s", "UUID", fs["source"]],
                           capture_output=True, text=True).stdout.strip()
    assert entry["filesystem"]["uuid"] == blkid
    line = Path(os.environ["HOTCACHE_FSTAB"]).read_text()
    assert f"UUID={blkid} {mp} xfs noatime,nosuid,nodev,logbsize=256k,nofail,x-systemd.device-timeout=30s" in line

    rc, doc = hotcache_json("status")
    assert rc == 0 and doc["ok"] and doc["caches"][0]["noatime"]
    assert doc["caches"][0]["fs_uuid_matches"] and doc["caches"][0]["persistent"]

    rc, doc = hotcache_json("apply", spec, "--yes")
    assert rc == 0 and doc["changed"] is False and doc["unchanged"] == ["hot"]
    text = hotcache("apply", spec, "--yes").stdout
    assert "already as specified" in text and "no changes" in text

    (mp / "data.bin").write_bytes(b"x" * 4096)
    rc, doc = hotcache_json("teardown", "hot", "--yes")
    assert rc == 0
    assert mounts_under(sandbox) == [] and loops_under(sandbox) == []
    assert "hotcache:hot" not in Path(os.environ["HOTCACHE_FSTAB"]).read_text()
    assert mapping.load(Path(os.environ["HOTCACHE_STATE"]))["caches"] == {}
    assert (sandbox / "hot.img").exists(), "teardown keeps the image (the data)"


def test_reapply_after_teardown_mounts_the_kept_image_again(sandbox):
    """Teardown keeps the image and says so; it stays hotcache's, so the same spec
    applied again mounts the same filesystem with its data (no mkfs, no refusal)."""
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    mp = sandbox / "mnt" / "hot"
    (mp / "data.bin").write_bytes(b"kept" * 1024)
    down = hotcache("teardown", "hot", "--yes", check=True).stdout
    assert f"image {sandbox}/hot.img is kept with its filesystem and data" in down
    assert "--remove-images" in down
    kept = mapping.load(Path(os.environ["HOTCACHE_STATE"]))["kept_images"]
    assert kept[str(sandbox / "hot.img")]["cache"] == "hot"

    plan = hotcache("plan", spec, check=True).stdout
    assert "mkfs.xfs" not in plan and "wipefs" not in plan
    hotcache("apply", spec, "--yes", check=True)
    assert (mp / "data.bin").read_bytes() == b"kept" * 1024
    state = mapping.load(Path(os.environ["HOTCACHE_STATE"]))
    assert state["caches"]["hot"].state == "ready" and "kept_images" not in state


def test_a_kept_image_reformatted_by_someone_else_is_refused(sandbox):
    """The kept record names the filesystem hotcache made; another one on the same
    image (mkfs by hand after the teardown) is foreign again, and left untouched."""
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    hotcache("teardown", "hot", "--yes", check=True)
    img = sandbox / "hot.img"
    subprocess.run(["mkfs.xfs", "-q", "-f", img], check=True)
    before = hashlib.sha256(img.read_bytes()).hexdigest()
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == 3
    assert "carries signatures (xfs)" in proc.stderr and "wipe: true" in proc.stderr
    assert hashlib.sha256(img.read_bytes()).hexdigest() == before
    assert loops_under(sandbox) == [] and mounts_under(sandbox) == []


def test_teardown_remove_images_deletes_the_image(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    out = hotcache("teardown", "hot", "--yes", "--remove-images", check=True).stdout
    assert f"delete the image file {sandbox}/hot.img" in out
    assert not (sandbox / "hot.img").exists()
    assert loops_under(sandbox) == [] and mounts_under(sandbox) == []
    assert "kept_images" not in mapping.load(Path(os.environ["HOTCACHE_STATE"]))
    hotcache("apply", spec, "--yes", check=True)        # and a fresh build works


def test_wipe_true_is_the_consent_to_erase(sandbox):
    img = sandbox / "hot.img"
    subprocess.run(["truncate", "-s", "512M", img], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    before = img.read_bytes()[:2048]
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == 3 and "ext4" in proc.stderr
    assert img.read_bytes()[:2048] == before and loops_under(sandbox) == []
    assert not Path(os.environ["HOTCACHE_STATE"]).exists()

    spec.write_text(spec.read_text().replace("size: 512M}", "size: 512M}\n      wipe: true"))
    plan = hotcache("plan", spec).stdout
    assert "wipefs --all" in plan
    hotcache("apply", spec, "--yes", check=True)
    assert findmnt(sandbox / "mnt" / "hot")["fstype"] == "xfs"


def test_refuses_too_small_device(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox, size="100M"))
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == 3 and "too small" in proc.stderr and "300 MiB" in proc.stderr
    assert not (sandbox / "hot.img").exists()


def test_refuses_non_empty_mountpoint(sandbox):
    (sandbox / "mnt" / "hot").mkdir()
    (sandbox / "mnt" / "hot" / "precious.txt").write_text("keep me")
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == 3 and "not empty" in proc.stderr
    assert not (sandbox / "hot.img").exists()


def unchanged_host(sandbox) -> None:
    """A refusal changed nothing: no mapping, no fstab, nothing attached or mounted."""
    assert not Path(os.environ["HOTCACHE_STATE"]).exists()
    assert not Path(os.environ["HOTCACHE_FSTAB"]).exists()
    assert not (sandbox / "mnt" / "hot").exists()


def head(dev: str, n: int = 1 << 20) -> bytes:
    with open(dev, "rb") as f:
        return f.read(n)


def test_refuses_a_mounted_device(sandbox):
    img = sandbox / "busy.img"
    subprocess.run(["truncate", "-s", "512M", img], check=True)
    subprocess.run(["mkfs.xfs", "-q", img], check=True)
    dev = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True,
                         check=True).stdout.strip()
    other = sandbox / "other"
    other.mkdir()
    subprocess.run(["mount", dev, other], check=True)
    (other / "precious").write_text("keep me")
    subprocess.run(["sync"], check=True)
    before = head(dev)
    proc = hotcache("apply", wipe_spec(sandbox, dev), "--yes")
    assert proc.returncode == 3
    assert f"mounted at {other}" in proc.stderr and "even with wipe: true" in proc.stderr
    unchanged_host(sandbox)
    assert head(dev) == before and (other / "precious").read_text() == "keep me"
    assert findmnt(other)["source"] == dev


def wipe_spec(sandbox, device: str):
    """A spec that puts XFS straight on `device`, with consent to wipe it."""
    spec = sandbox / "spec.yaml"
    spec.write_text(f"""caches:
  - name: hot
    backend: none
    origin: {{path: {device}, wipe: true}}
    filesystem: {{mountpoint: {sandbox}/mnt/hot}}
""")
    return spec


def root_disk() -> str:
    """The disk that holds /, found by the device number of / (not by a name a tool
    prints first): its partition's parent when / is on a partition."""
    st = os.stat("/")
    sysdev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not sysdev.exists():
        pytest.fail(f"/ is not on a block device here ({sysdev} missing): this test needs "
                    "a machine whose root filesystem is on a disk, as CI's is")
    node = sysdev.resolve()
    if (node / "partition").exists():
        node = node.parent
    return f"/dev/{node.name}"


def test_refuses_the_root_device(sandbox):
    """(The root disk's bytes cannot be compared here: this machine's device cgroup
    refuses even root a read of it. The mapping, fstab and mountpoint are checked.)"""
    disk = root_disk()
    proc = hotcache("apply", wipe_spec(sandbox, disk), "--yes")
    assert proc.returncode == 3 and "root filesystem" in proc.stderr, proc.stderr
    unchanged_host(sandbox)


def test_apply_without_yes_and_without_terminal_changes_nothing(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    proc = hotcache("apply", spec)
    assert proc.returncode == 3 and "--yes" in proc.stderr
    assert not (sandbox / "hot.img").exists() and loops_under(sandbox) == []


def test_teardown_refuses_a_busy_mount_and_names_the_process(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    mp = sandbox / "mnt" / "hot"
    holder = subprocess.Popen(["sleep", "60"], cwd=mp)
    try:
        proc = hotcache("teardown", "hot", "--yes")
        assert proc.returncode == 3
        assert f"pid {holder.pid} (sleep)" in proc.stderr and "busy" in proc.stderr
        assert findmnt(mp) is not None
    finally:
        holder.kill()
        holder.wait()
    hotcache("teardown", "hot", "--yes", check=True)


def test_teardown_unknown_name(sandbox):
    proc = hotcache("teardown", "ghost", "--yes")
    assert proc.returncode == 2 and "'ghost'" in proc.stderr


def test_teardown_wipe_erases_signatures(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    hotcache("teardown", "hot", "--yes", "--wipe", check=True)
    probe = subprocess.run(["wipefs", "--no-act", "--json", sandbox / "hot.img"],
                           capture_output=True, text=True).stdout
    assert probe.strip() == "" or json.loads(probe)["signatures"] == []


def test_status_reports_drift_and_apply_repairs_it(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    mp = sandbox / "mnt" / "hot"
    subprocess.run(["mount", "-o", "remount,strictatime", mp], check=True)
    rc, doc = hotcache_json("status", "hot")
    assert rc == 5 and any("without noatime" in p for p in doc["caches"][0]["problems"])
    subprocess.run(["umount", mp], check=True)
    rc, doc = hotcache_json("status")
    assert rc == 5 and any("not mounted" in p for p in doc["caches"][0]["problems"])
    proc = hotcache("status")
    assert proc.returncode == 5 and "DRIFT" in proc.stdout

    hotcache("apply", spec, "--yes", check=True)
    rc, doc = hotcache_json("status")
    assert rc == 0 and doc["ok"]
    assert "noatime" in findmnt(mp)["options"].split(",")


def test_status_reports_a_detached_device(sandbox):
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    subprocess.run(["umount", sandbox / "mnt" / "hot"], check=True)
    for dev in loops_under(sandbox):
        subprocess.run(["losetup", "--detach", dev], check=True)
    rc, doc = hotcache_json("status")
    assert rc == 5
    assert any("is not attached" in p for p in doc["caches"][0]["problems"])


class Interrupt(BaseException):
    """Stands in for SIGKILL between two steps (nothing after it runs)."""


def first_words(plan) -> list[str]:
    return [str(s.argv[0]) if s.argv else s.summary.split()[0] for s in plan.steps]


@pytest.mark.parametrize("stop_before", range(1, 8))
def test_apply_interrupted_between_steps_converges(sandbox, stop_before):
    """Killed before step N (every N): the re-run finishes from where it stopped. It
    never creates the image again, never formats again once mkfs ran (that would destroy
    what the first run wrote), and the mapping says `building` until the end."""
    spec = parse_spec(loop_spec(sandbox))
    env = engine.Env(Runner(), state_path(), fstab_path())
    plan = engine.plan_apply(spec, env)
    words = first_words(plan)
    assert words == ["truncate", "losetup", "record", "mkfs.xfs", "mkdir", "mount", "write",
                     "record"], words

    def progress(i, step):
        if i == stop_before:
            raise Interrupt

    with pytest.raises(Interrupt):
        engine.execute(plan, env.runner, progress)
    ran = words[:stop_before]
    entry = mapping.load(state_path())["caches"].get("hot")
    if stop_before > 2:
        assert entry.state == "building", entry
    else:
        assert entry is None
    second = engine.plan_apply(spec, env)
    again = first_words(second)
    assert 0 < len(again) < len(words), again
    for program in ("truncate", "losetup", "mkfs.xfs"):
        if program in ran:
            assert program not in again, (ran, again)
    if "mkfs.xfs" in ran:
        assert not any(s.destructive for s in second.steps), again
    engine.execute(second, env.runner)
    assert engine.plan_apply(spec, env).empty
    rc, doc = hotcache_json("status")
    assert rc == 0 and doc["ok"], doc
    assert mapping.load(state_path())["caches"]["hot"].state == "ready"
    assert len(loops_under(sandbox)) == 1


def test_teardown_names_other_mount_namespaces_that_keep_the_filesystem(sandbox):
    """A process in a mount namespace made while the cache was mounted (a container with
    a private bind mount) keeps the filesystem, so the loop device stays attached after
    teardown until it exits: teardown says so, naming it."""
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "120"])
    try:
        for _ in range(100):            # until unshare has exec'd sleep in its namespace
            if os.readlink(f"/proc/{holder.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                break
            time.sleep(0.05)
        out = hotcache("teardown", "hot", "--yes", check=True).stdout
        assert "also mounted in other mount namespaces" in out
        assert f"pid {holder.pid} (sleep)" in out
    finally:
        holder.kill()
        holder.wait()
    for _ in range(100):                # the kernel lets the loop device go with it
        if not loops_under(sandbox):
            break
        time.sleep(0.1)
    assert loops_under(sandbox) == []


@pytest.mark.parametrize("replacement", ["copy", "other-data"])
def test_another_file_at_a_kept_image_path_is_refused(sandbox, replacement):
    """`kept_images` records the kept file's identity (st_dev, inode, size), not just its
    path. A file put at that path since (even a byte-for-byte copy, which carries the
    same XFS UUID) is not the one kept: apply refuses it and leaves it as it is."""
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    (sandbox / "mnt" / "hot" / "data.bin").write_bytes(b"kept" * 1024)
    hotcache("teardown", "hot", "--yes", check=True)
    img, other = sandbox / "hot.img", sandbox / "other.img"
    kept = mapping.load(Path(os.environ["HOTCACHE_STATE"]))["kept_images"][str(img)]
    assert kept["file"]["inode"] == img.stat().st_ino
    if replacement == "copy":
        shutil.copyfile(img, other)
    else:
        subprocess.run(["truncate", "-s", str(img.stat().st_size), other], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", other], check=True)
    os.replace(other, img)
    before = hashlib.sha256(img.read_bytes()).hexdigest()
    for command in ("plan", "apply"):
        proc = hotcache(command, spec, *(["--yes"] if command == "apply" else []))
        assert proc.returncode == 3, proc.stderr
        assert f"{img} is not the image hotcache kept when hot was taken down" in proc.stderr
        assert "inode" in proc.stderr and "wipe: true" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert hashlib.sha256(img.read_bytes()).hexdigest() == before
    assert loops_under(sandbox) == [] and mounts_under(sandbox) == []


def test_dry_run_changes_nothing_and_plans_are_stable(sandbox):
    """plan --json twice: the same bytes (no UUID drawn for a plan only shown); apply,
    teardown and restore with --dry-run print that plan, marked dry_run, and leave no
    image, loop device, mount, mapping, fstab line or lock behind; once built, status
    --json is the same twice too."""
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    first, second = hotcache("plan", spec, "--json"), hotcache("plan", spec, "--json")
    assert first.returncode == 0 and first.stdout == second.stdout, first.stderr
    planned = json.loads(first.stdout)
    assert planned["kind"] == "plan" and planned["format_version"] == 1
    assert "NEW-UUID" in " ".join(s["summary"] for s in planned["steps"])
    rc, dry = hotcache_json("apply", spec, "--dry-run")
    assert rc == 0 and (dry["kind"], dry["dry_run"], dry["changed"]) == ("apply", True, False)
    assert dry["steps"] == planned["steps"]
    assert sorted(p.name for p in sandbox.iterdir()) == ["mnt", "spec.yaml"]
    assert not (sandbox / "hot.img").exists() and not loops_under(sandbox)
    assert not Path(os.environ["HOTCACHE_STATE"]).parent.exists()

    hotcache("apply", spec, "--yes", check=True)
    before = (Path(os.environ["HOTCACHE_STATE"]).read_bytes(),
              Path(os.environ["HOTCACHE_FSTAB"]).read_bytes(), mounts_under(sandbox))
    a, b = hotcache("status", "--json"), hotcache("status", "--json")
    assert a.stdout == b.stdout and json.loads(a.stdout)["kind"] == "status"
    for argv, kind in ((["teardown", "hot", "--dry-run"], "teardown"),
                       (["restore", "--dry-run"], "restore")):
        rc, doc = hotcache_json(*argv)
        assert rc == 0 and (doc["kind"], doc["dry_run"]) == (kind, True), doc
    rc, doc = hotcache_json("teardown", "hot", "--dry-run")
    assert doc["steps"] and "unmount" in doc["steps"][0]["summary"]
    assert (Path(os.environ["HOTCACHE_STATE"]).read_bytes(),
            Path(os.environ["HOTCACHE_FSTAB"]).read_bytes(), mounts_under(sandbox)) == before
    hotcache("teardown", "hot", "--yes", check=True)

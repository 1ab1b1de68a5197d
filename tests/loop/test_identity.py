"""Devices are found again by identity, never by kernel name (docs/safety.md), on real
loop devices: a cache is built on a spec that names `/dev/loopN`; then, as after a boot in
which the disks enumerate in another order, a bystander image holding ext4 and data takes
that name. restore, apply and `teardown --wipe` must use the cache's own image wherever
it is now, or refuse naming both, and the bystander's bytes must not change."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import hotcache, hotcache_json, sha256_file as sha, write_spec

pytestmark = pytest.mark.root


def sh(*argv) -> str:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True,
                          text=True).stdout.strip()


def image(path: Path, mib: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(mib * 2**20)
    return path


def take_name(node: str, path: Path) -> None:
    """Attach `path` at `node`; other tests on this machine may hold the freed loop device
    for a moment, so try a few times."""
    for _ in range(20):
        if subprocess.run(["losetup", node, str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    pytest.fail(f"{node} stayed taken by another process; cannot stage the name swap")


@pytest.fixture
def swapped(sandbox):
    """Cache `hot` (backend none, spec naming /dev/loopN, `wipe: true` as consent for a
    disk that held ext4) built and holding a file; then a "reboot": the bystander image,
    ext4 with data, is attached under the cache's old name."""
    hot = image(sandbox / "hot.img", 400)
    sh("mkfs.ext4", "-q", "-F", hot)       # an old filesystem: wipe: true consents
    old_name = sh("losetup", "--find", "--show", hot)
    spec = write_spec(sandbox / "spec.yaml", f"""\
        caches:
          - name: hot
            backend: none
            origin: {{path: {old_name}, wipe: true}}
            filesystem: {{mountpoint: {sandbox}/mnt/hot}}
        """)
    hotcache("apply", spec, "--yes", check=True)
    (sandbox / "mnt" / "hot" / "kept.bin").write_bytes(b"cached data" * 1000)
    sh("umount", sandbox / "mnt" / "hot")
    sh("losetup", "--detach", old_name)
    bystander = image(sandbox / "bystander.img", 400)
    sh("mkfs.ext4", "-q", "-F", bystander)
    mp = sandbox / "by"
    mp.mkdir()
    sh("mount", "-o", "loop", bystander, mp)
    (mp / "precious.bin").write_bytes(os.urandom(1 << 20))
    sh("umount", mp)
    take_name(old_name, bystander)             # the bystander now carries the old name
    return {"spec": spec, "old": old_name, "bystander": bystander, "hot": hot,
            "sum": sha(bystander)}


def test_restore_uses_the_cache_image_under_its_new_name(swapped, sandbox):
    new_name = sh("losetup", "--find", "--show", swapped["hot"])
    assert new_name != swapped["old"]
    rc, doc = hotcache_json("restore", "hot", "--yes")
    assert rc == 0, doc
    argvs = [s["argv"] for s in doc["steps"] if s["argv"]]
    assert not any(swapped["old"] in a for a in argvs), argvs
    assert not any(a[0] in ("wipefs", "mkfs.xfs") for a in argvs), argvs   # wipe not replayed
    assert (sandbox / "mnt" / "hot" / "kept.bin").read_bytes() == b"cached data" * 1000
    assert sha(swapped["bystander"]) == swapped["sum"]
    entry = yaml.safe_load(Path(os.environ["HOTCACHE_STATE"]).read_text())["caches"]["hot"]
    assert entry["devices"]["origin"]["identity"]["backing_file"] == str(swapped["hot"])

    # apply of the same spec (it still says /dev/loopN, wipe: true): nothing to do.
    rc, doc = hotcache_json("apply", swapped["spec"], "--yes")
    assert rc == 0 and doc["changed"] is False, doc
    # teardown --wipe erases the cache's own device, found by identity.
    rc, doc = hotcache_json("teardown", "hot", "--wipe", "--yes")
    assert rc == 0, doc
    argvs = [s["argv"] for s in doc["steps"] if s["argv"]]
    assert ["wipefs", "--all", new_name] in argvs, argvs
    assert not any(swapped["old"] in a for a in argvs), argvs
    assert sha(swapped["bystander"]) == swapped["sum"]


@pytest.mark.parametrize("command", ["restore", "apply", "teardown"])
def test_refused_naming_both_when_the_cache_image_is_absent(swapped, command):
    args = {"restore": ["restore", "hot"], "apply": ["apply", swapped["spec"]],
            "teardown": ["teardown", "hot", "--wipe"]}[command]
    proc = hotcache(*args, "--yes")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    text = proc.stderr
    assert swapped["old"] in text and str(swapped["bystander"]) in text, text
    assert str(swapped["hot"]) in text, text            # the recorded device, named too
    assert sha(swapped["bystander"]) == swapped["sum"]
    assert sh("blkid", "-o", "value", "-s", "TYPE", swapped["old"]) == "ext4"


def test_a_built_cache_cannot_be_moved_onto_another_caches_device(sandbox):
    """A recorded cache claims its devices by identity (provision/engine/owners.py), so
    the spec of a built cache `a` changed to name cache `b`'s image is stopped by the
    planner's identity check: refused with exit 3, b's image, the mapping and fstab
    unchanged."""
    specs = {}
    for name in ("a", "b"):
        img = image(sandbox / f"{name}.img", 320)
        specs[name] = write_spec(sandbox / f"spec-{name}.yaml", f"""\
            caches:
              - name: {name}
                backend: none
                origin: {{loop: {{file: {img}, size: 320M}}}}
                filesystem: {{mountpoint: {sandbox}/mnt/{name}}}
            """)
        hotcache("apply", specs[name], "--yes", check=True)
    (sandbox / "mnt" / "b" / "b-data.bin").write_bytes(os.urandom(1 << 20))
    sh("umount", sandbox / "mnt" / "b")
    state = Path(os.environ["HOTCACHE_STATE"])
    fstab = Path(os.environ["HOTCACHE_FSTAB"])
    before = (sha(sandbox / "b.img"), state.read_bytes(), fstab.read_bytes())
    moved = write_spec(sandbox / "spec-a-moved.yaml", f"""\
        caches:
          - name: a
            backend: none
            origin: {{loop: {{file: {sandbox / 'b.img'}, size: 320M}}, wipe: true}}
            filesystem: {{mountpoint: {sandbox}/mnt/a}}
        """)
    res = hotcache("apply", moved, "--yes")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "moving a cache to other devices needs `hotcache teardown a` first" in \
        res.stdout + res.stderr
    assert (sha(sandbox / "b.img"), state.read_bytes(), fstab.read_bytes()) == before

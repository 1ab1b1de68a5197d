"""Devices hotcache must not take, on real loop devices: an existing image hotcache did not make,
and one device named twice (a path and its `..` twin, a loop device and its image, a
device the mapping records for another cache). Each test tries to get past the refusal
(`wipe: true` everywhere) and checks the victim's sha256, the exit code, and that the
mapping and fstab did not change."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from hotcache.provision.errors import ExitCode
from tests.helpers import hotcache, loop_spec, loops_under, mounts_under

pytestmark = pytest.mark.root


def sha(path: Path) -> str | None:
    if not path.exists():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files() -> tuple[Path, Path]:
    return Path(os.environ["HOTCACHE_STATE"]), Path(os.environ["HOTCACHE_FSTAB"])


def someones_data(path: Path, size: str = "512M") -> str:
    """A file with real data in it (8 MiB of random bytes in a sparse file)."""
    subprocess.run(["truncate", "-s", size, path], check=True)
    subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", "count=8",
                    "conv=notrunc", "status=none"], check=True)
    return sha(path)


def none_cache(name: str, origin: str, mp: Path) -> str:
    return f"""  - name: {name}
    backend: none
    origin: {origin}
    filesystem: {{mountpoint: {mp}}}
"""


def test_an_existing_data_file_is_not_formatted_without_wipe(sandbox):
    victim = sandbox / "hot.img"
    before = someones_data(victim)
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox, size="1G"))
    for cmd in (("plan", spec), ("apply", spec, "--yes")):
        proc = hotcache(*cmd)
        assert proc.returncode == ExitCode.REFUSED == 3, proc.stderr
        assert f"{victim} already exists and holds 8.0 MiB of data" in proc.stderr
        assert "512 MiB file; the spec says 1G" in proc.stderr and "wipe: true" in proc.stderr
    assert sha(victim) == before
    state, fstab = files()
    assert not state.exists() and not fstab.exists()
    assert loops_under(sandbox) == [] and mounts_under(sandbox) == []

    # wipe: true is the consent; the size that differs from the spec is reported.
    spec.write_text(spec.read_text().replace("size: 1G}", "size: 1G}\n      wipe: true"))
    proc = hotcache("plan", spec, "--json")
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(proc.stdout)["notes"]
    assert any("is 512 MiB, the spec says 1G" in n and "present size" in n for n in notes)


def test_the_same_image_named_twice_is_refused(sandbox):
    victim = sandbox / "a.img"
    before = someones_data(victim)
    (sandbox / "x").mkdir()
    spec = sandbox / "spec.yaml"
    spec.write_text("caches:\n"
                    + none_cache("one", f"{{loop: {{file: {victim}, size: 512M}}, wipe: true}}",
                                 sandbox / "mnt" / "one")
                    + none_cache("two", f"{{loop: {{file: {sandbox}/x/../a.img, size: 512M}}, "
                                        "wipe: true}", sandbox / "mnt" / "two"))
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr
    assert "caches[1].origin" in proc.stderr and "also used by caches[0].origin" in proc.stderr
    assert sha(victim) == before and not files()[0].exists()
    assert loops_under(sandbox) == []


def test_a_loop_device_and_the_image_attached_to_it_are_one_device(sandbox):
    victim = sandbox / "a.img"
    before = someones_data(victim)
    loop = subprocess.run(["losetup", "--find", "--show", victim], capture_output=True,
                          text=True, check=True).stdout.strip()
    spec = sandbox / "spec.yaml"
    spec.write_text("caches:\n"
                    + none_cache("one", f"{{loop: {{file: {victim}, size: 512M}}, wipe: true}}",
                                 sandbox / "mnt" / "one")
                    + none_cache("two", f"{{path: {loop}, wipe: true}}", sandbox / "mnt" / "two"))
    proc = hotcache("apply", spec, "--yes")
    assert proc.returncode == ExitCode.REFUSED, proc.stderr
    assert "one.origin" in proc.stderr and f"two.origin ({loop})" in proc.stderr
    assert "are the same device" in proc.stderr
    assert sha(victim) == before and not files()[0].exists() and not files()[1].exists()
    assert mounts_under(sandbox) == []


@pytest.mark.parametrize("how", ["loop device", "image by another path"])
def test_a_device_the_mapping_records_for_another_cache_is_refused(sandbox, how):
    """Cache `one` is built, then unmounted (as after a boot, before its mount): its
    device carries hotcache's XFS and no holder, and a spec for `two` names it."""
    spec = sandbox / "one.yaml"
    spec.write_text(loop_spec(sandbox, name="one"))
    hotcache("apply", spec, "--yes", check=True)
    subprocess.run(["umount", sandbox / "mnt" / "one"], check=True)
    (loop,) = loops_under(sandbox)
    state, fstab = files()
    before = (sha(sandbox / "one.img"), sha(state), sha(fstab))
    (sandbox / "x").mkdir()
    origin = (f"{{path: {loop}, wipe: true}}" if how == "loop device" else
              f"{{loop: {{file: {sandbox}/x/../one.img, size: 512M}}, wipe: true}}")
    two = sandbox / "two.yaml"
    two.write_text("caches:\n" + none_cache("two", origin, sandbox / "mnt" / "two"))
    proc = hotcache("apply", two, "--yes")
    assert proc.returncode == ExitCode.REFUSED, proc.stderr
    assert "the mapping records for cache one" in proc.stderr
    assert "`hotcache teardown one`" in proc.stderr
    assert (sha(sandbox / "one.img"), sha(state), sha(fstab)) == before
    assert loops_under(sandbox) == [loop] and mounts_under(sandbox) == []

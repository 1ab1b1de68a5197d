"""One lock from plan through execution, and a broken mapping is an
error, never "no caches". Real CLI runs as root on loop images, under a test sandbox."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from hotcache.provision.errors import ExitCode
from hotcache.provision.system.atomic import locked
from tests.helpers import HOTCACHE, hotcache, loop_spec, loops_under, mounts_under

pytestmark = pytest.mark.root


def sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def paths(sandbox: Path) -> tuple[Path, Path]:
    return Path(os.environ["HOTCACHE_STATE"]), Path(os.environ["HOTCACHE_FSTAB"])


def test_apply_gives_up_after_the_timeout_naming_the_holder_and_changes_nothing(sandbox):
    state, fstab = paths(sandbox)
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    with locked(state, holder="hotcache apply other.yaml"):
        proc = hotcache("apply", spec, "--yes", env={"HOTCACHE_LOCK_TIMEOUT": "1"})
    assert proc.returncode == ExitCode.TIMEOUT == 8, proc.stderr
    assert f"pid {os.getpid()} (hotcache apply other.yaml)" in proc.stderr
    assert "waiting for" in proc.stderr and "HOTCACHE_LOCK_TIMEOUT" in proc.stderr
    assert not (sandbox / "hot.img").exists() and not state.exists() and not fstab.exists()
    assert loops_under(sandbox) == [] and mounts_under(sandbox) == []


def test_teardown_and_restore_wait_for_the_same_lock(sandbox):
    state, fstab = paths(sandbox)
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    before = (sha(state), sha(fstab))
    with locked(state, holder="hotcache restore"):
        for args in (("teardown", "hot", "--yes"), ("restore", "--yes")):
            proc = hotcache(*args, env={"HOTCACHE_LOCK_TIMEOUT": "1"})
            assert proc.returncode == 8 and "(hotcache restore)" in proc.stderr, args
    assert (sha(state), sha(fstab)) == before
    assert mounts_under(sandbox) == [str(sandbox / "mnt" / "hot")]


def test_a_second_apply_waits_for_the_first_then_finds_nothing_to_do(sandbox):
    state, _ = paths(sandbox)
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    with locked(state, holder="hotcache apply first.yaml"):
        proc = subprocess.Popen([*HOTCACHE, "apply", str(spec), "--yes"], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL,
                                env={**os.environ, "HOTCACHE_LOCK_TIMEOUT": "120"})
        try:
            line = proc.stderr.readline()     # blocks until it says it waits
            assert "waiting for pid" in line and "(hotcache apply first.yaml)" in line, line
            assert not (sandbox / "hot.img").exists() and not state.exists(), \
                "nothing is planned or done while another run holds the lock"
        except BaseException:
            proc.kill()
            raise
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert mounts_under(sandbox) == [str(sandbox / "mnt" / "hot")]


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_a_broken_mapping_is_an_error_not_no_caches(sandbox, damage):
    state, fstab = paths(sandbox)
    spec = sandbox / "spec.yaml"
    spec.write_text(loop_spec(sandbox))
    hotcache("apply", spec, "--yes", check=True)
    hotcache("teardown", "hot", "--yes", check=True)   # the image keeps hotcache's XFS
    second = sandbox / "second.yaml"
    second.write_text(loop_spec(sandbox, name="two"))
    hotcache("apply", second, "--yes", check=True)
    text = state.read_text()
    state.write_text({"empty": "", "truncated": text[: text.index("backend:") + 3],
                      "garbage": "caches: [\n"}[damage])
    before = (sha(state), sha(fstab), sha(sandbox / "two.img"))
    for args in (("apply", second, "--yes"), ("status",), ("teardown", "two", "--yes"),
                 ("restore", "--yes")):
        proc = hotcache(*args)
        assert proc.returncode == ExitCode.BAD_INPUT, (args, proc.stderr)
        assert f"mapping {state}" in proc.stderr and "backup" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert (sha(state), sha(fstab), sha(sandbox / "two.img")) == before
    assert mounts_under(sandbox) == [str(sandbox / "mnt" / "two")]

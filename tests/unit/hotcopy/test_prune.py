"""`hotcache prune`: a dry run changes nothing, --yes removes exactly what the dry run
listed, a copy a process holds open is kept, and deletion never follows a symlink."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy import prune
from tests.helpers import hotcache_json
from tests.unit.adapters.helpers import write_hot_copy

DAY = 86400


def snapshot(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                       else os.readlink(p) if p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


def age(path, seconds):
    t = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (t, t), follow_symlinks=False)


@pytest.fixture
def tier(tmp_path):
    """An SSD folder with three versions of `ds`, a copy whose source is gone, an old and
    a fresh staging folder, and two tf.data caches; `victim` outside it."""
    data = tmp_path / "data"
    for d in ("ds", "other", "lost"):
        (data / d / "a").mkdir(parents=True)
        (data / d / "a" / "1.jpg").write_bytes(os.urandom(5000))
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    for v in (1, 2, 3):
        write_hot_copy(data / "ds", ssd / f"ds-v{v}", name="ds", version=str(v),
                       meta_extra={"copied_at": f"2026-0{v}-01T00:00:00Z",
                                   "source": str(data / "ds")})
    write_hot_copy(data / "lost", ssd / "lost", name="lost",
                   meta_extra={"source": str(data / "lost")})
    subprocess.run(["rm", "-rf", str(data / "lost")], check=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_bytes(b"keep me")
    old = ssd / ".gone.hotcache-staging"
    (old / "a").mkdir(parents=True)
    (old / "a" / "1.jpg").write_bytes(b"x" * 3000)
    (old / "a" / "escape").symlink_to(victim)           # a user's link out of the tier
    age(old, 2 * DAY)
    fresh = ssd / ".resume.hotcache-staging"
    fresh.mkdir()
    (fresh / "f").write_bytes(b"y" * 100)
    tf = tmp_path / "tfcache"
    for key in ("ds-1-aaaa", "ds-2-bbbb"):
        (tf / key).mkdir(parents=True)
        (tf / key / "cache.index").write_bytes(b"i" * 700)
        (tf / key / "cache.data-00000-of-00001").write_bytes(b"d" * 9000)
    keys = tmp_path / "keys.txt"
    keys.write_text("ds-2-bbbb\n")
    return tmp_path, ssd, tf, keys, victim


def run(tmp_path, ssd, tf, keys, *extra):
    return hotcache_json("prune", ssd, "--tf-cache", tf, "--keep-keys", keys, *extra,
                         env={"HOTCACHE_STATE": str(tmp_path / "m.yaml")})


def test_dry_run_lists_and_changes_nothing_then_yes_removes_exactly_that(tier):
    tmp_path, ssd, tf, keys, victim = tier
    before = snapshot(tmp_path)
    rc, dry = run(tmp_path, ssd, tf, keys)
    assert rc == 0 and dry["dry_run"]
    listed = {c["path"]: c["kind"] for c in dry["candidates"]}
    assert listed == {str(ssd / "ds-v1"): "old-version", str(ssd / "lost"): "source-gone",
                      str(ssd / ".gone.hotcache-staging"): "staging",
                      str(tf / "ds-1-aaaa"): "tf-cache"}
    assert dry["bytes"] == sum(c["bytes"] for c in dry["candidates"]) > 9000
    assert snapshot(tmp_path) == before, "a dry run changes nothing"
    rc, done = run(tmp_path, ssd, tf, keys, "--yes")
    assert rc == 0 and not done["dry_run"]
    assert done["candidates"] == dry["candidates"] and done["freed_bytes"] == dry["bytes"]
    after = snapshot(tmp_path)
    gone = {k for k in before if k not in after}
    assert all(any((tmp_path / k).as_posix().startswith(p) for p in listed) for k in gone)
    assert {k for k in before if k not in gone} == set(after)
    for p in listed:
        assert not os.path.lexists(p)
    assert (victim / "precious").read_bytes() == b"keep me", "the symlink was not followed"
    assert (ssd / ".resume.hotcache-staging" / "f").exists(), "a recent staging folder stays"


def test_a_copy_held_open_is_kept(tier):
    tmp_path, ssd, tf, keys, _victim = tier
    holder = subprocess.Popen([sys.executable, "-c", "import time; f = open('ds-v1/a/1.jpg');"
                               " print('open', flush=True); time.sleep(120)"],
                              cwd=ssd, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        rc, out = run(tmp_path, ssd, tf, keys, "--yes")
        assert rc == 0
        busy = {c["path"]: c["busy"] for c in out["kept_busy"]}
        assert f"pid {holder.pid}" in busy[str(ssd / "ds-v1")]
        assert str(ssd / "ds-v1") not in {c["path"] for c in out["candidates"]}
        assert (ssd / "ds-v1" / "a" / "1.jpg").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_folder_swapped_for_a_symlink_after_listing_is_refused(tier):
    _tmp_path, ssd, _tf, _keys, victim = tier
    found = {c.path: c for c in prune.find([ssd], keep=2, staging_hours=24, tf_caches=[],
                                           keep_keys=None, older_than_days=None)}
    c = found[str(ssd / "ds-v1")]
    subprocess.run(["rm", "-rf", c.path], check=True)
    os.symlink(victim, c.path)
    with pytest.raises(UsageError, match="changed since it was listed"):
        prune.remove(c)
    assert (victim / "precious").read_bytes() == b"keep me"
    with pytest.raises(OSError):
        # a symlinked folder on the way to a candidate is not followed either
        prune._open_dir_nofollow(ssd / "ds-v1")


def test_bad_options_change_nothing(tier):
    tmp_path, ssd, tf, _keys, _victim = tier
    before = snapshot(tmp_path)
    for args in (["--keep", "0"], ["--tf-cache", str(tf)], ["--keep-keys", "/nope"]):
        proc = subprocess.run([sys.executable, "-m", "hotcache.provision", "prune", str(ssd),
                               *args, "--yes"], capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert snapshot(tmp_path) == before

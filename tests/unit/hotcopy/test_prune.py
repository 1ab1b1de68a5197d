"""`hotcache prune`: a dry run changes nothing, --yes removes exactly what the dry run
listed, a copy a process holds open is kept, and deletion never follows a symlink."""

from __future__ import annotations

import json
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
    staged_by_hotcache(old, ssd / "gone")
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


def staged_by_hotcache(folder, dest):
    """The header a copy to `dest` writes into its staging folder."""
    (folder / ".hotcache-staging.json").write_text(json.dumps(
        {"source": "/data/x", "dest": str(dest)}))


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


def sha256_tree(root):
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def leftover(ssd, name):
    folder = ssd / name
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "data").write_bytes(os.urandom(4000))
    return folder


def test_an_aside_folder_not_recorded_is_reported_and_never_deleted(tier):
    """The account's own folder, named like a refresh leftover but never recorded by
    hotcache before a rename, is kept and its bytes stay as they were."""
    from hotcache.provision import mapping

    tmp_path, ssd, tf, keys, _victim = tier
    mapping.save(tmp_path / "m.yaml", mapping.empty())
    bob = leftover(ssd, ".bob.hotcache-old")
    pruning = leftover(ssd, ".x.hotcache-pruning")
    before = sha256_tree(bob), sha256_tree(pruning)
    rc, out = run(tmp_path, ssd, tf, keys, "--yes")
    assert rc == 0, out
    kept = {c["path"]: c["kept"] for c in out["kept_not_ours"]}
    assert kept == {str(bob): "not hotcache's (not recorded)",
                    str(pruning): "not hotcache's (not recorded)"}
    assert str(bob) not in {c["path"] for c in out["candidates"]}
    assert (sha256_tree(bob), sha256_tree(pruning)) == before


def test_without_a_mapping_no_aside_folder_is_deleted(tier):
    tmp_path, ssd, tf, keys, _victim = tier
    old = leftover(ssd, ".ds.hotcache-old")
    before = sha256_tree(old)
    rc, out = run(tmp_path, ssd, tf, keys, "--yes")
    assert rc == 0 and [c["path"] for c in out["kept_not_ours"]] == [str(old)]
    assert sha256_tree(old) == before


def test_a_recorded_aside_is_deleted_and_its_record_dropped(tier):
    from hotcache.provision import mapping
    from hotcache.provision.hotcopy import catalog

    tmp_path, ssd, tf, keys, _victim = tier
    state = tmp_path / "m.yaml"
    mapping.save(state, mapping.empty())
    old = leftover(ssd, ".ds.hotcache-old")
    assert catalog.record_aside(old, os.lstat(old), state)
    replaced = leftover(ssd, ".y.hotcache-old")       # recorded, then swapped for another
    catalog.record_aside(replaced, os.lstat(replaced), state)
    os.rename(replaced, tmp_path / "moved")
    leftover(ssd, ".y.hotcache-old")
    rc, out = run(tmp_path, ssd, tf, keys, "--yes")
    assert rc == 0, out
    assert str(old) in {c["path"] for c in out["candidates"]}
    assert not os.path.lexists(old)
    assert [c["path"] for c in out["kept_not_ours"]] == [str(ssd / ".y.hotcache-old")]
    # the folder at .y is not the one recorded there: that record is stale, and goes
    assert catalog.recorded_asides(state) == {}


def test_prune_records_its_own_aside_before_renaming(tier, monkeypatch):
    """A removal that stops after prune's rename leaves a `.hotcache-pruning` folder the
    next prune knows as its own (recorded before the rename), and deletes."""
    from hotcache.provision import mapping
    from hotcache.provision.hotcopy import catalog
    from hotcache.provision.system import beneath

    tmp_path, ssd, _tf, _keys, _victim = tier
    state = tmp_path / "m.yaml"
    mapping.save(state, mapping.empty())
    [cand] = [c for c in prune.find([ssd], keep=2, staging_hours=24, tf_caches=[],
                                    keep_keys=None, older_than_days=None)
              if c.kind == "old-version"]

    def interrupted(fd):
        raise OSError(5, "interrupted")

    monkeypatch.setattr(beneath, "empty", interrupted)
    with pytest.raises(OSError):
        prune.remove(cand, state)
    aside = ssd / ".ds-v1.hotcache-pruning"
    assert aside.is_dir() and str(aside) in catalog.recorded_asides(state)
    monkeypatch.undo()
    again = prune.find([ssd], keep=2, staging_hours=24, tf_caches=[], keep_keys=None,
                       older_than_days=None, asides=catalog.recorded_asides(state))
    [c] = [c for c in again if c.path == str(aside)]
    assert c.kept is None
    prune.remove(c, state)
    assert not aside.exists() and catalog.recorded_asides(state) == {}


@pytest.mark.parametrize("header", [None, "/elsewhere/ds", "ds", "[1]", '{"dest": 7}'])
def test_a_staging_folder_without_hotcaches_header_for_this_place_is_kept(tier, header):
    """This account's folder renamed to a staging name (no header), or hotcache's own
    staging folder moved here from another DEST, is reported, never deleted."""
    tmp_path, ssd, tf, keys, _victim = tier
    folder = leftover(ssd, ".mine.hotcache-staging")
    if header is not None:
        body = header if header.startswith(("[", "{")) else json.dumps({"dest": header})
        (folder / ".hotcache-staging.json").write_text(body)
    age(folder, 2 * DAY)
    before = sha256_tree(folder)
    rc, out = run(tmp_path, ssd, tf, keys, "--yes")
    assert rc == 0, out
    assert [c["path"] for c in out["kept_not_ours"]] == [str(folder)]
    assert out["kept_not_ours"][0]["kept"].startswith("not hotcache's")
    assert str(folder) not in {c["path"] for c in out["candidates"]}
    assert sha256_tree(folder) == before


def test_a_staging_folder_inside_a_mountpoint_dest_is_known_by_its_header(tier):
    tmp_path, ssd, tf, keys, _victim = tier
    folder = leftover(ssd / "mnt", ".mnt.hotcache-staging")
    staged_by_hotcache(folder, ssd / "mnt")
    age(folder, 2 * DAY)
    rc, out = run(tmp_path, ssd, tf, keys, "--yes")
    assert rc == 0 and str(folder) in {c["path"] for c in out["candidates"]}, out
    assert not folder.exists()


def test_a_refresh_records_the_old_tree_it_leaves_aside_and_prune_deletes_it(
        tmp_path, monkeypatch):
    """Where RENAME_EXCHANGE is not supported a refresh renames the old tree to
    `.DEST.hotcache-old` first; if removing it then fails, the folder stays behind. It was
    recorded before the rename, so prune knows it as hotcache's and deletes it."""
    import errno

    from hotcache.provision import mapping
    from hotcache.provision.hotcopy import catalog, copier
    from hotcache.provision.system import beneath
    from tests.unit.hotcopy.test_copy import make_dataset

    state = tmp_path / "m.yaml"
    mapping.save(state, mapping.empty())
    src, dest = make_dataset(tmp_path / "src"), tmp_path / "hot" / "ds"
    dest.parent.mkdir()
    copier.copy(src, dest, copier.CopyOptions(state=state))
    (src / "new.bin").write_bytes(os.urandom(3000))
    real_rename, real_empty = beneath.rename_at, beneath.empty

    def no_exchange(*args):
        if len(args) > 4 and args[4] & beneath.RENAME_EXCHANGE:
            raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")
        return real_rename(*args)

    def cannot_empty(fd, *args, **kwargs):
        if os.fstat(fd).st_ino == old_ino:
            raise OSError(errno.EIO, "I/O error")
        return real_empty(fd, *args, **kwargs)

    old_ino = os.lstat(dest).st_ino
    monkeypatch.setattr(beneath, "rename_at", no_exchange)
    monkeypatch.setattr(beneath, "empty", cannot_empty)
    copier.copy(src, dest, copier.CopyOptions(state=state))
    monkeypatch.undo()
    aside = dest.parent / ".ds.hotcache-old"
    assert aside.is_dir() and os.lstat(aside).st_ino == old_ino
    assert (dest / "new.bin").exists()
    found = prune.find([dest.parent], keep=2, staging_hours=24, tf_caches=[],
                       keep_keys=None, older_than_days=None,
                       asides=catalog.recorded_asides(state))
    [c] = [c for c in found if c.path == str(aside)]
    assert c.kind == "refresh-leftover" and c.kept is None
    prune.remove(c, state)
    assert not os.path.lexists(aside) and catalog.recorded_asides(state) == {}


def test_a_staging_header_counts_only_in_the_folder_prune_looked_at(tmp_path):
    """Between prune's lstat and its reading of the header, a member could swap another
    folder (holding a forged header) in at the name: the header is read only from the
    inode that was looked at."""
    from hotcache.provision.hotcopy.staging import made_here

    looked_at = leftover(tmp_path, ".ds.hotcache-staging")
    st = os.lstat(looked_at)
    os.rename(looked_at, tmp_path / "moved")
    forged = leftover(tmp_path, ".ds.hotcache-staging")
    staged_by_hotcache(forged, tmp_path / "ds")
    assert made_here(forged, os.lstat(forged))
    assert not made_here(forged, st)


def test_a_recorded_aside_removed_by_hand_is_forgotten_by_the_next_prune(tier):
    """Its inode number may come back for another folder: the record must not outlive it."""
    from hotcache.provision import mapping
    from hotcache.provision.hotcopy import catalog

    tmp_path, ssd, tf, keys, _victim = tier
    state = tmp_path / "m.yaml"
    mapping.save(state, mapping.empty())
    gone, kept = leftover(ssd, ".a.hotcache-old"), leftover(ssd, ".b.hotcache-old")
    for folder in (gone, kept):
        catalog.record_aside(folder, os.lstat(folder), state)
    subprocess.run(["rm", "-r", str(gone)], check=True)
    rc, out = run(tmp_path, ssd, tf, keys)                    # a dry run forgets nothing
    assert rc == 0 and set(catalog.recorded_asides(state)) == {str(gone), str(kept)}
    busy = os.open(kept, os.O_RDONLY)                        # held open: kept, still recorded
    try:
        rc, out = run(tmp_path, ssd, tf, keys, "--yes")
    finally:
        os.close(busy)
    assert rc == 0, out
    assert set(catalog.recorded_asides(state)) == {str(kept)}

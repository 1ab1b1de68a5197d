"""`hotcache verify` means what it says: the default check catches a file rewritten in
place at the same size (by its mtime, as the copy recorded it), and a weaker check never
clears the failure a stronger one recorded. Through the real entry point."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hotcache.provision.hotcopy.format import CopyState, copy_state
from tests.helpers import hotcache, hotcache_json
from tests.unit.hotcopy.test_copy import make_dataset


def published(tmp_path: Path) -> tuple[Path, Path]:
    src = make_dataset(tmp_path / "src", n=4)
    dest = tmp_path / "hot" / "ds"
    dest.parent.mkdir()
    hotcache("copy", src, dest, "--name", "ds", "--version", "1", "--verify", check=True)
    return dest, dest / "cat" / "001.jpg"


def rewrite_in_place(victim: Path, keep_mtime: bool) -> None:
    """Same size, other bytes; with keep_mtime the mtime is put back (bit rot, or a
    writer that restores it)."""
    st = os.stat(victim)
    data = victim.read_bytes()
    time.sleep(0.01)    # a later mtime even on a coarse clock
    with open(victim, "r+b") as f:
        f.write(bytes(b ^ 0xFF for b in data[:64]))
    if keep_mtime:
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_default_check_catches_a_file_rewritten_in_place_at_the_same_size(tmp_path):
    dest, victim = published(tmp_path)
    rc, report = hotcache_json("verify", dest)
    assert rc == 0 and report["ok"] and report["mtimes_checked"], report
    rewrite_in_place(victim, keep_mtime=False)
    rc, report = hotcache_json("verify", dest)
    assert rc == 5 and report["mode"] == "fast" and report["hashed_files"] == 0, report
    assert [p["path"] for p in report["problems"]] == ["cat/001.jpg"], report
    assert "modified since it was copied" in report["problems"][0]["problem"]
    assert copy_state(dest)[0] is CopyState.FAILED_VERIFICATION
    # the full check names it once, by its hash
    rc, report = hotcache_json("verify", dest, "--full")
    assert rc == 5 and len(report["problems"]) == 1, report
    assert "sha256" in report["problems"][0]["problem"]


def test_a_weaker_check_never_clears_what_a_stronger_one_found(tmp_path):
    dest, victim = published(tmp_path)
    good = victim.read_bytes()
    st = os.stat(victim)
    rewrite_in_place(victim, keep_mtime=True)
    assert hotcache("verify", dest).returncode == 0        # size and mtime look right
    full = hotcache("verify", dest, "--full")
    assert full.returncode == 5 and "cat/001.jpg" in full.stdout, full.stdout
    for weaker in (["--fast"], ["--sample", "3"]):
        rc, report = hotcache_json("verify", dest, *weaker)
        assert rc == 5 and not report["ok"], report
        said = report["problems"][0]["path"] + " " + report["problems"][0]["problem"]
        # a sample that happens to hash the victim names it by its hash instead
        assert "cannot clear" in said or "sha256" in said, report
        assert "cat/001.jpg" in said, report
        assert copy_state(dest)[0] is CopyState.FAILED_VERIFICATION
    rc, report = hotcache_json("verify", dest, "--fast")
    assert "cannot clear" in report["problems"][0]["problem"], report
    # the bytes put back: only a full pass clears it, and the fast check agrees after
    victim.write_bytes(good)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert hotcache("verify", dest, "--full").returncode == 0
    assert copy_state(dest)[0] is CopyState.VERIFIED
    assert hotcache("verify", dest).returncode == 0


def test_a_full_pass_makes_the_mtimes_as_they_are_the_record(tmp_path):
    """A file touched but unchanged fails the quick check until a full check has proved
    its bytes; a copy made before mtimes were kept gets them from its first full pass."""
    dest, victim = published(tmp_path)
    os.utime(victim)
    assert hotcache("verify", dest).returncode == 5
    assert hotcache("verify", dest, "--full").returncode == 0
    assert hotcache("verify", dest).returncode == 0

    (dest / ".hotcache-mtimes").unlink()
    rc, report = hotcache_json("verify", dest)
    assert rc == 0 and not report["mtimes_checked"], report
    assert hotcache("verify", dest, "--full").returncode == 0
    rewrite_in_place(victim, keep_mtime=False)
    rc, report = hotcache_json("verify", dest)
    assert rc == 5 and report["mtimes_checked"], report


def test_a_source_touched_after_the_walk_is_recorded_with_the_mtime_its_copy_got(
        tmp_path, monkeypatch):
    """The copy records each file's mtime from what it set, not from the walk: a source
    rewritten between the walk and its copy is copied as it then was, and the default
    check passes on that copy (a record from the walk would fail it)."""
    from hotcache.provision.hotcopy import copier

    src = make_dataset(tmp_path / "src", n=4)
    late = src / "cat" / "002.jpg"
    walked = copier.select

    def select_then_touch(*args, **kwargs):
        sel = walked(*args, **kwargs)
        time.sleep(0.01)
        late.write_bytes(late.read_bytes()[::-1])   # same size, a later mtime
        return sel

    monkeypatch.setattr(copier, "select", select_then_touch)
    dest = tmp_path / "ds"
    copier.copy(src, dest, copier.CopyOptions(space_check=False))
    assert os.stat(dest / "cat" / "002.jpg").st_mtime_ns == os.stat(late).st_mtime_ns
    rc, report = hotcache_json("verify", dest)
    assert rc == 0 and report["mtimes_checked"], report

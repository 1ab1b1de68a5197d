"""The decisions `prune.find` is built from, each without a tier: which folders may be
candidates at all, which leftover is hotcache's own, which version of a copy goes, and
which tf.data cache folder goes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hotcache.provision.hotcopy.prune import (_considered, _copy_verdict, _newest_first,
                                              _recorded_aside, _tf_cache_why)

ME = 1000
FOLDER = Path("/tier/imagenet")


def st(dev=8, ino=42, uid=ME):
    return SimpleNamespace(st_dev=dev, st_ino=ino, st_uid=uid)


def never(*_args):
    raise AssertionError("asked, though the decision was already made")


def test_only_this_accounts_own_folders_are_considered():
    assert _considered(FOLDER, st(), ME, {})
    assert not _considered(FOLDER, st(uid=0), ME, {})


def test_a_recorded_copy_renamed_elsewhere_is_never_a_leftover():
    assert not _considered(Path("/tier/.imagenet.hotcache-old"), st(), ME,
                           {(8, 42): str(FOLDER)})
    assert _considered(FOLDER, st(), ME, {(8, 42): str(FOLDER)})     # at its recorded path
    assert _considered(FOLDER, st(), ME, {(8, 43): "/tier/other"})   # another inode's record


def test_an_aside_is_hotcaches_only_as_the_very_folder_recorded_at_that_path():
    aside = Path("/tier/.imagenet.hotcache-old")
    asides = {str(aside): (8, 42, ME)}
    assert _recorded_aside(aside, st(), asides)
    assert not _recorded_aside(aside, st(ino=43), asides)      # another folder put there
    assert not _recorded_aside(aside, st(uid=0), asides)       # another owner
    assert not _recorded_aside(Path("/tier/.x.hotcache-old"), st(), asides)
    assert not _recorded_aside(aside, st(), {})


def test_versions_newest_first_by_copy_time_then_version_number():
    def v(version, copied_at=""):
        return ({"version": version, "copied_at": copied_at}, Path(f"/t/{version}"), st())
    order = _newest_first([v("2", "2026-01-01"), v("10", "2026-01-01"), v("9", "2026-03-01"),
                           v("1", "2025-12-31")])
    assert [m["version"] for m, _, _ in order] == ["9", "10", "2", "1"]


def test_versions_beyond_keep_go_first_without_asking_for_the_source():
    assert _copy_verdict("imagenet", 2, {"version": "3"}, 2, never) == (
        "old-version", "imagenet version 3: 2 newer version(s) kept (--keep 2)")


def test_a_kept_version_goes_only_when_its_source_is_gone():
    meta = {"version": "3", "source": "/data/imagenet"}
    assert _copy_verdict("imagenet", 0, meta, 1, lambda s: s == "/data/imagenet") == (
        "source-gone", "its source /data/imagenet is gone")
    assert _copy_verdict("imagenet", 1, meta, 2, lambda s: False) is None


def test_a_tf_cache_key_not_listed_goes_without_reading_its_age():
    assert _tf_cache_why("k1", {"k2"}, 7, never) == "its key is not in the --keep-keys list"


@pytest.mark.parametrize("keys,older,idle,why", [
    ({"k1"}, 7, 9.0, "no pipeline used it for 9 days"),
    (None, 7, 7.0, "no pipeline used it for 7 days"),     # the bound itself goes
    (None, 7, 6.9, None),
    ({"k1"}, None, 99.0, None),                            # no age bound: the key keeps it
    (None, None, 99.0, None),
])
def test_a_tf_cache_by_age(keys, older, idle, why):
    assert _tf_cache_why("k1", keys, older, lambda: idle) == why

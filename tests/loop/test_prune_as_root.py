"""`hotcache prune --yes` as root on a group-writable (2775) XFS that a second account
can write to: a folder given a hotcache name, a planted "newer version" and a folder
swapped in at the aside name are never deleted; the member's bytes stay unchanged."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hotcache.provision import mapping
from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy import catalog
from hotcache.provision.hotcopy import prune
from hotcache.provision.system import beneath
from tests.helpers import hotcache_json
from tests.loop.test_copy_as_root import shared  # noqa: F401  (fixture)
from tests.unit.adapters.helpers import write_hot_copy

pytestmark = pytest.mark.root


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def chown_tree(root: Path, user) -> None:
    for p in [root, *root.rglob("*")]:
        os.lchown(p, user.pw_uid, user.pw_gid)


def members_folder(mnt: Path, name: str, user) -> Path:
    folder = mnt / name
    (folder / "work").mkdir(parents=True)
    (folder / "work" / "thesis.txt").write_bytes(b"a member's only copy\n" * 100)
    chown_tree(folder, user)
    os.chmod(folder, 0o700)
    return folder


def prune_yes(mnt: Path, *extra: str) -> tuple[int, dict]:
    return hotcache_json("prune", str(mnt), "--yes", *extra)


def test_a_members_folder_renamed_to_a_hotcache_name_is_not_deleted(shared, user):
    mnt, _src, _victim = shared
    bob = members_folder(mnt, "bob", user)
    before = digests(bob)
    renamed = mnt / ".bob.hotcache-old"
    os.rename(bob, renamed)                    # what any member of the group can do
    rc, out = prune_yes(mnt)
    assert rc == 0, out
    assert str(renamed) not in {c["path"] for c in out["candidates"]}
    assert digests(renamed) == before


def test_a_planted_newer_version_does_not_get_roots_copy_deleted(shared, user):
    mnt, src, _victim = shared
    real = write_hot_copy(src, mnt / "ds-v1", name="ds", version="1",
                          meta_extra={"copied_at": "2026-01-01T00:00:00Z",
                                      "source": str(src)})
    before = digests(real)
    empty = mnt / "empty"
    empty.mkdir()
    fake = write_hot_copy(empty, mnt / "ds-v9", name="ds", version="9",
                          meta_extra={"copied_at": "2099-01-01T00:00:00Z",
                                      "source": str(src)})
    chown_tree(fake, user)                     # the member's own fake copy
    rc, out = prune_yes(mnt, "--keep", "1")
    assert rc == 0, out
    assert not out["candidates"], out
    assert digests(real) == before


def test_a_folder_swapped_in_at_the_aside_name_is_not_emptied(shared, user, monkeypatch):
    mnt, _src, _victim = shared
    leftover = mnt / ".ds.hotcache-old"
    (leftover / "a").mkdir(parents=True)
    (leftover / "a" / "old").write_bytes(b"old tree\n")
    state = Path(os.environ["HOTCACHE_STATE"])
    mapping.save(state, mapping.empty())
    catalog.record_aside(leftover, os.lstat(leftover), state)   # as a refresh does
    [cand] = prune.find([mnt], keep=1, staging_hours=24, tf_caches=[], keep_keys=None,
                        older_than_days=None, asides=catalog.recorded_asides(state))
    bob = members_folder(mnt, "bob", user)
    before = digests(bob)
    real_open_at = beneath.open_at
    seen = []

    def member_swaps_first(dirfd, rel, *args, **kwargs):
        # between root's rename and its open, the member puts their folder there
        seen.append(rel)
        os.rename(rel, "moved-away", src_dir_fd=dirfd, dst_dir_fd=dirfd)
        os.rename("bob", rel, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        return real_open_at(dirfd, rel, *args, **kwargs)

    monkeypatch.setattr(beneath, "open_at", member_swaps_first)
    with pytest.raises(UsageError, match="not the folder that was listed"):
        prune.remove(cand, state)
    aside = mnt / seen[0]
    assert digests(aside) == before, "the member's folder was not emptied"


def test_roots_recorded_copy_renamed_to_a_leftover_name_is_not_deleted(sandbox, user):
    """The parent is group-writable without the sticky bit, so a member can rename root's
    own copy (root-owned, so the owner filter passes it) to `.x.hotcache-old` or to a
    staging name: prune knows it by the inode the mapping records and keeps it."""
    from tests.helpers import hotcache
    from tests.loop.test_kube_loop import build
    from tests.unit.hotcopy.test_copy import make_dataset

    mp = build(sandbox)
    os.chown(mp, 0, user.pw_gid)
    os.chmod(mp, 0o2775)
    hotcache("copy", make_dataset(sandbox / "src"), mp / "toy", "--verify", check=True)
    before = digests(mp / "toy")
    for name in (".toy.hotcache-old", ".toy.hotcache-staging"):
        os.rename(next(p for p in mp.iterdir() if p.name in ("toy", ".toy.hotcache-old")),
                  mp / name)
        rc, out = hotcache_json("prune", "--yes", "--staging-hours", "0")
        assert rc == 0, out
        assert str(mp / name) not in {c["path"] for c in out["candidates"]}, out
        assert digests(mp / name) == before


@pytest.mark.parametrize("name", [".keep.hotcache-old", ".keep.hotcache-pruning",
                                  ".keep.hotcache-staging"])
def test_roots_own_folder_renamed_to_a_hotcache_name_is_not_deleted(shared, user, name):
    """Root's own folder (say, the administrator's notes, 0755) in the shared mount: a
    member renames it to a leftover or staging name. It is root's, so the owner filter
    passes it, and it is no recorded copy; prune keeps it because hotcache never
    recorded that folder at that name (nor wrote a staging header into it)."""
    mnt, _src, _victim = shared
    state = Path(os.environ["HOTCACHE_STATE"])
    mapping.save(state, mapping.empty())
    notes = mnt / "notes"
    (notes / "runbooks").mkdir(parents=True)
    (notes / "runbooks" / "restore.txt").write_bytes(b"root's only runbook\n" * 50)
    os.chmod(notes, 0o755)
    os.utime(notes, (1, 1))
    os.utime(notes / "runbooks", (1, 1))
    os.utime(notes / "runbooks" / "restore.txt", (1, 1))
    before = digests(notes)
    os.rename(notes, mnt / name)                 # what any member of the group can do
    rc, out = prune_yes(mnt, "--staging-hours", "0")
    assert rc == 0, out
    assert str(mnt / name) not in {c["path"] for c in out["candidates"]}, out
    assert str(mnt / name) in {c["path"] for c in out["kept_not_ours"]}, out
    assert digests(mnt / name) == before

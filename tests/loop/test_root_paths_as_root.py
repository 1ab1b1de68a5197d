"""The folder hotcache works in, resolved as root: a group member who owns a folder on
the way to DEST (`/mnt/hot/team`) swaps it for a symlink to root's own data right after
hotcache's checks of the path, at the moment hotcache opens the path. Neither `copy`
nor `verify` follows that link: the victim's copy keeps its bytes and its metadata."""

from __future__ import annotations

import os

import pytest

from hotcache.provision.hotcopy import copier, verify
from hotcache.provision.system import beneath
from tests.loop.test_copy_as_root import shared, snapshot  # noqa: F401  (a fixture)
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


def swapped_on_open(monkeypatch, team, target, user):
    """The member's move, made at the first open_root after the path checks."""
    real = beneath.open_root

    def swap_then_open(path):
        if not team.is_symlink():
            team.rename(team.with_name("team.old"))
            team.symlink_to(target)
            os.lchown(team, user.pw_uid, user.pw_gid)
        return real(path)
    monkeypatch.setattr(beneath, "open_root", swap_then_open)


def test_dest_parent_swapped_for_a_link_stages_and_publishes_nowhere(shared, user,
                                                                       sandbox, monkeypatch):
    mnt, src, victim = shared
    (victim / "sub").mkdir()
    copier.copy(src, victim / "sub" / "ds", copier.CopyOptions())    # root's own copy
    before = snapshot(victim)
    team = mnt / "team"
    (team / "sub").mkdir(parents=True)
    os.chown(team, user.pw_uid, user.pw_gid)
    swapped_on_open(monkeypatch, team, victim, user)
    other = make_dataset(sandbox / "other", n=2)
    with pytest.raises(beneath.Untrusted, match=f"owned by uid {user.pw_uid}"):
        copier.copy(other, team / "sub" / "ds", copier.CopyOptions())
    assert snapshot(victim) == before


def test_verify_root_swapped_for_a_link_records_nothing_there(shared, user, monkeypatch):
    mnt, src, victim = shared
    copier.copy(src, victim / "ds", copier.CopyOptions())
    (mnt / "team").mkdir()
    team = mnt / "team"
    copier.copy(src, team / "ds", copier.CopyOptions(owner=user.pw_name))
    os.chown(team, user.pw_uid, user.pw_gid)
    before = snapshot(victim)
    swapped_on_open(monkeypatch, team, victim, user)
    with pytest.raises(beneath.Untrusted):
        verify.verify(team / "ds", "full")
    assert snapshot(victim) == before

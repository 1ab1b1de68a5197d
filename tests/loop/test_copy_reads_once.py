"""One `hotcache copy` reads DEST's metadata once, through the descriptor it holds on
DEST, and passes it down (the space advice, the --fit draw, the plan, the new version);
a refresh that publishes reads it once more, at the moment it is about to empty the old
tree: the folder's owner may have changed what it holds during the copy, so only a look
taken then can say it is still a hot copy. A real cache on a loop-backed XFS, the copy
run in this process with every open of the metadata file counted."""

from __future__ import annotations

import os
import traceback

import pytest

from hotcache.provision.hotcopy import copier
from hotcache.provision.hotcopy.copier import CopyOptions
from hotcache.provision.hotcopy.format import METADATA
from hotcache.provision.system import beneath
from tests.helpers import hotcache
from tests.loop.test_kube_loop import build
from tests.unit.hotcopy.test_copy import make_dataset

pytestmark = pytest.mark.root


def count_metadata_reads(monkeypatch) -> list[tuple[str, str]]:
    """(how, which function asked) for each open of a metadata file for reading: 'fd'
    beneath a held folder, 'path' by name."""
    reads: list[tuple[str, str]] = []

    def caller() -> str:
        frames = [f.name for f in traceback.extract_stack()[:-2]]
        return next(n for n in reversed(frames)
                    if n not in ("read_file", "read_regular", "metadata_at", "read_metadata",
                                 "_read_open", "open_at"))

    def reading(flags: int) -> bool:
        return flags & os.O_ACCMODE == os.O_RDONLY

    real_at, real_open = beneath.open_at, os.open

    def open_at(dirfd, rel, flags=os.O_RDONLY, *args, **kwargs):
        if os.path.basename(rel) == METADATA and reading(flags):
            reads.append(("fd", caller()))
        return real_at(dirfd, rel, flags, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if os.path.basename(os.fspath(path)) == METADATA and reading(flags):
            reads.append(("path", caller()))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(beneath, "open_at", open_at)
    monkeypatch.setattr(os, "open", os_open)
    return reads


def test_a_copy_reads_dests_metadata_once_through_its_descriptor(sandbox, monkeypatch):
    mp = build(sandbox)
    src = make_dataset(sandbox / "src", n=3)
    dest = mp / "ds"
    hotcache("copy", src, dest, "--name", "ds", check=True)
    reads = count_metadata_reads(monkeypatch)

    assert not copier.copy(src, dest, CopyOptions())["changed"]        # up to date
    assert reads == [("fd", "open")], reads                             # Place.open

    reads.clear()
    (src / "cat" / "new.jpg").write_bytes(b"x" * 4000)
    assert copier.copy(src, dest, CopyOptions(fit=True))["changed"]    # a refresh
    assert reads == [("fd", "open"), ("fd", "_publish")], reads

    reads.clear()
    assert copier.copy(src, mp / "new", CopyOptions())["changed"]      # nothing there yet
    assert reads == [], reads

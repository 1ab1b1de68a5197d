"""Which files a hot copy takes: the safe walk, globs, list files and the sample."""

from __future__ import annotations

import os

import pytest

from hotcache.provision.errors import UsageError
from hotcache.provision.hotcopy.selection import matches, read_list, select, walk


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for cls, n in (("cat", 40), ("dog", 10), ("owl", 1)):
        (root / cls).mkdir(parents=True)
        for i in range(n):
            (root / cls / f"{i:03}.jpg").write_bytes(bytes([i % 256]) * (i + 1))
    (root / "README").write_text("top level\n")
    return root


def rels(sel):
    return [e.rel for e in sel.entries]


def test_walk_takes_regular_files_and_inside_symlinks_only(src, tmp_path):
    outside = tmp_path / "secret"
    outside.write_text("not part of the dataset")
    (src / "leak").symlink_to(outside)
    (src / "alias.jpg").symlink_to("cat/001.jpg")
    (src / "dirlink").symlink_to(src / "dog")
    (src / "broken").symlink_to(src / "nowhere")
    os.mkfifo(src / "pipe")
    sel = walk(src)
    names = rels(sel)
    assert "alias.jpg" in names and "cat/001.jpg" in names
    assert not {"leak", "pipe", "broken"} & set(names)
    assert not any(n.startswith("dirlink/") for n in names)
    text = "\n".join(sel.warnings)
    assert "leak: symlink points out of the source" in text
    assert "pipe: not a regular file (FIFO)" in text
    assert "dirlink: symlink to a folder is not followed" in text
    assert "broken: broken symlink" in text


def test_globs_match_paths_and_names(src):
    assert matches("cat/001.jpg", "*.jpg") and matches("cat/001.jpg", "cat")
    assert matches("cat/001.jpg", "cat/*") and not matches("dog/001.jpg", "cat/*")
    sel = select(src, include=["cat/*", "owl"], exclude=["*5.jpg"])
    names = rels(sel)
    assert "owl/000.jpg" in names and "cat/004.jpg" in names
    assert "cat/005.jpg" not in names and not any(n.startswith("dog/") for n in names)
    assert "README" not in names


def test_list_file_takes_files_and_folders(src, tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("# validation subset\ncat/003.jpg\n\nowl/\n")
    assert rels(select(src, list_file=lst)) == ["cat/003.jpg", "owl/000.jpg"]


@pytest.mark.parametrize("line", ["../etc/passwd", "/etc/passwd", "cat/../../x"])
def test_list_entries_leaving_src_are_refused(tmp_path, line):
    lst = tmp_path / "list.txt"
    lst.write_text(f"cat/001.jpg\n{line}\n")
    with pytest.raises(UsageError, match="line 2") as err:
        read_list(lst)
    assert line in str(err.value)


def test_list_entries_that_do_not_exist_are_named(src, tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("cat/001.jpg\ncat/999.jpg\n")
    with pytest.raises(UsageError, match="cat/999.jpg"):
        select(src, list_file=lst)


def test_sample_is_stratified_and_deterministic(src):
    a = select(src, fraction=0.25, seed=7)
    assert a.entries == select(src, fraction=0.25, seed=7).entries
    by_class = {}
    for n in rels(a):
        by_class.setdefault(n.split("/")[0] if "/" in n else "", []).append(n)
    # each class keeps its share (rounded), and the smallest keeps at least one
    assert len(by_class["cat"]) == 10 and len(by_class["dog"]) == 2
    assert len(by_class["owl"]) == 1 and len(by_class[""]) == 1
    assert rels(select(src, fraction=0.25, seed=8)) != rels(a)


def test_sample_keeps_its_picks_when_files_are_added(src):
    before = set(rels(select(src, fraction=0.5, seed=1)))
    for i in range(40, 44):
        (src / "cat" / f"{i:03}.jpg").write_bytes(b"new")
    after = set(rels(select(src, fraction=0.5, seed=1)))
    # files are ranked by a hash of (seed, path): new files can only push out the
    # last-ranked few, never reshuffle the sample
    assert len(before - after) <= 2


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_bad_fraction_is_refused(src, fraction):
    with pytest.raises(UsageError, match="--fraction"):
        select(src, fraction=fraction)

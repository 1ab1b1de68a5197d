"""A copy's memory grows far slower than its file count: the selection and the digests
are spooled to unnamed files (only a byte a file of the plan stays in memory), the
manifest is written line by line and the work goes to the threads a window at a time.
Measured in bytes allocated (tracemalloc), never in time."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from hotcache.provision.hotcopy import copier, selection, verify
from hotcache.provision.hotcopy.selection import Entries, Entry, iter_walk, walk
from hotcache.provision.hotcopy.format import read_metadata

# Bytes per added file. The selection and the digests are spooled to unnamed files, so
# what a copy holds per file is a byte of its plan and what a refresh's manifest merge
# keeps (about 40); in memory arrays (paths, numbers, digests) it was about 150, and a
# Python object per file (the old way) over 1000.
PER_FILE_LIMIT = 60
VERIFY_PER_FILE_LIMIT = 200   # the old way (dicts and sets by path): about 500


def tiny_files(root: Path, n: int, folders: int = 50) -> Path:
    for i in range(n):
        folder = root / f"c{i % folders:03}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:07}.bin").write_bytes(i.to_bytes(4, "little"))
    return root


def copy_peak(src: Path, dest: Path) -> int:
    """The most memory Python held during the copy beyond what it held before."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = copier.copy(src, dest, copier.CopyOptions(jobs=1, space_check=False))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out["changed"] and out["files"] == sum(1 for _ in src.rglob("*.bin"))
    return peak - before


def refresh_peak(src: Path, dest: Path) -> int:
    """A refresh after one file changed: every other file is linked from the published
    copy, whose manifest is merged with the selection."""
    changed = next(src.rglob("*.bin"))
    changed.write_bytes(b"changed")
    peak = copy_peak(src, dest)
    assert read_metadata(dest)["version"] == "2"
    return peak


def verify_peak(dest: Path) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        report = verify.verify(dest, "full", jobs=1, record=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report["ok"] and report["hashed_files"] == report["files"], report
    return peak - before


def test_copy_and_verify_memory_grow_far_slower_than_the_file_count(tmp_path, monkeypatch):
    # A checkpoint every 256 files: the journal's pending lines stay bounded by that,
    # so what remains is what the copy keeps per file.
    monkeypatch.setattr(copier, "CHECKPOINT_FILES", 256)
    monkeypatch.setenv("HOTCACHE_STATE", str(tmp_path / "state" / "mappings.yaml"))
    copy_peak(tiny_files(tmp_path / "warm", 10), tmp_path / "warm-copy")  # imports, once
    n = 500
    small = copy_peak(tiny_files(tmp_path / "small", n), tmp_path / "small-copy")
    large = copy_peak(tiny_files(tmp_path / "large", 10 * n), tmp_path / "large-copy")
    per_file = (large - small) / (9 * n)
    assert per_file < PER_FILE_LIMIT, (small, large, per_file)
    small = refresh_peak(tmp_path / "small", tmp_path / "small-copy")
    large = refresh_peak(tmp_path / "large", tmp_path / "large-copy")
    per_file = (large - small) / (9 * n)
    assert per_file < PER_FILE_LIMIT, ("refresh", small, large, per_file)
    verify_peak(tmp_path / "warm-copy")
    small = verify_peak(tmp_path / "small-copy")
    large = verify_peak(tmp_path / "large-copy")
    per_file = (large - small) / (9 * n)
    assert per_file < VERIFY_PER_FILE_LIMIT, (small, large, per_file)


def test_verify_compares_in_path_order_and_takes_a_manifest_in_any_order(tmp_path):
    """A manifest written by hand in another order (sha256sum's) verifies alike; missing,
    extra and not-regular files are found by the merge of the two sorted streams."""
    src = tmp_path / "src"
    for rel in ("a/1", "a/2", "b/1", "c"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    dest = tmp_path / "dest"
    copier.copy(src, dest, copier.CopyOptions(space_check=False))
    sums = dest / "SHA256SUMS"
    sums.write_text("".join(reversed(sums.read_text().splitlines(keepends=True))))
    assert verify.verify(dest, "full", record=False)["ok"]
    (dest / "a" / "2").unlink()
    (dest / "a" / "0").write_text("extra")
    (dest / "b" / "1").unlink()
    (dest / "b" / "1").symlink_to("../c")
    for order in (reversed, list):
        lines = sorted(sums.read_text().splitlines(keepends=True))
        sums.write_text("".join(order(lines)))
        report = verify.verify(dest, "full", record=False)
        assert [(p["path"], p["problem"]) for p in report["problems"]][:3] == [
            ("a/2", "missing"), ("a/0", "not in the manifest"), ("b/1", "not a regular file")]
        assert report["hashed_files"] == 2 and not report["ok"]


def test_the_walk_yields_files_one_at_a_time_in_manifest_order(tmp_path):
    """The walk is a generator (nothing is listed ahead beyond one folder) and comes out
    sorted as path strings, the order the manifest is written in without sorting it."""
    src = tmp_path / "src"
    for rel in ("a.txt", "a/x", "a-b", "ab/y", "a/b/c", "a0", "z", "b/.hidden", "A"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    warnings: list[str] = []
    it = iter_walk(src, warnings)
    first = next(it)
    assert isinstance(first, Entry) and first.rel == "A"
    rels = [first.rel] + [e.rel for e in it]
    assert rels == sorted(rels) and len(rels) == 9 and not warnings
    dest = tmp_path / "dest"
    copier.copy(src, dest, copier.CopyOptions(space_check=False))
    listed = [line.split("  ", 1)[1] for line in (dest / "SHA256SUMS").read_text().splitlines()]
    assert listed == rels


def test_entries_hold_every_field_compactly(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"12345")
    (src / "caf\udce9".encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
     ).write_bytes(b"x")
    os.symlink("f", src / "alias")
    sel = walk(src)
    as_list = list(sel.entries)
    again = Entries(as_list)
    assert again == sel.entries and list(again) == as_list and again.bytes == 11
    alias = next(e for e in as_list if e.rel == "alias")
    assert alias.via_symlink and alias.target == "f" and alias.source == "f"
    assert sel.entries[-1] == as_list[-1] and sel.entries[0:2] == as_list[0:2]


@pytest.mark.parametrize("per", [1, 3, 4096])
def test_a_pass_over_entries_reads_what_indexing_reads(per, monkeypatch):
    """Iteration streams blocks of records (and their paths); across block boundaries,
    with symlinks, odd names and empty ones, it yields exactly what entries[i] gives."""
    monkeypatch.setattr(selection, "_STREAM_RECORDS", per)
    made = [Entry(f"d{i % 3}/f{i}" + ("\udcff" if i % 5 == 0 else ""), i * 7, 10**18 + i,
                  0o644, i % 4 == 1, 2049, 900 + i, f"t/{i}" if i % 4 == 1 else "")
            for i in range(11)]
    entries = Entries(made)
    assert list(entries) == made == [entries[i] for i in range(len(entries))]
    assert list(entries.rels()) == [e.rel for e in made]
    assert list(Entries()) == [] and list(Entries().rels()) == []


def test_the_image_folder_listing_is_compact_and_reads_as_paths(tmp_path):
    """The adapters' listing keeps a few bytes per file (a list of str would take over
    100), reads back exactly the paths os.walk gives, and survives pickling (a
    DataLoader worker started by spawn receives it)."""
    import pickle

    from hotcache.adapters.imagefolder import list_image_folder

    root = tmp_path / "data"
    n = 5000
    for i in range(n):
        folder = root / f"c{i % 20:02}" / ("sub" if i % 3 else "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06}.jpg").write_bytes(b"")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        paths, labels, classes = list_image_folder(root)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held / n < 80, held / n
    walked = sorted(os.path.join(d, f) for d, _s, files in os.walk(root) for f in files)
    assert sorted(paths) == walked and len(labels) == n and len(classes) == 20
    assert all(p.split("/")[-2 if "/sub/" not in p else -3] == classes[label]
               for p, label in zip(paths, labels))
    again = pickle.loads(pickle.dumps(paths))
    assert again == paths and again[-1] == paths[-1] == list(paths)[-1]


def test_a_spool_reads_back_what_was_written_and_leaves_no_name(tmp_path):
    """The spool is an unnamed 0600 file beneath the folder's descriptor: nothing appears
    in the folder (not even with a symlink planted there), and it reads and writes like
    the bytearray it replaces."""
    from hotcache.provision.hotcopy.spool import Spool

    (tmp_path / "planted").symlink_to("/etc/passwd")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        digests = Spool(32 * 3, fd)
        names = Spool(dir_fd=fd)
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["planted"]
    assert len(digests) == 96 and digests[0:96] == bytes(96)
    digests[32:64] = b"\xab" * 32
    assert digests[0:32] == bytes(32) and digests[32:64] == b"\xab" * 32
    for i in range(100_000):      # over the append buffer: part is written, part held
        names += b"%06d" % i
    assert len(names) == 600_000 and names[0:6] == b"000000"
    assert names[599_994:600_000] == b"099999" and names[300_000:300_006] == b"050000"
    assert os.stat(f"/proc/self/fd/{digests._fd}").st_mode & 0o777 == 0o600
    assert os.readlink(f"/proc/self/fd/{names._fd}").endswith("(deleted)")

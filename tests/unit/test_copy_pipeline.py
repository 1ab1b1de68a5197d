"""The large-file path of the copy: the kernel copies (sendfile) and a second thread hashes
the staging file's pages. Same bytes, same manifest line as the buffered path, on files
many chunks long, with sizes that end mid-chunk, with short sendfile returns, and with
each fallback (no sendfile, no mmap)."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import subprocess
from pathlib import Path

import pytest

from hotcache.provision.errors import HotcacheError
from hotcache.provision.hotcopy import copier, filecopy
from hotcache.provision.system import chunks


@pytest.fixture
def kernel_path(monkeypatch):
    """Every non-empty file takes the kernel path, in many small chunks; returns the list
    of (path taken) calls."""
    monkeypatch.setattr(filecopy, "KERNEL_COPY", 1)
    monkeypatch.setattr(filecopy, "KERNEL_CHUNK", 4096)
    monkeypatch.setattr(filecopy, "HASH_LAG", 2)
    calls = []
    for name in ("_pump_kernel", "_pump_buffered"):
        real = getattr(filecopy.FileCopier, name)
        monkeypatch.setattr(filecopy.FileCopier, name,
                            lambda self, *a, _r=real, _n=name: calls.append(_n) or _r(self, *a))
    return calls


def copy_one(tmp_path: Path, data: bytes) -> Path:
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    (src / "big.bin").write_bytes(data)
    (src / "other.bin").write_bytes(os.urandom(4096 * 3 + 7))
    dest = tmp_path / "dest"
    copier.copy(tmp_path / "src", dest, copier.CopyOptions())
    return dest


def assert_exact(dest: Path, data: bytes) -> None:
    assert (dest / "cls" / "big.bin").read_bytes() == data
    sums = (dest / "SHA256SUMS").read_text()
    assert f"{hashlib.sha256(data).hexdigest()}  cls/big.bin\n" in sums
    check = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=dest,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("size", [0, 1, 4096 * 5, 4096 * 7 + 123])
def test_kernel_copy_is_byte_exact_and_hashes_in_order(tmp_path, kernel_path, size):
    data = os.urandom(size)
    assert_exact(copy_one(tmp_path, data), data)
    # an empty big.bin is below the kernel path's threshold (1 byte here); the rest take it
    assert sorted(kernel_path) == (["_pump_kernel"] * 2 if size
                                   else ["_pump_buffered", "_pump_kernel"])


def test_short_sendfile_returns_hash_unaligned_ranges(tmp_path, kernel_path, monkeypatch):
    real = os.sendfile
    monkeypatch.setattr(filecopy.os, "sendfile",
                        lambda out, src, offset, count: real(out, src, offset, min(count, 1000)))
    data = os.urandom(4096 * 9 + 5)
    assert_exact(copy_one(tmp_path, data), data)
    assert kernel_path == ["_pump_kernel"] * 2


def test_without_sendfile_the_buffered_path_copies(tmp_path, kernel_path, monkeypatch):
    def unsupported(*a):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(filecopy.os, "sendfile", unsupported)
    data = os.urandom(4096 * 9 + 5)
    assert_exact(copy_one(tmp_path, data), data)
    assert kernel_path.count("_pump_buffered") == 2


@pytest.mark.parametrize("err", [errno.EIO, errno.EINVAL])
def test_a_sendfile_error_mid_file_fails_the_copy(tmp_path, kernel_path, monkeypatch, err):
    """Only a first call that cannot copy at all falls back to the buffered path: after
    that the staging file's offset has moved, and a fallback would copy the start twice.
    So a later error, a disk error (EIO) or not (EINVAL), fails the file, and nothing is
    published."""
    real = os.sendfile

    def fails_later(out, src, offset, count):
        if offset:
            raise OSError(err, os.strerror(err))
        return real(out, src, offset, count)

    monkeypatch.setattr(filecopy.os, "sendfile", fails_later)
    with pytest.raises(HotcacheError, match=rf"cls/big\.bin: {os.strerror(err)}"):
        copy_one(tmp_path, os.urandom(4096 * 9))
    assert "_pump_buffered" not in kernel_path
    assert not (tmp_path / "dest").exists()


def test_the_manifest_hashes_the_bytes_in_the_staging_file(tmp_path, kernel_path,
                                                          monkeypatch):
    """Hashed from the staging file, not from the source: a byte that differs in the
    staging file (as if written wrong) is in the manifest's hash."""
    real = os.sendfile

    def writes_wrong(out, src, offset, count):
        n = real(out, src, offset, count)
        os.pwrite(out, b"!", offset)
        return n

    monkeypatch.setattr(filecopy.os, "sendfile", writes_wrong)
    data = os.urandom(4096 * 9)
    dest = copy_one(tmp_path, data)
    written = (dest / "cls" / "big.bin").read_bytes()
    assert written != data
    assert_exact(dest, written)


def test_writeback_starts_only_for_hashed_ranges(tmp_path, kernel_path, monkeypatch):
    """Until hashed, a range stays dirty in memory, so its mapping never reads the disk."""
    monkeypatch.setattr(filecopy, "WRITE_BEHIND", 4096 * 2)
    hashed: dict[int, int] = {}
    events = []
    real_hash = filecopy.hash_range

    def hash_range(h, fd, offset, n):
        real_hash(h, fd, offset, n)
        hashed[fd] = max(hashed.get(fd, 0), offset + n)

    def start_writeback(fd, offset, n):
        events.append((offset + n, hashed.get(fd, 0)))

    monkeypatch.setattr(filecopy, "hash_range", hash_range)
    monkeypatch.setattr(filecopy.fsops, "start_writeback", start_writeback)
    data = os.urandom(4096 * 9)
    assert_exact(copy_one(tmp_path, data), data)
    assert len(events) >= 4
    assert all(end <= done for end, done in events), events


def test_bwlimit_is_charged_the_bytes_copied(tmp_path, kernel_path, monkeypatch):
    taken = []
    monkeypatch.setattr(filecopy.Limiter, "take", lambda self, n: taken.append(n))
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    data = os.urandom((3 << 20) + 5)                  # 4 sendfile calls of at most 1 MiB
    (src / "big.bin").write_bytes(data)
    dest = tmp_path / "dest"
    copier.copy(tmp_path / "src", dest, copier.CopyOptions(bwlimit=1 << 30))
    assert (dest / "cls" / "big.bin").read_bytes() == data
    assert kernel_path == ["_pump_kernel"]
    assert sum(taken) == len(data) and max(taken) <= 1 << 20 and len(taken) == 4


def test_without_mmap_the_hash_reads_the_staging_file(tmp_path, kernel_path, monkeypatch):
    def unmappable(*a, **kw):
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(chunks.mmap, "mmap", unmappable)
    reads = []
    real = chunks._hash_pread
    monkeypatch.setattr(chunks, "_hash_pread", lambda *a: reads.append(a[2:]) or real(*a))
    data = os.urandom(4096 * 9 + 5)
    assert_exact(copy_one(tmp_path, data), data)
    assert kernel_path == ["_pump_kernel"] * 2
    assert sum(n for _, n in reads) == len(data) + 4096 * 3 + 7   # every byte, by pread


def test_hash_range_hashes_any_range_of_a_file(tmp_path):
    """hash_range reads the range it is given, at any offset, from the file itself."""
    f = tmp_path / "f"
    data = os.urandom(mmap.PAGESIZE * 3 + 17)
    f.write_bytes(data)
    fd = os.open(f, os.O_RDONLY)
    try:
        for offset, n in [(0, len(data)), (1, 5000), (mmap.PAGESIZE, 17), (len(data) - 3, 3)]:
            h = hashlib.sha256()
            chunks.hash_range(h, fd, offset, n)
            assert h.hexdigest() == hashlib.sha256(data[offset:offset + n]).hexdigest()
    finally:
        os.close(fd)


def test_a_source_changed_during_the_kernel_copy_is_copied_again(tmp_path, kernel_path,
                                                                   monkeypatch):
    src_file = tmp_path / "src" / "cls" / "big.bin"
    real = os.sendfile
    grown = []

    def writer_meanwhile(out, src, offset, count):
        if offset and not grown:           # someone appends in the middle of the copy
            grown.append(1)
            with open(src_file, "ab") as f:
                f.write(b"late")
        return real(out, src, offset, count)

    monkeypatch.setattr(filecopy.os, "sendfile", writer_meanwhile)
    data = os.urandom(4096 * 9)
    dest = copy_one(tmp_path, data)
    assert grown
    assert_exact(dest, data + b"late")


def test_a_source_that_keeps_changing_is_refused(tmp_path, kernel_path, monkeypatch):
    src_file = tmp_path / "src" / "cls" / "big.bin"
    real = os.sendfile

    def always_writing(out, src, offset, count):
        if offset:
            with open(src_file, "ab") as f:
                f.write(b"x")
        return real(out, src, offset, count)

    monkeypatch.setattr(filecopy.os, "sendfile", always_writing)
    with pytest.raises(HotcacheError, match="kept changing"):
        copy_one(tmp_path, os.urandom(4096 * 9))
    assert not (tmp_path / "dest").exists()


def test_a_hash_failure_in_the_hasher_thread_fails_the_file(tmp_path, kernel_path,
                                                            monkeypatch):
    class Boom:
        def update(self, data):
            raise MemoryError("hash failed")

        def hexdigest(self):
            return "0" * 64

    monkeypatch.setattr(filecopy.hashlib, "sha256", Boom)
    with pytest.raises(MemoryError, match="hash failed"):
        copy_one(tmp_path, os.urandom(4096 * 9))
    assert not Path(tmp_path / "dest").exists()


def _run_python(code: str) -> str:
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stderr == ""
    return out.stdout.strip()


def test_the_copy_engine_starts_without_the_mappings_models():
    """The mapping's pydantic models and yaml take 0.1-0.2 s to import with a cold page
    cache: importing the copy engine must not pull them in before any data moves."""
    code = ("import sys, hotcache.provision.hotcopy.copier; print([m for m in "
            "('hotcache.provision.mapping', 'hotcache.provision.records', 'yaml') "
            "if m in sys.modules])")
    assert _run_python(code) == "[]"


def test_preload_imports_in_the_background_and_leaves_failures_to_the_command():
    code = ("import sys, threading; from hotcache.provision.cli.common import preload; "
            "assert 'colorsys' not in sys.modules; "
            "preload('hotcache_no_such_module', 'colorsys'); "
            "[t.join() for t in threading.enumerate() if t.name == 'preload']; "
            "print('colorsys' in sys.modules)")
    assert _run_python(code) == "True"

"""The copy of one file (hotcopy/filecopy.py): every size the same path, read into a
reused buffer, hashed, written. Byte-exact and hashed in order on files many chunks long
(1 MiB chunks shrunk to 4 KiB here), with sizes that end mid-chunk, with short reads and
short writes; errors name the file and publish nothing; the rate limit and writeback see
every chunk; a source that changes is copied again or refused."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hotcache.provision.errors import HotcacheError
from hotcache.provision.hotcopy import copier, filecopy
from hotcache.provision.hotcopy.selection import Entry
from hotcache.provision.system import chunks

SMALL_CHUNK = 4096


@pytest.fixture
def small_chunks(monkeypatch):
    """Buffers of 4 KiB, so that a file of a few KiB is many chunks long."""
    monkeypatch.setattr(chunks, "CHUNK", SMALL_CHUNK)


def copy_one(tmp_path: Path, data: bytes, **opts) -> Path:
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    (src / "big.bin").write_bytes(data)
    (src / "other.bin").write_bytes(os.urandom(SMALL_CHUNK * 3 + 7))
    dest = tmp_path / "dest"
    copier.copy(tmp_path / "src", dest, copier.CopyOptions(**opts))
    return dest


def assert_exact(dest: Path, data: bytes) -> None:
    assert (dest / "cls" / "big.bin").read_bytes() == data
    sums = (dest / "SHA256SUMS").read_text()
    assert f"{hashlib.sha256(data).hexdigest()}  cls/big.bin\n" in sums
    check = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=dest,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("size", [0, 1, SMALL_CHUNK * 5, SMALL_CHUNK * 7 + 123])
def test_the_copy_is_byte_exact_and_hashes_in_order(tmp_path, small_chunks, size):
    data = os.urandom(size)
    assert_exact(copy_one(tmp_path, data), data)


def test_short_reads_and_short_writes_lose_nothing(tmp_path, small_chunks, monkeypatch):
    real_readv, real_write = os.readv, os.write

    def short_readv(fd, buffers):
        return real_readv(fd, [buffers[0][:1000]])

    monkeypatch.setattr(filecopy.os, "readv", short_readv)
    monkeypatch.setattr(filecopy.os, "write", lambda fd, data: real_write(fd, data[:777]))
    data = os.urandom(SMALL_CHUNK * 9 + 5)
    assert_exact(copy_one(tmp_path, data), data)


@pytest.mark.parametrize("call", ["readv", "write"])
def test_an_error_mid_file_names_the_file_and_publishes_nothing(tmp_path, small_chunks,
                                                                 monkeypatch, call):
    real = getattr(os, call)
    seen = []

    def fails_later(fd, data):
        seen.append(fd)
        if len(seen) > 3 and os.fstat(fd).st_size > SMALL_CHUNK * 4:   # big.bin, mid-file
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, data)

    monkeypatch.setattr(filecopy.os, call, fails_later)
    with pytest.raises(HotcacheError, match=rf"cls/big\.bin: {os.strerror(errno.EIO)}"):
        copy_one(tmp_path, os.urandom(SMALL_CHUNK * 9))
    assert not (tmp_path / "dest").exists()


def test_writeback_starts_behind_the_copy_for_every_range(tmp_path, small_chunks,
                                                          monkeypatch):
    monkeypatch.setattr(filecopy, "WRITE_BEHIND", SMALL_CHUNK * 2)
    ranges = []
    monkeypatch.setattr(filecopy.fsops, "start_writeback",
                        lambda fd, offset, n: ranges.append(
                            (os.readlink(f"/proc/self/fd/{fd}"), offset, n)))
    data = os.urandom(SMALL_CHUNK * 9)
    assert_exact(copy_one(tmp_path, data), data)
    big = [(offset, n) for path, offset, n in ranges if path.endswith("big.bin")]
    assert big == [(i * SMALL_CHUNK * 2, SMALL_CHUNK * 2) for i in range(4)]


def test_bwlimit_is_charged_each_chunk_as_it_is_read(tmp_path, monkeypatch):
    taken = []
    monkeypatch.setattr(filecopy.Limiter, "take", lambda self, n: taken.append(n))
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    data = os.urandom((3 << 20) + 5)                  # 4 reads of at most 1 MiB
    (src / "big.bin").write_bytes(data)
    dest = tmp_path / "dest"
    copier.copy(tmp_path / "src", dest, copier.CopyOptions(bwlimit=1 << 30))
    assert (dest / "cls" / "big.bin").read_bytes() == data
    assert sum(taken) == len(data) and max(taken) <= 1 << 20 and len(taken) == 4


def test_a_source_changed_during_the_copy_is_copied_again(tmp_path, small_chunks,
                                                           monkeypatch):
    src_file = tmp_path / "src" / "cls" / "big.bin"
    real = os.readv
    grown = []

    def writer_meanwhile(fd, buffers):
        if os.lseek(fd, 0, os.SEEK_CUR) and not grown and src_file.exists() and \
                os.fstat(fd).st_ino == src_file.stat().st_ino:
            grown.append(1)                # someone appends in the middle of the copy
            with open(src_file, "ab") as f:
                f.write(b"late")
        return real(fd, buffers)

    monkeypatch.setattr(filecopy.os, "readv", writer_meanwhile)
    data = os.urandom(SMALL_CHUNK * 9)
    dest = copy_one(tmp_path, data)
    assert grown
    assert_exact(dest, data + b"late")


def test_a_source_that_keeps_changing_is_refused(tmp_path, small_chunks, monkeypatch):
    src_file = tmp_path / "src" / "cls" / "big.bin"
    real = os.readv

    def always_writing(fd, buffers):
        if os.lseek(fd, 0, os.SEEK_CUR) and src_file.exists() and \
                os.fstat(fd).st_ino == src_file.stat().st_ino:
            with open(src_file, "ab") as f:
                f.write(b"x")
        return real(fd, buffers)

    monkeypatch.setattr(filecopy.os, "readv", always_writing)
    with pytest.raises(HotcacheError, match="kept changing"):
        copy_one(tmp_path, os.urandom(SMALL_CHUNK * 9))
    assert not (tmp_path / "dest").exists()


def test_a_stop_ends_the_copy_within_a_chunk(tmp_path, small_chunks, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(os.urandom(SMALL_CHUNK * 9))
    (tmp_path / "staging").mkdir()
    src_fd = os.open(tmp_path / "src", os.O_RDONLY | os.O_DIRECTORY)
    staging_fd = os.open(tmp_path / "staging", os.O_RDONLY | os.O_DIRECTORY)
    worker = filecopy.FileCopier(tmp_path / "src", src_fd, staging_fd)
    real, reads = os.readv, []

    def readv(fd, buffers):
        reads.append(fd)
        if len(reads) == 3:
            worker.stop.set()              # Ctrl-C, or another file failed
        return real(fd, buffers)

    monkeypatch.setattr(filecopy.os, "readv", readv)
    st = (tmp_path / "src" / "big.bin").stat()
    try:
        with pytest.raises(InterruptedError):
            worker.copy(Entry("big.bin", st.st_size, st.st_mtime_ns, 0o644))
    finally:
        os.close(src_fd)
        os.close(staging_fd)
    assert len(reads) == 3


def _run_python(code: str, *path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))} if path else None
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stderr == ""
    return out.stdout.strip()


def test_the_copy_starts_without_the_mappings_models():
    """The mapping's pydantic models and yaml take 0.1-0.2 s to import with a cold page
    cache: neither the CLI nor the copy engine may pull them in before any data moves
    (cli/common.preload loads them meanwhile)."""
    code = ("import sys, hotcache.provision.cli.app, hotcache.provision.cli.copies, "
            "hotcache.provision.hotcopy.copier; print([m for m in "
            "('hotcache.provision.mapping', 'hotcache.provision.records', 'yaml') "
            "if m in sys.modules])")
    assert _run_python(code) == "[]"


def test_preload_imports_in_the_background_and_leaves_failures_to_the_command(tmp_path):
    """It returns at once (the import runs in a thread of its own that the interpreter
    waits for), imports what it can, and a module that fails, for any reason, prints
    nothing: the command's own import reports it."""
    (tmp_path / "hc_broken_module.py").write_text("raise RuntimeError('broken')\n")
    (tmp_path / "hc_slow_module.py").write_text("import time\ntime.sleep(0.5)\n")
    code = ("import sys, threading; from hotcache.provision.cli.common import preload; "
            "preload('hc_no_such_module', 'hc_broken_module', 'hc_slow_module', 'colorsys'); "
            "t, = [t for t in threading.enumerate() if t.name == 'preload']; "
            "print('colorsys' in sys.modules, t.daemon, end=' '); t.join(); "
            "print('colorsys' in sys.modules)")
    assert _run_python(code, tmp_path) == "False False True"

"""The large-file path of the copy: reading+writing and hashing in two threads. Same
bytes, same manifest line as the one-thread path, on files many buffers long, with sizes
that end mid-buffer."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from hotcache.provision.hotcopy import copier, filecopy


@pytest.mark.parametrize("size", [0, 1, 4096 * 5, 4096 * 7 + 123])
def test_pipelined_copy_is_byte_exact_and_hashes_in_order(tmp_path, monkeypatch, size):
    monkeypatch.setattr(filecopy, "PIPELINE", 1)        # every non-empty file pipelined
    monkeypatch.setattr(filecopy, "PIPE_CHUNK", 4096)   # many buffers per file
    monkeypatch.setattr(filecopy, "RING", 2)            # buffers reused many times over
    calls = []
    real = filecopy.FileCopier._pump_pipelined
    monkeypatch.setattr(filecopy.FileCopier, "_pump_pipelined",
                        lambda self, *a: calls.append(1) or real(self, *a))
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    data = os.urandom(size)
    (src / "big.bin").write_bytes(data)
    (src / "other.bin").write_bytes(os.urandom(4096 * 3 + 7))
    dest = tmp_path / "dest"
    copier.copy(tmp_path / "src", dest, copier.CopyOptions())
    assert (dest / "cls" / "big.bin").read_bytes() == data
    sums = (dest / "SHA256SUMS").read_text()
    assert f"{hashlib.sha256(data).hexdigest()}  cls/big.bin\n" in sums
    assert len(calls) == (2 if size else 1)           # the empty file never reads
    check = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=dest,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_hash_failure_in_the_hasher_thread_fails_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(filecopy, "PIPELINE", 1)
    monkeypatch.setattr(filecopy, "PIPE_CHUNK", 4096)

    class Boom:
        def update(self, data):
            raise MemoryError("hash failed")

        def hexdigest(self):
            return "0" * 64

    monkeypatch.setattr(filecopy.hashlib, "sha256", Boom)
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    (src / "big.bin").write_bytes(os.urandom(4096 * 9))
    with pytest.raises(MemoryError, match="hash failed"):
        copier.copy(tmp_path / "src", tmp_path / "dest", copier.CopyOptions())
    assert not Path(tmp_path / "dest").exists()

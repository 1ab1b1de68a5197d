"""The spool behaves as the bytearray it stands in for: appends, spans read back, spans
overwritten, in any order; a read after a write never returns the older bytes."""

from __future__ import annotations

import os
import random

import pytest

from hotcache.provision.hotcopy import spool as spool_module
from hotcache.provision.hotcopy.spool import Spool


@pytest.mark.parametrize("seed", range(5))
def test_a_spool_reads_back_exactly_what_a_bytearray_holds(seed, tmp_path, monkeypatch):
    monkeypatch.setattr(spool_module, "_FLUSH", 300)      # flush often, cross windows
    monkeypatch.setattr(spool_module, "_WINDOW", 128)
    rng = random.Random(seed)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        s, model = Spool(64, fd), bytearray(64)
        for _ in range(3000):
            op = rng.random()
            if op < 0.3:
                data = rng.randbytes(rng.randrange(1, 60))
                s += data
                model += data
            elif op < 0.5 and model:
                a = rng.randrange(len(model))
                b = min(len(model), a + rng.randrange(1, 40))
                data = rng.randbytes(b - a)
                s[a:b] = data
                model[a:b] = data
            elif model:
                a = rng.randrange(len(model))
                b = min(len(model), a + rng.randrange(0, 200))
                assert s[a:b] == bytes(model[a:b])
            assert len(s) == len(model)
        assert s[0:len(model)] == bytes(model)
    finally:
        os.close(fd)


def test_a_write_into_the_span_just_read_is_seen_by_the_next_read(tmp_path):
    s = Spool(1000)
    assert s[10:20] == bytes(10)                 # fills the read window
    s[15:17] = b"ab"
    assert s[10:20] == bytes(5) + b"ab" + bytes(3)


def test_a_batch_of_digests_lands_at_each_files_place(tmp_path):
    """The copy stores a finished batch's digests one write per run of consecutive files;
    files that an earlier run finished (not in the batch) keep the digests already
    there."""
    from hotcache.provision.hotcopy.copier import DIGEST, _store_digests

    n = 12
    known = bytes(range(DIGEST)) * n
    spool, model = Spool(DIGEST * n, None), bytearray(known)
    spool[0:DIGEST * n] = known
    finished = []
    for i in (0, 1, 2, 5, 6, 9, 11):   # 3, 4, 7, 8, 10: resumed, not in the batch
        digest = bytes([i]) * DIGEST
        model[i * DIGEST:(i + 1) * DIGEST] = digest
        finished.append((i, (f"f{i}", 1, 1, digest.hex())))
    _store_digests(spool, finished)
    assert spool[0:DIGEST * n] == bytes(model)


@pytest.mark.parametrize("per", [1, 3, 2048])
def test_the_manifest_pairs_read_each_files_digest_across_blocks(per, monkeypatch):
    from hotcache.provision.hotcopy import copier
    from hotcache.provision.hotcopy.selection import Entries, Entry

    monkeypatch.setattr(copier, "_DIGESTS_READ", per)
    n = 10
    entries = Entries(Entry(f"f{i:02d}", i, 1, 0o644) for i in range(n))
    digests = Spool(copier.DIGEST * n, None)
    for i in range(n):
        digests[i * copier.DIGEST:(i + 1) * copier.DIGEST] = bytes([i]) * copier.DIGEST
    assert list(copier._pairs(entries, digests)) == [
        (f"f{i:02d}", (bytes([i]) * copier.DIGEST).hex()) for i in range(n)]

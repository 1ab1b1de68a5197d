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

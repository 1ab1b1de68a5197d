"""One module per idea that used to be written twice or three times: the size grammar
(spec sizes, --budget, --bwlimit), owners (the spec, apply, copy --owner), chunked reads
(copy, verify, warm) and the adapters' own errors."""

from __future__ import annotations

import hashlib
import os

import pytest

from hotcache.provision import errors as provision_errors
from hotcache.provision.engine import spec
from hotcache.provision.errors import ExitCode, HotcacheError, UsageError
from hotcache.provision.hotcopy import copier, sizing
from hotcache.provision.system import chunks, sizes, users

GOOD = {"300": 300, "1k": 1024, "512M": 512 << 20, "512MiB": 512 << 20, "2GB": 2 << 30,
        " 1.5 T ": int(1.5 * (1 << 40)), "1p": 1 << 50, "50mi": 50 << 20}
BAD = ["", "0", "0M", "-1", "2X", "M", "1e6", "1.5.2G", "two"]


def size_readers():
    """Every place hotcache reads a size from a person, as (name, parse)."""
    return [("sizes", sizes.parse_size), ("spec", spec.spec_size),
            ("--budget", sizing.budget_size), ("--bwlimit", copier.parse_rate)]


@pytest.mark.parametrize("text", GOOD)
def test_every_reader_reads_a_size_alike(text):
    assert {name: parse(text) for name, parse in size_readers()} == \
        {name: GOOD[text] for name, _ in size_readers()}


@pytest.mark.parametrize("text", BAD)
def test_every_reader_refuses_a_bad_size(text):
    for name, parse in size_readers():
        with pytest.raises((ValueError, UsageError)):
            parse(text)
        if name in ("--budget", "--bwlimit"):
            with pytest.raises(UsageError, match=name):
                parse(text)


def test_owners_read_alike_by_spec_and_copy():
    assert users.parse_owner("root:root") == users.Owner(0, 0, True, ())
    assert users.parse_owner("0") == users.Owner(0, None, False, ())
    assert copier.parse_owner("root") == (0, 0)         # no group: the user's own
    assert copier.parse_owner("0:0") == (0, 0)
    missing = users.parse_owner("no-such-user-x:no-such-group-x").missing
    assert missing == ("user 'no-such-user-x'", "group 'no-such-group-x'")
    assert spec._check_owner("at", "no-such-user-x:no-such-group-x") == [
        "at: user 'no-such-user-x' does not exist on this host",
        "at: group 'no-such-group-x' does not exist on this host"]
    assert spec._check_owner("at", "root:root") == []
    for bad in ("no-such-user-x", "root:no-such-group-x"):
        with pytest.raises(UsageError, match="no such user or group"):
            copier.parse_owner(bad)


@pytest.mark.parametrize("size", [0, 1, chunks.CHUNK - 1, chunks.CHUNK, 3 * chunks.CHUNK + 5])
def test_chunked_reads_see_every_byte(tmp_path, size):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    buf = memoryview(bytearray(chunks.CHUNK))
    seen = []
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert chunks.sha256_of(fd, buf, seen.append) == hashlib.sha256(data).hexdigest()
        os.lseek(fd, 0, os.SEEK_SET)
        assert b"".join(bytes(c) for c in chunks.chunks(fd, buf)) == data
    finally:
        os.close(fd)
    assert sum(seen) == size and all(n <= chunks.CHUNK for n in seen)


def test_the_adapters_have_their_own_errors():
    from hotcache.adapters import errors

    for name in ("DataRootError", "CacheLockedError"):
        assert not hasattr(provision_errors, name)
        assert issubclass(getattr(errors, name), HotcacheError)
    assert errors.DataRootError.exit_code == ExitCode.BAD_INPUT
    assert errors.CacheLockedError.exit_code == ExitCode.REFUSED

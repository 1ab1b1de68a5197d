"""Reads that ride out a cache's fail-over (adapters/retry.py): an EIO is retried for a
bounded time and logged with the file and the errno; anything else is raised at once;
the loaders' reads go through it (EIO injected by a wrapper around open)."""

from __future__ import annotations

import builtins
import errno
import hashlib
import logging

import pytest

from hotcache.adapters import retry
from hotcache.adapters.decode import decode_array

from .helpers import make_jpegs


class Clock:
    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, err: int = errno.EIO):
    """A read that fails `times` times with `err`, then returns b"ok"."""
    left = [times]

    def read() -> bytes:
        if left[0]:
            left[0] -= 1
            raise OSError(err, "simulated")
        return b"ok"
    return read


def test_eio_is_retried_and_each_retry_logged(caplog):
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="hotcache.adapters"):
        got = retry.retrying(failing(3), "/data/a.jpg", 10, sleep=clock.sleep, clock=clock)
    assert got == b"ok" and clock.slept == [0.05, 0.1, 0.2]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith(f"read of /data/a.jpg failed with EIO (errno {errno.EIO}); "
                               "retry 1 in 0.05 s (gives up after 10 s: HOTCACHE_EIO_RETRY_S)")


def test_when_the_time_is_up_the_error_names_the_file():
    clock = Clock()
    with pytest.raises(OSError) as err:
        retry.retrying(failing(10**6), "/data/a.jpg", 5, sleep=clock.sleep, clock=clock)
    assert err.value.errno == errno.EIO and err.value.filename == "/data/a.jpg"
    assert "still failing after" in str(err.value) and clock.now == pytest.approx(5)
    assert max(clock.slept) == retry.LONGEST_WAIT


def test_other_errors_are_raised_at_once():
    clock = Clock()
    with pytest.raises(FileNotFoundError):
        retry.retrying(failing(1, errno.ENOENT), "/data/a.jpg", 10, sleep=clock.sleep,
                       clock=clock)
    assert clock.slept == []


def test_the_bound_comes_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv(retry.ENV, "0")
    with pytest.raises(OSError) as err:
        retry.retrying(failing(1), "/data/a.jpg")
    assert err.value.filename == "/data/a.jpg"          # no retry at all
    monkeypatch.setenv(retry.ENV, "soon")
    with caplog.at_level(logging.WARNING, logger="hotcache.adapters"):
        assert retry.retry_seconds() == retry.DEFAULT_SECONDS
    assert "HOTCACHE_EIO_RETRY_S='soon' is not a number of seconds" in caplog.text


@pytest.fixture
def flaky_open(monkeypatch):
    """open() in adapters/retry.py fails with EIO the first two times per file, as reads
    through a failing cache do until it is switched to its origin."""
    fails: dict[str, int] = {}

    def opener(path, *args, **kwargs):
        key = str(path)
        fails[key] = fails.get(key, 0) + 1
        if fails[key] <= 2:
            raise OSError(errno.EIO, "Input/output error", key)
        return builtins.open(path, *args, **kwargs)
    monkeypatch.setattr(retry, "open", opener, raising=False)
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)
    return fails


def test_decoding_a_file_rides_out_eio(tmp_path, flaky_open):
    made = make_jpegs(tmp_path, per_class=1)
    path = tmp_path / made[0][0]
    img = decode_array(path, (8, 8))
    assert img.shape == (8, 8, 3) and flaky_open[str(path)] == 3


def test_the_torch_dataset_reads_bytes_through_the_retry(tmp_path, flaky_open):
    pytest.importorskip("torch")
    from hotcache.adapters.pytorch import ImageFolderDataset

    make_jpegs(tmp_path, per_class=2)
    ds = ImageFolderDataset(tmp_path, decode=False, transform=lambda data: data)
    for i in range(len(ds)):
        data, _ = ds[i]
        with builtins.open(ds.paths[i], "rb") as f:
            assert hashlib.sha256(data).digest() == hashlib.sha256(f.read()).digest()
        assert flaky_open[ds.paths[i]] == 3


def test_the_tf_dataset_reads_bytes_through_the_retry(tmp_path, flaky_open, monkeypatch):
    """make_dataset's reads ride out EIO too, and hand TensorFlow every byte (a file
    ending in NUL bytes included); with the retries off it reads as TensorFlow does."""
    pytest.importorskip("tensorflow")
    from hotcache.adapters.tfdata import make_dataset

    make_jpegs(tmp_path, per_class=2)
    padded = tmp_path / "cat" / "zz.jpg"
    padded.write_bytes(b"\xff\xd8data\x00\x00\x00")

    def read_all() -> dict[str, bytes]:
        ds = make_dataset(tmp_path, decode=False, shuffle=False, batch_size=1)
        return {path: data.numpy() for path, (data, _label) in zip(ds.file_paths, ds.unbatch())}

    got = read_all()
    assert str(padded) in got
    for path, data in got.items():
        with builtins.open(path, "rb") as f:
            assert data == f.read(), path
        assert flaky_open[path] == 3, path
    monkeypatch.setenv(retry.ENV, "0")
    assert read_all() == got
    assert all(n == 3 for n in flaky_open.values())     # TensorFlow read them itself


def test_a_tf_read_that_keeps_failing_names_the_file(tmp_path, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    from hotcache.adapters.tfdata import make_dataset

    make_jpegs(tmp_path, per_class=1)
    monkeypatch.setenv(retry.ENV, "0.2")

    def broken(path, *args, **kwargs):
        raise OSError(errno.EIO, "simulated", str(path))
    monkeypatch.setattr(retry, "open", broken, raising=False)
    ds = make_dataset(tmp_path, decode=False, shuffle=False, batch_size=1)
    with pytest.raises(tf.errors.UnknownError) as err:
        next(iter(ds))
    assert ds.file_paths[0] in str(err.value) and "still failing after" in str(err.value)


def test_a_loader_of_ones_own_reads_through_the_package(tmp_path, flaky_open):
    from hotcache.adapters import read_bytes

    (tmp_path / "f").write_bytes(b"data\x00")
    assert read_bytes(tmp_path / "f") == b"data\x00" and flaky_open[str(tmp_path / "f")] == 3

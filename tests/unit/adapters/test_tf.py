"""tf.data: image folders and TFRecords under DATA_ROOT, the keyed SSD cache and its
lockfile, and Keras fit with the data-wait callback. Real TensorFlow, small data: one
module so TensorFlow is imported once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

tf = pytest.importorskip("tensorflow")

from hotcache.adapters import DataWaitCallback, make_dataset, timed  # noqa: E402
from hotcache.adapters.errors import CacheLockedError  # noqa: E402

from .helpers import make_jpegs, make_tfrecords, write_hot_copy  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("tf")
    made = make_jpegs(base / "src", per_class=4)
    make_tfrecords(base / "records", base / "src")
    return base, made


def dominant(images):
    return images[:, 0, 0, :].numpy().argmax(axis=-1).tolist()


@pytest.mark.parametrize("folder", ["src", "records"])
def test_right_samples_and_labels(data, folder, monkeypatch):
    base, made = data
    monkeypatch.setenv("DATA_ROOT", str(base / folder))
    ds = make_dataset(batch_size=5, image_size=(8, 8), seed=1)
    labels = []
    for images, batch_labels in timed(ds, log_every=0):
        assert images.dtype == tf.uint8 and images.shape[1:] == (8, 8, 3)
        assert dominant(images) == batch_labels.numpy().tolist()
        labels += batch_labels.numpy().tolist()
    assert sorted(labels) == sorted(label for _, label in made)


def cache_folders(cache):
    return sorted(p.name for p in cache.iterdir())


def samples(ds) -> list[tuple[tuple, int, int]]:
    """(image shape, brightest value, label) of every sample, in a stable order."""
    out = []
    for images, labels in ds:
        for img, label in zip(images.numpy(), labels.numpy().tolist()):
            out.append((img.shape, int(img.max()), label))
    return sorted(out)


def test_cache_is_reused_and_keyed_by_version_and_settings(data, tmp_path):
    base, made = data
    cache = tmp_path / "cache"
    hot = write_hot_copy(base / "src", tmp_path / "hot-v1", version="1")
    first = samples(make_dataset(hot, batch_size=4, image_size=(8, 8), cache_dir=cache))
    assert len(first) == len(made) and {s[0] for s in first} == {(8, 8, 3)}
    (key,) = cache_folders(cache)
    assert key.startswith("hot-v1-1-") and list((cache / key).glob("cache*.index"))
    # Each variant gets its own cache and is computed afresh, not served from another's.
    smaller = samples(make_dataset(hot, batch_size=4, image_size=(6, 6), cache_dir=cache))
    assert {s[0] for s in smaller} == {(6, 6, 3)}                        # pipeline changed
    halved = samples(make_dataset(hot, batch_size=4, image_size=(8, 8), cache_dir=cache,
                                  map_fn=lambda x, y: (x // 2, y)))       # map changed
    assert sorted((sh, v // 2, y) for sh, v, y in first) == halved
    hot2 = write_hot_copy(base / "src", tmp_path / "hot-v2", version="2")
    assert samples(make_dataset(hot2, batch_size=4, image_size=(8, 8), cache_dir=cache)) == first
    assert len(cache_folders(cache)) == 4
    # Reuse: with every image of v1 now unreadable (same sizes, same version), the same
    # settings still deliver every sample: they come from the cache, not the files.
    for path in hot.rglob("*.jpg"):
        path.write_bytes(b"\0" * path.stat().st_size)
    assert samples(make_dataset(hot, batch_size=4, image_size=(8, 8), cache_dir=cache)) == first
    assert len(cache_folders(cache)) == 4
    with pytest.raises(tf.errors.InvalidArgumentError):      # and the files really are bad
        samples(make_dataset(hot, batch_size=4, image_size=(8, 8)))


CRASH = textwrap.dedent("""
    import os, sys
    from hotcache.adapters import make_dataset
    ds = make_dataset(sys.argv[1], batch_size=1, image_size=(8, 8), shuffle=False,
                      cache_dir=sys.argv[2])
    it = iter(ds)
    next(it)
    next(it)
    os._exit(9)            # killed half-way through writing the cache
""")


def test_lock_left_by_a_crashed_run_is_cleaned(data, tmp_path):
    base, made = data
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", CRASH, str(base / "src"), str(cache)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-2000:]
    (key,) = cache.iterdir()
    assert list(key.glob("cache_*.lockfile")), "TensorFlow left no lockfile: nothing to test"
    ds = make_dataset(base / "src", batch_size=1, image_size=(8, 8), shuffle=False, cache_dir=cache)
    assert not list(key.glob("*.lockfile"))
    assert sum(len(y) for _, y in ds) == len(made)
    assert list(key.glob("cache*.index"))


def test_lock_of_a_live_or_unknown_owner_is_refused(data, tmp_path):
    base, _ = data
    cache = tmp_path / "cache"
    make_dataset(base / "src", batch_size=2, image_size=(8, 8), cache_dir=cache)
    (key,) = cache.iterdir()
    lock = key / "cache_0.lockfile"
    lock.write_text("Created at: 0")
    # this very process holds the writer lock and a caching iterator is writing
    with pytest.raises(CacheLockedError, match=f"pid {os.getpid()} on .*holds its lock"):
        make_dataset(base / "src", batch_size=2, image_size=(8, 8), cache_dir=cache)
    (key / "owner.json").unlink()
    with pytest.raises(CacheLockedError, match="no owner.json"):
        make_dataset(base / "src", batch_size=2, image_size=(8, 8), cache_dir=cache)
    assert lock.exists()                                     # nothing removed


class SimulatedStep(tf.keras.callbacks.Callback):
    """The accelerator's work, as MLPerf Storage's DLIO simulates it: a sleep per step."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.01)


def fit(ds):
    wait = DataWaitCallback(log_every=0)
    model = tf.keras.Sequential([tf.keras.Input((8, 8, 3)), tf.keras.layers.Rescaling(1 / 255),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(wait.wrap(ds), epochs=2, verbose=0, shuffle=False,
                        callbacks=[SimulatedStep(), wait])
    return history, wait.summaries


def test_keras_fit_reports_data_wait_per_step(data):
    base, made = data

    def slow(x, y):
        nap = tf.py_function(lambda: time.sleep(0.05) or 0, [], tf.int64)
        with tf.control_dependencies([nap]):
            return tf.identity(x), tf.identity(y)

    fast = make_dataset(base / "src", batch_size=2, image_size=(8, 8)).cache()
    history, summaries = fit(fast)
    assert len(history.history["loss"]) == 2
    assert [s.batches for s in summaries] == [len(made) // 2] * 2
    assert summaries[-1].verdict != "highly input-bound"
    # A sequential map after the pipeline's prefetch: each batch is 50 ms late, and no
    # prefetching can hide it.
    _, summaries = fit(make_dataset(base / "src", batch_size=2, image_size=(8, 8)).map(slow))
    assert summaries[-1].verdict == "highly input-bound"

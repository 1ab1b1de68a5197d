"""The timing figures as TensorBoard scalars from TensorFlow: Keras fit with the
data-wait callback writes them into Keras's own TensorBoard run, beside the loss; timed()
writes them through a tf.summary writer. Read back with the tensorboard package's
EventAccumulator. One module so TensorFlow is imported once."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from hotcache.adapters import DataWaitCallback, dataroot, make_dataset, timed  # noqa: E402

from .helpers import make_jpegs, read_scalars  # noqa: E402


@pytest.fixture(autouse=True)
def no_data_root(monkeypatch):
    monkeypatch.setattr(dataroot, "_current", None)
    monkeypatch.delenv("HOTCACHE_TENSORBOARD", raising=False)
    monkeypatch.delenv("HOTCACHE_PUSHGATEWAY", raising=False)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("publish_tf") / "src"
    make_jpegs(root, per_class=4)             # 12 images: 6 batches of 2
    return root


def test_keras_fit_writes_them_beside_the_loss(images, tmp_path):
    """Two epochs of 6 steps, a window every 2 waits: windows at steps 2, 4 and 8, 10,
    epochs at their last steps 5 and 11, in the "train" run of Keras's TensorBoard
    callback, where Keras writes the epoch's loss."""
    board = tf.keras.callbacks.TensorBoard(log_dir=str(tmp_path))
    wait = DataWaitCallback(log_every=2, tensorboard=board)
    model = tf.keras.Sequential([tf.keras.Input((8, 8, 3)), tf.keras.layers.Rescaling(1 / 255),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ds = make_dataset(images, batch_size=2, image_size=(8, 8), shuffle=False)
    model.fit(wait.wrap(ds), epochs=2, verbose=0, callbacks=[wait, board])
    got = read_scalars(tmp_path / "train")
    assert "epoch_loss" in got
    assert [s for s, _ in got["input/wait_p50_ms"]] == [2, 4, 8, 10]
    assert [s for s, _ in got["input/epoch/wait_p95_ms"]] == [5, 11]
    assert [v for _, v in got["input/epoch/waiting_share"]] == pytest.approx(
        [s.wait_share for s in wait.summaries])


def test_timed_writes_through_a_tf_summary_writer(images, tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    timer = timed(make_dataset(images, batch_size=4, image_size=(8, 8), seed=1), log_every=1,
                  tensorboard=writer)
    for _ in timer:
        pass
    writer.flush()
    got = read_scalars(tmp_path)
    assert [s for s, _ in got["input/wait_p50_ms"]] == [1, 2]
    assert got["input/epoch/wait_p50_ms"] == [(2, pytest.approx(timer.summaries[0].p50_wait_s * 1e3))]

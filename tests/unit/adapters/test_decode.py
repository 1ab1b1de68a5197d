"""make_loader's batched decoding: whole batches decoded in threads straight into one
uint8 tensor, with tf.data's resize filter. Real torch, real JPEGs, real TensorFlow for
the pixel comparison."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hotcache.adapters import make_loader  # noqa: E402
from hotcache.adapters import pytorch as pt  # noqa: E402
from hotcache.adapters.decode import decode_array, fast_jpeg_available  # noqa: E402
from hotcache.adapters.pytorch import ImageFolderDataset  # noqa: E402

from .helpers import make_jpegs  # noqa: E402


def noisy_jpegs(root, n=12, size=(40, 30)):
    """Photo-like JPEGs (a gradient plus noise) in 3 class folders."""
    from PIL import Image

    rng = np.random.default_rng(1)
    for i in range(n):
        folder = root / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        px = np.linspace(0, 200, size[0])[None, :, None] + rng.normal(0, 30, (size[1], size[0], 3))
        Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(folder / f"{i:02d}.jpg", quality=90)
    return root


def test_batched_loader_gives_the_per_sample_pixels_shapes_and_label_order(tmp_path):
    root = noisy_jpegs(tmp_path / "ds")
    ds = ImageFolderDataset(root, image_size=(16, 12))
    loader = make_loader(root, batch_size=5, num_workers=0, decode_threads=3,
                         shuffle=False, image_size=(16, 12), log_every=0)
    assert loader.dataset.threads == 3
    seen = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 12)
        assert images.is_contiguous() and labels.dtype == torch.int64
        for k in range(len(labels)):
            img, label = ds[seen + k]
            assert torch.equal(images[k], img), f"sample {seen + k} differs from ds[i]"
            assert int(labels[k]) == label
        seen += len(labels)
    assert seen == len(ds)


def test_every_sample_once_per_epoch_with_worker_processes_and_threads(tmp_path):
    root = tmp_path / "toy"
    made = make_jpegs(root, per_class=6)
    loader = make_loader(root, batch_size=4, num_workers=2, decode_threads=2,
                         image_size=(8, 8), log_every=0)
    for _ in range(2):
        labels = []
        for images, batch_labels in loader:
            # each class's images are dominated by its own colour channel
            assert (images[:, :, 0, 0].argmax(dim=1) == batch_labels).all()
            labels += batch_labels.tolist()
        assert sorted(labels) == sorted(label for _, label in made)
    s = loader.summary()
    # the workers' load time still comes back apart from the loop's wait
    assert s.worker_load_s > 0 and s.batches == len(loader)
    assert len(loader.worker_loads) == len(loader)        # per epoch


def test_a_user_collate_gets_samples_not_the_batch(tmp_path):
    root = tmp_path / "toy"
    make_jpegs(root, per_class=2)
    got = []

    def collate(samples):
        got.append([(tuple(img.shape), label) for img, label in samples])
        return len(samples)

    loader = make_loader(root, batch_size=3, num_workers=0, shuffle=False,
                         image_size=(8, 8), collate_fn=collate, log_every=0)
    assert list(loader) == [3, 3]
    assert got[0] == [((3, 8, 8), 0), ((3, 8, 8), 0), ((3, 8, 8), 1)]


@pytest.mark.skipif(not fast_jpeg_available(), reason="simplejpeg/cv2 (the torch extra) not installed")
def test_resize_matches_tf_data_bilinear(tmp_path):
    """Same pixels as make_dataset's tf.image.resize (bilinear) to within rounding:
    much closer than Pillow's antialiased bilinear."""
    tf = pytest.importorskip("tensorflow")
    root = noisy_jpegs(tmp_path / "ds", n=3, size=(320, 256))
    path = str(sorted(root.rglob("*.jpg"))[0])
    ours = decode_array(path, (224, 224), "bilinear").astype(int)
    img = tf.io.decode_jpeg(open(path, "rb").read(), channels=3)
    theirs = tf.cast(tf.image.resize(img, (224, 224)), tf.uint8).numpy().astype(int)
    pillow = np.asarray(pt.decode_image(path, (224, 224))).astype(int)
    assert ours.shape == theirs.shape == (224, 224, 3)
    assert np.abs(ours - theirs).mean() < 1.5 < np.abs(pillow - theirs).mean()


def test_image_size_is_height_width_in_both_loaders(tmp_path):
    """image_size=(height, width), as tf.image.resize, torchvision and Keras read it: the
    same non-square size gives batches of the same height and width from make_loader
    (batched and per-sample decoding) and make_dataset."""
    pytest.importorskip("tensorflow")
    from hotcache.adapters import make_dataset

    root = noisy_jpegs(tmp_path / "ds", n=3, size=(64, 48))
    size = (12, 20)
    batched, _ = next(iter(make_loader(root, batch_size=3, num_workers=0, shuffle=False,
                                       image_size=size, log_every=0)))
    per_sample, _ = next(iter(make_loader(root, batch_size=3, num_workers=0, shuffle=False,
                                          image_size=size, transform=pt.to_tensor,
                                          log_every=0)))
    tf_batch, _ = next(iter(make_dataset(root, batch_size=3, image_size=size, shuffle=False)))
    assert tuple(batched.shape) == tuple(per_sample.shape) == (3, 3, 12, 20)
    assert tuple(tf_batch.shape) == (3, 12, 20, 3)
    # the same files in the same order, resized by the same filter: close pixels
    ours = batched.permute(0, 2, 3, 1).numpy().astype(int)
    assert np.abs(ours - tf_batch.numpy().astype(int)).mean() < 8


def test_unknown_resample_is_refused_with_the_choices(tmp_path):
    root = tmp_path / "toy"
    make_jpegs(root, per_class=1)
    with pytest.raises(ValueError, match="bilinear"):
        ImageFolderDataset(root, image_size=(8, 8), resample="fancy")


def test_decode_threads_default_uses_the_cpus_left_per_worker(monkeypatch):
    monkeypatch.setattr(pt.os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert pt.default_workers() == 8 and pt.default_decode_threads(8) == 4
    assert pt.default_decode_threads(0) == 32
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert pt.default_decode_threads(pt.default_workers()) == 1


@pytest.mark.parametrize("cpus, workers, threads",
                         [(2, 0, 2), (4, 0, 4), (5, 2, 3), (8, 2, 4), (32, 8, 4), (64, 8, 8)])
def test_batched_decoding_takes_fewer_processes_and_more_threads(tmp_path, monkeypatch,
                                                                 cpus, workers, threads):
    """Whole batches decode in threads, so the default spends the CPUs on threads (up to
    four CPUs in the training process itself, above that one process per four CPUs) and
    the first batch of an epoch comes from every CPU; a transform (Python per sample)
    keeps one process per CPU."""
    root = tmp_path / "toy"
    make_jpegs(root, per_class=1)
    monkeypatch.setattr(pt.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    loader = make_loader(root, image_size=(8, 8), log_every=0)
    assert (loader.num_workers, loader.dataset.threads) == (workers, threads)
    per_sample = make_loader(root, image_size=(8, 8), transform=lambda img: img, log_every=0)
    assert per_sample.num_workers == min(8, cpus)
    assert make_loader(root, image_size=(8, 8), decode_threads=3, log_every=0).dataset.threads == 3
    # A dataset the caller built keeps its own threads, so it keeps one process per CPU.
    own = ImageFolderDataset(root, image_size=(8, 8))
    assert make_loader(dataset=own, log_every=0).num_workers == min(8, cpus)
    assert own.threads == 1

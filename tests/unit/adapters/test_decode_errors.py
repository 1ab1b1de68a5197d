"""A file a loader cannot decode: the error names it (make_loader's fast and Pillow
paths, in worker processes too, and make_dataset's tf.data pipeline), and Pillow's
ImageFile.LOAD_TRUNCATED_IMAGES, which torchvision users set for truncated JPEGs, is
honoured: the fast decoder leaves such a file to Pillow, which then loads it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from PIL import Image, ImageFile  # noqa: E402

from hotcache.adapters import make_loader  # noqa: E402
from hotcache.adapters.errors import ImageDecodeError  # noqa: E402

from .helpers import make_jpegs  # noqa: E402


@pytest.fixture
def truncated(tmp_path):
    """Two classes of whole JPEGs and one JPEG cut in half, as an interrupted copy leaves it."""
    root = tmp_path / "data"
    make_jpegs(root, per_class=3, size=(64, 48), classes=("cat", "dog"))
    bad = root / "dog" / "001.jpg"
    noise = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(bad, quality=95)   # mostly scan data: the cut leaves the header
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    return root, bad


def read_all(loader) -> int:
    return sum(len(labels) for _, labels in loader)


@pytest.mark.parametrize("options", [
    {"image_size": (16, 16)},                                  # batched, fast JPEG path
    {"image_size": (16, 16), "num_workers": 1},                # ... in a worker process
    {"transform": lambda img: torch.zeros(1)},                 # per sample, Pillow
])
def test_a_truncated_jpeg_stops_the_loader_with_its_name(truncated, options, monkeypatch):
    root, bad = truncated
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    loader = make_loader(root, batch_size=2, shuffle=False, log_every=0,
                         **{"num_workers": 0, **options})
    with pytest.raises(OSError, match=str(bad)) as raised:
        read_all(loader)
    assert "truncated" in str(raised.value)                    # Pillow's own words kept
    if "num_workers" not in options or not options["num_workers"]:
        assert isinstance(raised.value, ImageDecodeError) and raised.value.path == str(bad)


def test_load_truncated_images_is_honoured(truncated, monkeypatch):
    root, _bad = truncated
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    for options in ({"image_size": (16, 16)}, {"image_size": None}):
        loader = make_loader(root, batch_size=2, num_workers=0, log_every=0, **options)
        assert read_all(loader) == 6


tf = pytest.importorskip("tensorflow")

from hotcache.adapters import make_dataset  # noqa: E402


def test_tf_data_names_a_truncated_or_unreadable_file(truncated):
    root, bad = truncated
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{bad}: cannot decode"):
        list(make_dataset(root, batch_size=2, image_size=(8, 8)))
    bad.write_bytes(b"not an image at all")
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{bad}: cannot decode"):
        list(make_dataset(root, batch_size=2, image_size=(8, 8)))


def test_tf_data_reads_whole_files_and_ones_with_bytes_after_the_end(truncated):
    """A JPEG with bytes after its end marker decodes (in Python), as decode_image allows."""
    root, bad = truncated
    good = root / "cat" / "000.jpg"
    bad.write_bytes(good.read_bytes() + b"\0" * 7)
    assert sum(len(y) for _, y in make_dataset(root, batch_size=2, image_size=(8, 8))) == 6

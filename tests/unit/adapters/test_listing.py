"""Each loader lists what its framework's own loader lists: make_loader as torchvision's
ImageFolder (its rule pinned in anchors.py), make_dataset as Keras's
image_dataset_from_directory (compared directly), on a folder with .tif, .ppm, .gif,
.pgm, .webp, a symlinked class, a symlinked folder inside a class, a dot folder, and
folder names that os.walk and a sort order differently. Plus ImageFolder's and Keras's
attributes, and Keras's validation split."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from hotcache.adapters import make_loader  # noqa: E402
from hotcache.adapters.errors import EmptyClassError  # noqa: E402
from hotcache.adapters.pytorch import ImageFolderDataset  # noqa: E402

from . import anchors  # noqa: E402

FORMATS = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "PPM", "WEBP")
EXT = {"JPEG": ".jpg", "PNG": ".png", "BMP": ".bmp", "GIF": ".gif", "TIFF": ".tif",
       "PPM": ".ppm", "WEBP": ".webp"}


def image(path, fmt: str, value: int, mode: str = "RGB") -> None:
    """A 10×6 image of seeded noise (a resize of it lands between levels)."""
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(value).integers(0, 256, (6, 10, 3), dtype=np.uint8)
    img = Image.fromarray(pixels)
    (img if mode == "RGB" else img.convert(mode)).save(path, fmt)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """root/: ant (every format, upper-case .JPEG, a .txt, sub/ and sub-x/ folders),
    bee -> a class folder elsewhere (symlink) with a symlinked folder inside, .cache (a
    dot folder), cow (only a .tif and a .pgm: nothing Keras reads)."""
    base = tmp_path_factory.mktemp("listing")
    root = base / "root"
    for i, fmt in enumerate(FORMATS):
        image(root / "ant" / f"a{i}{EXT[fmt]}", fmt, 10 + i)
    image(root / "ant" / "UP.JPEG", "JPEG", 30)
    image(root / "ant" / "gray.pgm", "PPM", 90, mode="L")
    (root / "ant" / "notes.txt").write_text("not an image")
    image(root / "ant" / "sub" / "deep.jpg", "JPEG", 40)
    image(root / "ant" / "sub" / "inner" / "deeper.jpg", "JPEG", 45)   # sorts after sub-x
    image(root / "ant" / "sub-x" / "dash.png", "PNG", 50)
    elsewhere = base / "elsewhere"
    image(elsewhere / "bee" / "b.jpg", "JPEG", 60)
    image(elsewhere / "extra" / "linked.png", "PNG", 70)
    os.symlink(elsewhere / "extra", elsewhere / "bee" / "more")
    os.symlink(elsewhere / "bee", root / "bee")
    image(root / ".cache" / "c.jpg", "JPEG", 80)
    image(root / "cow" / "c.tif", "TIFF", 100)
    image(root / "cow" / "c.pgm", "PPM", 110, mode="L")
    return root


def test_make_loader_lists_as_torchvisions_image_folder(mixed):
    classes, class_to_idx, samples = anchors.image_folder(str(mixed))
    ds = ImageFolderDataset(mixed)
    assert ds.classes == classes == [".cache", "ant", "bee", "cow"]
    assert ds.class_to_idx == class_to_idx
    assert list(ds.samples) == samples and ds.samples == samples and ds.imgs == samples
    assert ds.targets == [label for _, label in samples]
    names = {os.path.basename(p) for p, _ in samples}
    assert {"a4.tif", "a5.ppm", "gray.pgm", "a6.webp", "UP.JPEG", "linked.png"} <= names
    assert "a3.gif" not in names and "notes.txt" not in names
    # every file listed decodes
    loader = make_loader(mixed, batch_size=4, image_size=(6, 10), num_workers=0, log_every=0)
    assert sum(len(labels) for _, labels in loader) == len(samples)


def test_an_empty_class_is_an_error_naming_it_as_torchvision_raises(tmp_path):
    image(tmp_path / "a" / "x.jpg", "JPEG", 1)
    image(tmp_path / "b" / "y.gif", "GIF", 2)          # nothing torchvision reads
    (tmp_path / "c").mkdir()
    with pytest.raises(FileNotFoundError) as theirs:
        anchors.image_folder(str(tmp_path))
    with pytest.raises(EmptyClassError) as ours:
        ImageFolderDataset(tmp_path)
    assert isinstance(ours.value, FileNotFoundError)
    assert "for the classes b, c" in str(theirs.value) and "for the classes b, c" in str(ours.value)


def test_target_transform_and_targets_as_image_folder_has_them(mixed):
    ds = ImageFolderDataset(mixed, image_size=(6, 10), target_transform=lambda y: 10 * y)
    assert ds[len(ds) - 1][1] == 10 * ds.targets[-1]
    loader = make_loader(mixed, batch_size=50, image_size=(6, 10), shuffle=False,
                         target_transform=lambda y: torch.nn.functional.one_hot(torch.tensor(y), 4),
                         num_workers=0, log_every=0)
    (_images, labels), = list(loader)
    assert labels.shape == (len(ds), 4) and labels.argmax(dim=1).tolist() == ds.targets


def test_a_batch_sampler_beside_batch_size_or_drop_last_is_refused_as_dataloader_does(mixed):
    data = list(range(10))
    pairs = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(data), 2, False)
    with pytest.raises(ValueError) as plain:
        torch.utils.data.DataLoader(data, batch_size=64, drop_last=True, batch_sampler=pairs)
    for wrong in ({"batch_size": 64, "drop_last": True}, {"batch_size": 64},
                  {"drop_last": True}, {"shuffle": True}):
        with pytest.raises(ValueError) as ours:
            make_loader(dataset=data, batch_sampler=pairs, num_workers=0, log_every=0, **wrong)
        assert str(ours.value) == str(plain.value), wrong
    fine = make_loader(dataset=data, batch_sampler=pairs, num_workers=0, log_every=0)
    assert [b.tolist() for b in fine][:2] == [[0, 1], [2, 3]]


tf = pytest.importorskip("tensorflow")

from hotcache.adapters import make_dataset  # noqa: E402


def keras(root, **options):
    return tf.keras.utils.image_dataset_from_directory(
        str(root), image_size=(6, 10), batch_size=None, verbose=False, **options)


def labels_of(ds) -> list[int]:
    return [int(y) for y in ds.unbatch().map(lambda x, y: y)] if ds.element_spec[1].shape.rank \
        else [int(y) for y in ds.map(lambda x, y: y)]


@pytest.mark.parametrize("follow_links", [False, True])
def test_make_dataset_lists_as_keras_image_dataset_from_directory(mixed, follow_links):
    theirs = keras(mixed, shuffle=False, follow_links=follow_links)
    ours = make_dataset(mixed, batch_size=4, image_size=(6, 10), shuffle=False,
                        follow_links=follow_links)
    assert ours.class_names == theirs.class_names == ["ant", "bee", "cow"]
    assert ours.file_paths == theirs.file_paths
    names = {os.path.basename(p) for p in ours.file_paths}
    assert "a4.tif" not in names and "a5.ppm" not in names and "a3.gif" in names
    assert ("linked.png" in names) == follow_links
    assert labels_of(ours) == labels_of(theirs)       # every file decodes; cow keeps label 2


def test_make_dataset_rounds_the_resized_pixels_to_keras_floats(mixed):
    theirs = tf.keras.utils.image_dataset_from_directory(
        str(mixed), image_size=(4, 7), batch_size=None, verbose=False, shuffle=False)
    ours = make_dataset(mixed, batch_size=64, image_size=(4, 7), shuffle=False)
    a = tf.concat([x for x, _ in ours], 0).numpy().astype("float64")
    b = tf.stack([x for x, _ in theirs], 0).numpy().astype("float64")
    assert b.dtype == "float64" and (b != b.round()).any()     # Keras keeps the float
    assert a.shape == b.shape and abs(a - b).max() <= 0.5
    assert abs((a - b).mean()) < 0.1                  # no bias (a cast alone: about -0.5)


@pytest.mark.parametrize("subset", ["training", "validation", "both"])
def test_validation_split_takes_the_files_keras_takes(mixed, subset):
    theirs = keras(mixed, validation_split=0.3, subset=subset, seed=5)
    ours = make_dataset(mixed, image_size=(6, 10), validation_split=0.3, subset=subset, seed=5)
    if subset == "both":
        assert [d.file_paths for d in ours] == [d.file_paths for d in theirs]
        assert not set(ours[0].file_paths) & set(ours[1].file_paths)
    else:
        assert ours.file_paths == theirs.file_paths and ours.class_names == theirs.class_names
        assert sorted(labels_of(ours)) == sorted(labels_of(theirs))


def test_validation_split_is_checked_with_keras_messages(mixed):
    with pytest.raises(ValueError, match="must provide a `seed`"):
        make_dataset(mixed, validation_split=0.2, subset="training")
    with pytest.raises(ValueError, match="If `subset` is set"):
        make_dataset(mixed, subset="training", seed=1)

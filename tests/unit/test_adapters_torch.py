"""PyTorch: the image-folder Dataset and the timed DataLoader, with real torch and real
JPEGs decoded by Pillow."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from hotcache.adapters import data_root, make_loader  # noqa: E402
from hotcache.adapters.pytorch import ImageFolderDataset  # noqa: E402

from .adapters_helpers import CLASSES, make_jpegs, write_hot_copy  # noqa: E402


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch") / "toy"
    made = make_jpegs(root, per_class=5)
    return root, made


def test_samples_and_labels_match_the_class_folders(jpegs):
    root, made = jpegs
    ds = ImageFolderDataset(root)
    assert ds.classes == list(CLASSES) and len(ds) == len(made)
    for i in range(len(ds)):
        img, label = ds[i]
        assert img.dtype == torch.uint8 and img.shape == (3, 12, 16)
        # each class's images are dominated by its own colour channel
        assert int(img[:, 0, 0].argmax()) == label == CLASSES.index(ds.paths[i].split("/")[-2])


def test_raw_bytes_go_to_the_user_transform(jpegs):
    root, _ = jpegs
    ds = ImageFolderDataset(root, decode=False, transform=lambda data: len(data))
    size, label = ds[0]
    assert size == len(open(ds.paths[0], "rb").read()) and label == 0


def test_loader_reads_data_root_and_delivers_every_sample_once(jpegs, monkeypatch):
    root, made = jpegs
    hot = write_hot_copy(root, root.parent / "hot")
    monkeypatch.setenv("DATA_ROOT", str(hot))
    loader = make_loader(batch_size=4, num_workers=2, image_size=(8, 8), log_every=0)
    assert loader.dataset.root == hot and loader.pin_memory is False
    assert loader.num_workers == 2 and loader.persistent_workers and loader.prefetch_factor == 4
    labels = []
    for images, batch_labels in loader:
        assert images.shape[1:] == (3, 8, 8)
        assert (images[:, :, 0, 0].argmax(dim=1) == batch_labels).all()
        labels += batch_labels.tolist()
    assert sorted(labels) == sorted(label for _, label in made)
    s = loader.summary()
    assert s.batches == len(loader) == 4
    # the workers' own load time comes back apart from the loop's wait
    assert s.worker_load_s > 0 and len(loader.worker_loads) == 4


class SlowDataset(torch.utils.data.Dataset):
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.zeros(2), i


def run(loader, step):
    for _ in loader:
        time.sleep(step)
    return loader.summary()


def test_slow_dataset_is_judged_highly_input_bound_fast_one_is_not():
    slow = make_loader(dataset=SlowDataset(24, 0.02), batch_size=4, num_workers=0,
                       shuffle=False, log_every=0)
    fast = make_loader(dataset=SlowDataset(24, 0.0), batch_size=4, num_workers=0,
                       shuffle=False, log_every=0)
    assert run(slow, 0.002).verdict == "highly input-bound"
    assert run(fast, 0.02).verdict == "not input-bound"


def test_training_loop_with_the_adapters(jpegs, monkeypatch):
    root, _ = jpegs
    monkeypatch.setenv("DATA_ROOT", str(root))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, len(CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = make_loader(data_root().path, batch_size=5, num_workers=1, image_size=(8, 8),
                         log_every=0)
    losses = []
    for _epoch in range(3):
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert [s.epoch for s in loader.summaries] == [0, 1, 2]


def test_distributed_sampler_splits_the_data(jpegs, tmp_path):
    root, made = jpegs
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        loader = make_loader(root, batch_size=4, num_workers=0, image_size=(8, 8), log_every=0)
        assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
        orders = []
        for _ in range(2):
            orders.append([int(x) for _, y in loader for x in y])
        assert sorted(orders[0]) == sorted(label for _, label in made)
        assert loader.sampler.epoch == 1               # set_epoch called for each epoch
    finally:
        dist.destroy_process_group()


def test_scaled_jpeg_decoding_gives_the_same_size_and_nearly_the_same_pixels(tmp_path):
    make_jpegs(tmp_path, per_class=1, size=(64, 48))
    fast = ImageFolderDataset(tmp_path, image_size=(16, 12))
    full = ImageFolderDataset(tmp_path, image_size=(16, 12), draft=False)
    for i in range(len(fast)):
        (a, la), (b, lb) = fast[i], full[i]
        assert a.shape == b.shape == (3, 12, 16) and la == lb
        assert (a.int() - b.int()).abs().max() <= 8


class Counting(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_iterable_dataset_is_timed_without_per_sample_stamps():
    loader = make_loader(dataset=Counting(), batch_size=4, num_workers=0, log_every=0)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    s = loader.summary()
    assert s.batches == 3 and s.worker_load_s is None

"""Epochs and samplers: make_loader reads the order a plain DataLoader with the same
sampler reads, drives the epoch only of a sampler it made, and counts an epoch only
when it was read to its end (a peek never shifts later epochs)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from hotcache.adapters import make_loader  # noqa: E402


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, index):
        return index


def order(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


def users_sampler() -> DistributedSampler:
    """A sampler the user made: rank 0 of 2, shuffled, its epoch set by the user."""
    return DistributedSampler(Numbers(), num_replicas=2, rank=0, shuffle=True, seed=7)


def test_a_resumed_run_reads_what_a_plain_dataloader_reads_with_the_users_sampler():
    """Resumed at epoch 3: the user's set_epoch(3), set_epoch(4) decide, as they do for a
    plain DataLoader; the loader never sets the user's sampler's epoch itself (read twice
    without a set_epoch, an epoch repeats, as with DataLoader)."""
    def epochs(make) -> list[list[int]]:
        sampler = users_sampler()
        loader = make(sampler)
        seen = []
        for epoch in (3, 4):
            sampler.set_epoch(epoch)
            seen.append(order(loader))
        seen.append(order(loader))              # no set_epoch: the user's epoch 4 again
        return seen

    plain = epochs(lambda s: DataLoader(Numbers(), sampler=s, batch_size=5))
    ours = epochs(lambda s: make_loader(dataset=Numbers(), sampler=s, batch_size=5,
                                        num_workers=0, log_every=0))
    assert ours == plain and plain[0] != plain[1] and plain[1] == plain[2]


def test_set_epoch_on_the_loader_reaches_the_users_sampler_as_accelerates_does():
    sampler = users_sampler()
    loader = make_loader(dataset=Numbers(), sampler=sampler, batch_size=5, num_workers=0,
                         log_every=0)
    loader.set_epoch(3)
    plain_sampler = users_sampler()
    plain_sampler.set_epoch(3)
    assert sampler.epoch == 3
    assert order(loader) == order(DataLoader(Numbers(), sampler=plain_sampler, batch_size=5))
    assert loader.summaries[-1].epoch == 3     # the timing line says the epoch read


@pytest.fixture
def one_rank(tmp_path):
    """torch.distributed initialised with one rank (gloo), so make_loader makes its own
    DistributedSampler."""
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def plain_epochs(epochs) -> list[list[int]]:
    """A plain DataLoader with a DistributedSampler as make_loader makes it (seed 0),
    its epoch set by hand each epoch."""
    sampler = DistributedSampler(Numbers(), num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(Numbers(), sampler=sampler, batch_size=5)
    out = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        out.append(order(loader))
    return out


def test_its_own_sampler_advances_per_epoch_read_and_a_peek_shifts_nothing(one_rank):
    loader = make_loader(dataset=Numbers(), batch_size=5, num_workers=0, log_every=0)
    assert isinstance(loader.sampler, DistributedSampler)
    next(iter(loader))                          # a peek: not an epoch
    first = [order(loader), order(loader)]
    assert first == plain_epochs([0, 1]) and first[0] != first[1]
    it = iter(loader)
    next(it)
    it.close()                                  # an epoch left early is not counted either
    assert order(loader) == plain_epochs([2])[0]
    loader.set_epoch(7)                         # resumed
    assert order(loader) == plain_epochs([7])[0] and loader.sampler.epoch == 8
    assert [s.epoch for s in loader.summaries][-2:] == [2, 7]


def test_lightnings_set_epoch_on_its_own_sampler_is_kept(one_rank):
    """Lightning calls set_epoch on the loader's sampler before each epoch: the loader
    reads that epoch, not one of its own count."""
    loader = make_loader(dataset=Numbers(), batch_size=5, num_workers=0, log_every=0)
    loader.sampler.set_epoch(5)
    assert order(loader) == plain_epochs([5])[0]

"""make_loader beside the frameworks that take a DataLoader: Accelerate's prepare() and
Lightning's Trainer treat it as one (it is a torch DataLoader subclass), and a type
checker sees make_loader's, make_dataset's and timed()'s keywords."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hotcache.adapters import make_loader  # noqa: E402

from .helpers import CLASSES, make_jpegs  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    root = tmp_path_factory.mktemp("frameworks") / "toy"
    make_jpegs(root, per_class=5)           # 15 images: 3 batches of 5
    return root


def test_accelerate_prepares_it_places_batches_and_syncs_at_the_epochs_end(jpegs):
    """accelerator.prepare() rebuilds a DataLoader (DataLoaderShard) from make_loader's:
    batches go to the accelerator's device, every sample comes once, and with gradient
    accumulation over 4 steps the last of 3 steps syncs (the end of the data is known)."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.data_loader import DataLoaderShard
    from accelerate.state import AcceleratorState, GradientState

    loader = make_loader(jpegs, batch_size=5, image_size=(8, 8), log_every=0)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    try:
        model = torch.nn.Linear(3 * 8 * 8, len(CLASSES))
        model, prepared = accelerator.prepare(model, loader)
        assert isinstance(prepared, DataLoaderShard) and prepared.device == accelerator.device
        labels, syncs = [], []
        for images, batch_labels in prepared:
            with accelerator.accumulate(model):
                assert images.device == accelerator.device and images.shape[1:] == (3, 8, 8)
                assert (images[:, :, 0, 0].argmax(dim=1) == batch_labels).all()
                labels += batch_labels.tolist()
                syncs.append(accelerator.sync_gradients)
        assert syncs == [False, False, True]
        assert sorted(labels) == sorted(label for label in range(3) for _ in range(5))
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def test_lightning_fits_and_predicts_with_it_and_seeds_its_workers(jpegs, monkeypatch):
    """Trainer.fit (CPU, one epoch): every batch reaches training_step, timed; Lightning's
    worker seeding (seed_everything(workers=True)) reaches the workers that read.
    Trainer.predict rebuilds the loader with a sampler of its own: it stays a
    make_loader loader and predicts every sample in order."""
    lightning = pytest.importorskip("lightning")
    monkeypatch.chdir(jpegs.parent)

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3 * 8 * 8, len(CLASSES))
            self.steps = 0

        def training_step(self, batch, _index):
            images, labels = batch
            self.steps += 1
            return torch.nn.functional.cross_entropy(self.layer(images.float().flatten(1) / 255), labels)

        def predict_step(self, batch, _index):
            return batch[1]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    lightning.seed_everything(3, workers=True)
    loader = make_loader(jpegs, batch_size=5, image_size=(8, 8), num_workers=1, log_every=0)
    trainer = lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)
    model = Tiny()
    trainer.fit(model, train_dataloaders=loader)
    assert model.steps == len(loader) == 3
    assert [s.batches for s in loader.summaries] == [3]
    seeding = loader.reader.worker_init_fn
    assert seeding is not None and getattr(seeding, "func", None).__name__ == "pl_worker_init_function"

    plain = make_loader(jpegs, batch_size=5, image_size=(8, 8), shuffle=False, num_workers=0,
                        log_every=0)
    predicted = trainer.predict(model, dataloaders=plain)
    assert [int(y) for batch in predicted for y in batch] == plain.dataset.targets


SNIPPET = """
from hotcache.adapters import make_dataset, make_loader, timed
loader = make_loader("/data", batch_sise=4)
make_dataset("/data", image_sise=(8, 8))
for images, labels in make_loader("/data", batch_size=4, timeout=5.0):
    pass
n: int = timed([1, 2, 3]).summary().batches
for item in timed(["a"]):
    item.upper()
    item + 1
"""


def test_a_type_checker_flags_misspelled_keywords_and_knows_the_batch_type(tmp_path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "train.py"
    snippet.write_text(SNIPPET)
    # mypy's own cache in the checkout, which the lint step (.ci/run) has filled with
    # torch's and TensorFlow's stubs: read there in seconds, checked afresh in twenty
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                           "--cache-dir", str(REPO / ".mypy_cache"), "--no-error-summary",
                           str(snippet)], capture_output=True, text=True, timeout=600, cwd=REPO)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert any(':3: error: Unexpected keyword argument "batch_sise" for "make_loader"' in e
               for e in errors), done.stdout
    assert any(':4: error: Unexpected keyword argument "image_sise" for "make_dataset"' in e
               for e in errors), done.stdout
    assert any(":10: error: Unsupported operand types" in e for e in errors), done.stdout   # str + int
    assert len(errors) == 3, done.stdout

"""Small real datasets for the adapter tests: JPEG class folders (Pillow), TFRecord files,
and hot copies written by hand in hotcache's on-disk format (files, a SHA256SUMS that
`sha256sum -c` accepts, and the metadata file)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from hotcache.provision.hotcopy.format import FORMAT, MANIFEST, METADATA, staging_dir

CLASSES = ("cat", "dog", "eel")


def colour(label: int, index: int) -> tuple[int, int, int]:
    """Each class has its own dominant channel, so a decoded pixel tells its label."""
    rgb = [20 + index % 7, 20 + index % 5, 20 + index % 3]
    rgb[label] = 230
    return tuple(rgb)


def make_jpegs(root: Path, per_class: int = 4, size: tuple[int, int] = (16, 12),
               classes=CLASSES) -> list[tuple[str, int]]:
    """root/<class>/<n>.jpg, flat colour per image; returns (relative path, label) pairs."""
    from PIL import Image

    made = []
    for label, cls in enumerate(classes):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            rel = f"{cls}/{i:03d}.jpg"
            Image.new("RGB", size, colour(label, i)).save(root / rel, quality=95)
            made.append((rel, label))
    return made


def write_hot_copy(src: Path, dest: Path, *, name: str = "toy", version: str = "1",
                   verified: bool = True, meta_extra: dict | None = None) -> Path:
    """Publish `src` as a hot copy at `dest` the way the copier does: files into the
    staging folder, SHA256SUMS, metadata, then one rename."""
    stage = staging_dir(dest)
    stage.mkdir(parents=True)
    sums = []
    total = 0
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        data = path.read_bytes()
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
        total += len(data)
    (stage / MANIFEST).write_text("".join(sums))
    meta = {"format": FORMAT, "complete": True, "name": name, "version": version,
            "source": str(src), "files": len(sums), "bytes": total, "hash": "sha256",
            "copied_at": "2025-01-01T00:00:00Z",
            "verified_at": "2025-01-01T00:01:00Z" if verified else None,
            "verify_ok": verified, "tool_version": "test", **(meta_extra or {})}
    (stage / METADATA).write_text(json.dumps(meta))
    os.rename(stage, dest)
    return dest


def write_half_copy(src: Path, dest: Path) -> Path:
    """A copy that died half-way: some files in the staging folder, no metadata."""
    stage = staging_dir(dest)
    stage.mkdir(parents=True)
    for path in sorted(p for p in src.rglob("*") if p.is_file())[:2]:
        rel = path.relative_to(src)
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_bytes(path.read_bytes())
    return stage


def make_tfrecords(root: Path, jpeg_root: Path, shards: int = 2) -> list[tuple[str, int]]:
    """TFRecord shards of tf.train.Example {image: JPEG bytes, label: int64}, written
    from the JPEG folder; returns the (relative path, label) order they hold."""
    import tensorflow as tf

    items = sorted((p.relative_to(jpeg_root).as_posix(), CLASSES.index(p.parent.name))
                   for p in jpeg_root.rglob("*.jpg"))
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with tf.io.TFRecordWriter(str(root / f"train-{s:05d}-of-{shards:05d}.tfrecord")) as w:
            for rel, label in items[s::shards]:
                feat = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(
                            value=[(jpeg_root / rel).read_bytes()])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())
    return items


class FakeClock:
    """A clock that moves only when told: `clock()` reads it, `clock.sleep(s)` advances
    it. Timing verdicts tested against it cannot flake on a loaded machine."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of `folder`, read back with the
    tensorboard package's EventAccumulator: {tag: [(step, value), ...]}. Scalars written
    as simple values (torch's SummaryWriter) and as tensors (tf.summary, tensorboard's
    own writer) alike."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out: dict[str, list[tuple[int, float]]] = {}
    for tag in acc.Tags()["scalars"]:
        out[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue                  # text, graphs (Keras writes its model's config)
        out[tag] = [(e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
    return out

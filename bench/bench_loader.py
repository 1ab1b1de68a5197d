"""Benchmark: the four ways to feed a model from JPEG class folders, on the same files,
in one run: samples/s with no training step, and accelerator utilisation
(AU) with a simulated step.

    .venv/bin/python bench/bench_loader.py [--images 1024] [--rounds 3] [--worker-process]

- tf.data as our origin documents write it: list_files, read_file, decode_jpeg, resize
  (bilinear), parallel map (AUTOTUNE), batch, prefetch;
- make_dataset (hotcache's tf.data pipeline);
- a plain PyTorch DataLoader: Pillow open/convert/resize (bilinear) per sample, 2 workers
  (one per core here), default collate;
- make_loader (hotcache's PyTorch loader: batches decoded in threads into one tensor);
- with --worker-process, also make_loader with one worker process holding the decode
  threads (num_workers=1), against its default of threads in the training process.

Conditions: JPEGs 320×256 resized to 224×224, batch 32, warm page cache. The loaders
take turns, one epoch each per round, so load from other work falls on all alike; the
figure is the best epoch (min-max beside it). AU = time in steps / wall time, where the
step sleeps for the serial baseline's own read+decode time per batch (MLPerf Storage's
DLIO stands in for an accelerator the same way). Goal: make_loader >= 0.9x make_dataset
samples/s, and AU >= 0.95.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_adapters_data import cpus, make_dataset_on_disk, serial_batches  # noqa: E402

from hotcache.adapters.compare import simulate  # noqa: E402

SIZE = 224


def origin_tf_data(root: Path, batch_size: int):
    import tensorflow as tf

    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    table = {c: i for i, c in enumerate(classes)}
    files = sorted(str(p) for p in root.glob("*/*.jpg"))
    labels = [table[Path(f).parent.name] for f in files]

    def load(path, label):
        img = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tf.cast(tf.image.resize(img, (SIZE, SIZE)), tf.uint8), label

    ds = tf.data.Dataset.from_tensor_slices((files, labels)).shuffle(len(files), seed=0)
    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size) \
             .prefetch(tf.data.AUTOTUNE)


def plain_torch(root: Path, batch_size: int, workers: int):
    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset

    from hotcache.adapters.imagefolder import list_image_folder

    paths, labels, _ = list_image_folder(root)

    class Folder(Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            with Image.open(paths[i]) as im:
                img = im.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
            return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), labels[i]

    return DataLoader(Folder(), batch_size=batch_size, shuffle=True, num_workers=workers,
                      persistent_workers=True, prefetch_factor=4)


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its live children (loader
    workers): the work a pipeline costs, whatever else loads the machine."""
    total = time.process_time()
    me = str(os.getpid())
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:                       # ppid
            total += (int(fields[11]) + int(fields[12])) / tick   # utime + stime
    return total


def epoch(loader, step_s: float) -> dict:
    cpu0 = cpu_seconds()
    batches, samples, wall, stepping, summary = simulate(
        loader() if callable(loader) else loader, step_s=step_s)
    return {"samples_per_s": samples / wall, "au": stepping / wall if step_s else None,
            "samples_per_cpu_s": samples / max(cpu_seconds() - cpu0, 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-process", action="store_true",
                        help="also make_loader with one worker process (num_workers=1)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from hotcache.adapters import make_dataset, make_loader
    from hotcache.adapters.decode import fast_jpeg_available

    bs = args.batch_size
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        root = make_dataset_on_disk(Path(tmp) / "jpegs", args.images, size=256, width=320)
        loaders = {
            "tf.data (origin docs)": origin_tf_data(root, bs),
            "make_dataset": make_dataset(root, batch_size=bs, image_size=(SIZE, SIZE)),
            "plain DataLoader": plain_torch(root, bs, cpus()),
            "make_loader": make_loader(root, batch_size=bs, image_size=(SIZE, SIZE), log_every=0),
        }
        if args.worker_process:
            loaders["make_loader, 1 worker"] = make_loader(
                root, batch_size=bs, image_size=(SIZE, SIZE), num_workers=1,
                decode_threads=cpus(), log_every=0)
        serial = lambda: serial_batches(root, bs, SIZE)  # noqa: E731
        for loader in loaders.values():                   # warm up: page cache, workers, tracing
            epoch(loader, 0.0)
        raw = {name: [] for name in loaders}
        per_cpu = {name: [] for name in loaders}
        for _ in range(args.rounds):
            for name, loader in loaders.items():
                result = epoch(loader, 0.0)
                raw[name].append(result["samples_per_s"])
                per_cpu[name].append(result["samples_per_cpu_s"])
        serial_rate = max(epoch(serial, 0.0)["samples_per_s"] for _ in range(2))
        step = bs / serial_rate                           # serial read+decode time per batch
        au = {name: max(epoch(loaders[name], step)["au"] for _ in range(args.rounds))
              for name in loaders if name.startswith(("make_dataset", "make_loader"))}
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"cores={cpus()} images={args.images} 320x256->{SIZE}x{SIZE} batch={bs} "
          f"rounds={args.rounds} load={load} fast_jpeg={fast_jpeg_available()}")
    print(f"{'pipeline':<24}{'samples/s best (min-max)':>28}{'vs make_dataset':>18}"
          f"{'samples/CPU-s':>16}{'vs make_dataset':>18}")
    ref = max(raw["make_dataset"])
    ref_cpu = max(per_cpu["make_dataset"])
    for name, rates in raw.items():
        print(f"{name:<24}{max(rates):>12.0f} ({min(rates):.0f}-{max(rates):.0f}){'':>6}"
              f"{max(rates) / ref:>12.2f}x{max(per_cpu[name]):>16.0f}"
              f"{max(per_cpu[name]) / ref_cpu:>17.2f}x")
    print(f"serial read+decode: {serial_rate:.0f} samples/s -> step {step * 1e3:.1f} ms/batch")
    for name, value in au.items():
        print(f"AU {name:<21}{value:>12.1%}   (goal >= 95%)")
    ratio = max(raw["make_loader"]) / ref
    print(f"make_loader / make_dataset = {ratio:.2f}x (goal >= 0.9x): "
          f"{'met' if ratio >= 0.9 else 'NOT met'}")


if __name__ == "__main__":
    main()

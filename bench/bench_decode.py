"""Benchmark: CPU seconds per image for the batched loader's JPEG decoder
(adapters/decode.py: simplejpeg + OpenCV's resize) against Pillow's decode + bilinear
resize, the baseline, in the same run.

JPEGs of noisy gradients, 320×256, decoded and resized to 224×224 in one thread
(process CPU time, so other load on the machine counts less than in wall time). Each
round times both over the same 200 images, one after the other; the figures are the
medians of 7 rounds, and of the per-round ratios.

    .venv/bin/python bench/bench_decode.py
"""

from __future__ import annotations

import io
import statistics
import time

import numpy as np
from PIL import Image

from hotcache.adapters.decode import decode_array, fast_jpeg_available, pillow_decode

ROUNDS, IMAGES, SIZE = 7, 200, (224, 224)


def jpegs() -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(IMAGES):
        px = np.linspace(0, 200, 320)[None, :, None] + rng.normal(0, 30, (256, 320, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def per_image(decode, images: list[bytes]) -> float:
    t0 = time.process_time()
    for data in images:
        decode(data)
    return (time.process_time() - t0) / len(images)


def main() -> None:
    if not fast_jpeg_available():
        raise SystemExit("simplejpeg and an OpenCV package (cv2) are needed for this benchmark")
    images = jpegs()
    rounds = []
    for _ in range(ROUNDS):
        fast = per_image(lambda data: decode_array(data, SIZE), images)
        pillow = per_image(lambda data: np.asarray(pillow_decode(io.BytesIO(data), SIZE)),
                           images)
        rounds.append((fast, pillow, pillow / fast))
    fast, pillow, ratio = (statistics.median(r[i] for r in rounds) for i in range(3))
    print(f"per image (CPU, median of {ROUNDS} rounds): simplejpeg+OpenCV {fast * 1e3:.3f} ms, "
          f"Pillow {pillow * 1e3:.3f} ms; Pillow/fast = {ratio:.2f}x "
          f"(rounds {min(r[2] for r in rounds):.2f}-{max(r[2] for r in rounds):.2f}x)")


if __name__ == "__main__":
    main()

"""Decoding an image file into a uint8 H×W×3 array of a fixed size, as fast as the CPU
allows. Used by the PyTorch loader's batched path; no torch here.

Two decoders, chosen per file:
- JPEG with `simplejpeg` (the `torch` extra installs it) and any OpenCV package's `cv2`:
  libjpeg-turbo decodes (at 1/2, 1/4 or 1/8 scale when that still covers the target
  size, as Pillow's `draft` does), and OpenCV resizes. OpenCV's INTER_LINEAR with
  half-pixel centres is what `tf.image.resize(..., "bilinear")` computes, so
  `make_loader` and `make_dataset` give the same pixels to within about 1.3 levels of
  255 (chroma upsampling and rounding; Pillow's antialiased bilinear is 2-3.5 levels
  away). Both release the GIL, so threads decode in parallel, and they cost about
  half the CPU seconds per image of Pillow's decode + bilinear resize (BENCHMARKS.md).
- Anything else (PNG, GIF, other formats, or the libraries absent): Pillow, with the same
  filter name (Pillow's filters antialias when shrinking, so pixels differ a little).

A JPEG the fast decoder refuses (truncated, or with a defect libjpeg-turbo only warns
about) goes to Pillow, which decides as it would for torchvision's ImageFolder: with
`PIL.ImageFile.LOAD_TRUNCATED_IMAGES = True` it loads what is there. A file neither can
decode raises ImageDecodeError (an OSError) naming the file.
"""

from __future__ import annotations

import io
import os
from typing import IO, TYPE_CHECKING

import numpy as np

from .errors import ImageDecodeError
from .retry import read_bytes

if TYPE_CHECKING:
    import PIL.Image

RESAMPLE = ("bilinear", "nearest", "bicubic", "area", "lanczos")
_PIL_FILTER = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "area": 4}

try:                                   # optional: the fast path
    import cv2
    import simplejpeg

    cv2.setNumThreads(1)               # parallelism comes from our threads and workers
    _CV2_FILTER = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR,
                   "bicubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA,
                   "lanczos": cv2.INTER_LANCZOS4}
except ImportError:                    # Pillow alone still works, only slower
    cv2 = simplejpeg = None  # type: ignore[assignment]


def fast_jpeg_available() -> bool:
    return simplejpeg is not None


def check_resample(resample: str) -> str:
    if resample not in RESAMPLE:
        raise ValueError(f"resample={resample!r}: use one of {', '.join(RESAMPLE)}")
    return resample


def decode_array(path: str | os.PathLike[str] | bytes, size: tuple[int, int],
                 resample: str = "bilinear", draft: bool = True, name: str | None = None) -> np.ndarray:
    """The image at `path` (or in these bytes) as uint8 (height, width, 3), resized to
    size=(height, width), the order tf.image.resize and torchvision's Resize use.
    `name`: the file, for errors, when `path` is its bytes."""
    if isinstance(path, bytes):
        data = path
    else:
        name = os.fsdecode(path)
        data = read_bytes(path)             # an EIO retried while a cache fails over
    if simplejpeg is not None and data[:2] == b"\xff\xd8":
        try:
            return _fast_jpeg(data, size, resample, draft)
        except ValueError:
            pass        # Pillow decides, by its own rules (LOAD_TRUNCATED_IMAGES)
    return np.asarray(pillow_decode(io.BytesIO(data), size, draft, resample, name=name))


def _fast_jpeg(data: bytes, size: tuple[int, int], resample: str, draft: bool) -> np.ndarray:
    """libjpeg-turbo (simplejpeg, strict: a warning is an error), then OpenCV's resize."""
    height, width = size
    full_h, full_w = simplejpeg.decode_jpeg_header(data)[:2]
    scale = draft_scale((full_h, full_w), (height, width)) if draft else 1
    # libjpeg-turbo picks the smallest DCT scale giving at least these sizes: 1/scale
    img: np.ndarray = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-full_h // scale),
                                 min_width=-(-full_w // scale)) if scale > 1 else \
        simplejpeg.decode_jpeg(data, colorspace="RGB")
    if img.shape[1] != width or img.shape[0] != height:
        img = cv2.resize(img, (width, height), interpolation=_CV2_FILTER[resample])
    return img


def draft_scale(full: tuple[int, int], target: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 (else 1) by which a (height, width) JPEG can be decoded
    smaller and still cover `target`: what Pillow's `draft` does. Finer DCT scales (7/8,
    3/4...) are left out on purpose: they sharpen differently from a bilinear resize."""
    for scale in (8, 4, 2):
        if full[0] // scale >= target[0] and full[1] // scale >= target[1]:
            return scale
    return 1


def pillow_decode(path: str | os.PathLike[str] | IO[bytes], size: tuple[int, int] | None, draft: bool = True,
                  resample: str = "bilinear", name: str | None = None) -> PIL.Image.Image:
    """A PIL RGB image, resized to size=(height, width) when given (scaled JPEG decoding
    first when `draft`: several times less work for nearly the same pixels). A file that
    cannot be decoded raises ImageDecodeError naming it (`name` when `path` is a file
    object)."""
    from PIL import Image   # start-up: only where Pillow decodes; the cv2 path never loads it

    wh = (size[1], size[0]) if size else None    # Pillow counts (width, height)
    if not hasattr(path, "read"):
        name = os.fsdecode(path)
        # a missing file keeps its own error; an EIO is retried while a cache fails over
        return pillow_decode(io.BytesIO(read_bytes(path)), size, draft, resample, name)
    try:
        with Image.open(path) as im:
            if draft and wh:
                im.draft("RGB", wh)
            img = im.convert("RGB")
    except (OSError, ValueError, SyntaxError) as exc:   # Pillow's errors for a bad file
        raise ImageDecodeError(f"{name or 'image'}: cannot decode: {exc}", name) from exc
    return img.resize(wh, _PIL_FILTER[resample]) if wh else img

"""Random crops of training images: the crop, its scale and its flip drawn from a per-sample generator."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from gantool.core.processing import image_to_array


def random_crop_resize(img: Image.Image, size: int, rng: np.random.Generator) -> np.ndarray:
    """Random scale (shorter side between ``size`` and its own length), random
    square crop, random horizontal flip -> float32 3 x size x size."""
    width, height = img.size
    short = min(width, height)
    target = int(rng.integers(size, max(size, short) + 1))
    scale = target / short
    new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
    if (new_w, new_h) != (width, height):
        img = img.resize((new_w, new_h), Image.Resampling.BICUBIC, reducing_gap=3.0)
    left = int(rng.integers(0, new_w - size + 1))
    top = int(rng.integers(0, new_h - size + 1))
    arr = image_to_array(img.crop((left, top, left + size, top + size)))
    if rng.random() < 0.5:
        arr = arr[:, ::-1]
    return np.ascontiguousarray(np.clip(arr, 0.0, 1.0).transpose(2, 0, 1))


def random_scaled_crop(
    img: Image.Image, size: int, scale_range: tuple[float, float], rng: np.random.Generator
) -> np.ndarray:
    """A square window whose side is ``size`` times a log-uniform factor in ``scale_range``
    (capped by the image's shorter side), at a random place, resized to ``size``, flipped
    at random -> float32 3 x size x size. One resize straight from the window (PIL's
    ``box``), so a large photo is never scaled as a whole per sample."""
    width, height = img.size
    short = min(width, height)
    high = min(scale_range[1] * size, short)
    low = min(scale_range[0] * size, high)
    side = max(1, int(round(math.exp(rng.uniform(math.log(low), math.log(high))))))
    left = int(rng.integers(0, width - side + 1))
    top = int(rng.integers(0, height - side + 1))
    window = (left, top, left + side, top + side)
    arr = image_to_array(img.resize((size, size), Image.Resampling.BICUBIC, box=window, reducing_gap=3.0))
    if rng.random() < 0.5:
        arr = arr[:, ::-1]
    return np.ascontiguousarray(np.clip(arr, 0.0, 1.0).transpose(2, 0, 1))

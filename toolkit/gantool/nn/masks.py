"""Seeded hole generators. Convention everywhere: 1 = hole, 0 = known.

Each generator returns ``(mask, corner)``: a float32 H x W array and the
(top, left) corner of the ``local_size`` window that contains the whole hole,
which is also the local discriminator's crop (GLCIC).

- ``box``: GLCIC: a random local window, a random rectangle inside it.
- ``free``: DeepFill v2 brush strokes (random walks of random width), drawn
  inside the local window.
- ``mixed``: box or free with equal odds (as LaMa mixes its mask kinds).
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from gantool.core.constants import MASK_KINDS


def _local_corner(rng: np.random.Generator, height: int, width: int, local_size: int) -> tuple[int, int]:
    top = int(rng.integers(0, height - local_size + 1))
    left = int(rng.integers(0, width - local_size + 1))
    return top, left


def box_mask(
    rng: np.random.Generator,
    size: int | tuple[int, int],
    local_size: int,
    hole_range: tuple[int, int] | None = None,
) -> tuple[np.ndarray, tuple[int, int]]:
    """A rectangle of random sides in ``hole_range`` inside a random local window."""
    height, width = (size, size) if isinstance(size, int) else size
    lo, hi = hole_range or (max(1, local_size // 2), local_size)
    top, left = _local_corner(rng, height, width, local_size)
    hole_h, hole_w = (int(rng.integers(lo, hi + 1)) for _ in range(2))
    y = top + int(rng.integers(0, local_size - hole_h + 1))
    x = left + int(rng.integers(0, local_size - hole_w + 1))
    mask = np.zeros((height, width), np.float32)
    mask[y : y + hole_h, x : x + hole_w] = 1.0
    return mask, (top, left)


def free_form_mask(
    rng: np.random.Generator,
    size: int | tuple[int, int],
    local_size: int,
    hole_range: tuple[int, int] | None = None,
) -> tuple[np.ndarray, tuple[int, int]]:
    """DeepFill v2 strokes: 1-3 strokes of 4-12 vertices, angle 2pi/5 +- 2pi/15 with
    alternating direction, steps ~ N(r, r/2) with r = diagonal / 8, and widths
    12-40 px at a 256-px scale, all drawn inside the local window."""
    del hole_range  # strokes are sized from the window, not a box range
    height, width = (size, size) if isinstance(size, int) else size
    top, left = _local_corner(rng, height, width, local_size)
    scale = local_size / 256.0
    min_width, max_width = max(2, round(12 * scale)), max(3, round(40 * scale))
    mean_angle, angle_range = 2 * math.pi / 5, 2 * math.pi / 15
    radius = math.hypot(local_size, local_size) / 8

    canvas = Image.new("L", (local_size, local_size), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(1, 4))):
        vertices = int(rng.integers(4, 13))
        angles = rng.uniform(mean_angle - angle_range, mean_angle + angle_range, vertices)
        angles[::2] = 2 * math.pi - angles[::2]
        x, y = float(rng.uniform(0, local_size)), float(rng.uniform(0, local_size))
        points = [(x, y)]
        for angle in angles:
            step = float(np.clip(rng.normal(radius, radius / 2), 0, 2 * radius))
            x = float(np.clip(x + step * math.cos(angle), 0, local_size - 1))
            y = float(np.clip(y + step * math.sin(angle), 0, local_size - 1))
            points.append((x, y))
        stroke = int(rng.integers(min_width, max_width + 1))
        draw.line(points, fill=255, width=stroke)
        for px, py in points:  # round joints, as DeepFill draws them
            r = stroke / 2
            draw.ellipse((px - r, py - r, px + r, py + r), fill=255)
    if rng.random() < 0.5:  # DeepFill also flips strokes at random
        canvas = canvas.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    mask = np.zeros((height, width), np.float32)
    mask[top : top + local_size, left : left + local_size] = np.asarray(canvas) > 127
    return mask, (top, left)


def generate_mask(
    kind: str,
    rng: np.random.Generator,
    size: int | tuple[int, int],
    local_size: int,
    hole_range: tuple[int, int] | None = None,
) -> tuple[np.ndarray, tuple[int, int]]:
    """Dispatch on ``kind`` (box, free or mixed)."""
    if kind == "mixed":
        kind = "box" if rng.random() < 0.5 else "free"
    if kind == "box":
        return box_mask(rng, size, local_size, hole_range)
    if kind == "free":
        return free_form_mask(rng, size, local_size, hole_range)
    raise ValueError(f"unknown mask kind {kind!r}; expected one of {MASK_KINDS}")


def hole_window(mask: np.ndarray, local_size: int) -> tuple[int, int]:
    """The (top, left) of a ``local_size`` window centred on the hole's bounding box."""
    height, width = mask.shape
    ys, xs = np.nonzero(mask > 0.5)
    if len(ys) == 0:
        cy, cx = height // 2, width // 2
    else:
        cy, cx = (ys.min() + ys.max()) // 2, (xs.min() + xs.max()) // 2
    top = int(np.clip(cy - local_size // 2, 0, height - local_size))
    left = int(np.clip(cx - local_size // 2, 0, width - local_size))
    return top, left

"""What one request costs before the model runs: pixels, windows, holes, blending, peak memory.

One estimate for every caller: ``gantool serve`` refuses a request over its limits
(``--max-model-pixels``, ``--max-holes``, ``--max-blend-pixels``) before queueing it, and
``gantool inpaint`` refuses an image whose estimate exceeds the memory this machine has
available, with a message instead of the kernel's OOM killer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from gantool.core.errors import SizeLimitError
from gantool.core.processing import blend_pixels, import_cv2, padding_for
from gantool.inference.inpainter import plan_windows

# Peak bytes per pixel the model holds while it runs (activations and the runtime's arena):
# measured 1.10 GB per megapixel with the ONNX Runtime CPU provider (fp32) on 512 and
# 1024 px inputs (docs/serving.md); rounded up.
MODEL_BYTES_PER_PIXEL = 1200
# Per image pixel around the model: the decoded image (<= 4 B), the float32 mask (4),
# the boolean hole (1), the output copy (3), the finished image (3) and its encoding (~3),
# with room for a decoder's temporary copy.
IMAGE_BYTES_PER_PIXEL = 24
# Per model pixel outside the model: float32 crop (12), mask (4), padded copies (16),
# output (12), the window's float fill (12) and the blend's 8-bit buffers (~8).
WINDOW_BYTES_PER_PIXEL = 64
# Seconds per pixel the Poisson blend solves over (poisson_blend on square holes of 16-2000 px and
# on 1,000 small holes, a loaded 2-core AMD EPYC; docs/serving.md): the range a warning quotes.
BLEND_SECONDS_PER_PIXEL = (3e-6, 10e-6)


@dataclass(frozen=True)
class Cost:
    """The estimate for one image (see :func:`estimate_cost`)."""

    image_pixels: int
    holes: int  # 8-connected hole components
    windows: int  # model inputs
    model_pixels: int  # padded pixels through the model, all windows together
    largest_window_pixels: int
    peak_bytes: int  # this image's peak, with ``batch`` of its largest windows at once
    # Pixels the Poisson blend solves over (each hole's box plus the blend's margin; 0 for
    # blend "none"): its time follows this area, not the number of holes.
    blend_pixels: int = 0

    def describe(self) -> str:
        return (
            f"{self.holes} holes, {self.windows} model windows, {self.model_pixels} model pixels, "
            f"{self.blend_pixels} blend pixels, about {self.peak_bytes / 2**30:.1f} GiB"
        )


def count_holes(mask: np.ndarray) -> int:
    """8-connected hole components (the crop windows and the blend's solves follow them)."""
    hole = np.asarray(mask) > 0.5
    if not hole.any():
        return 0
    count, _ = import_cv2().connectedComponents(hole.view(np.uint8), connectivity=8)
    return int(count) - 1


def check_holes(mask: np.ndarray, max_holes: int, name: str = "--max-holes") -> int:
    """The hole count of ``mask`` if at most ``max_holes``; else :class:`SizeLimitError` naming
    ``name``. One connected-components pass and nothing else: the cheap check to run before
    decoding the image or planning anything (a mask with 1,000 holes is refused in milliseconds)."""
    holes = count_holes(mask)
    if holes > max_holes:
        raise SizeLimitError(f"the mask has {holes} separate holes, over {name} ({max_holes})")
    return holes


def estimate_cost(
    mask: np.ndarray,
    strategy: str,
    train_size: int,
    size_multiple: int,
    crop_margin: int | None = None,
    batch: int = 1,
    max_holes: int | None = None,
    blend: str = "none",
) -> Cost:
    """The cost of inpainting an image with hole ``mask`` (H x W) by ``strategy``, then
    post-processing it by ``blend``.

    The windows are planned as :func:`gantool.inference.inpainter.plan_windows` plans them
    (near-linear in the hole count), so this is cheap next to the model. With
    ``max_holes``, more holes raise :class:`SizeLimitError` before any planning. For
    ``blend`` "poisson" the blend's area comes from :func:`gantool.core.processing.blend_regions`,
    the regions the blend solves (``gantool inpaint`` leaves it at "none": no limit there reads it,
    and finding those regions costs a pass over the mask).
    """
    height, width = mask.shape
    holes = count_holes(mask)
    if max_holes is not None:
        check_cost(Cost(height * width, holes, 0, 0, 0, 0), max_holes=max_holes)
    blended = blend_pixels(np.asarray(mask) > 0.5) if blend == "poisson" else 0
    windows = plan_windows(mask, strategy, train_size, crop_margin)
    sizes = []
    for window in windows:
        h, w = window.scaled_to or (window.height, window.width)
        top, bottom, left, right = padding_for(h, w, size_multiple)
        sizes.append((h + top + bottom) * (w + left + right))
    model_pixels = sum(sizes)
    largest = max(sizes, default=0)
    at_once = largest * min(max(1, batch), max(1, len(sizes)))
    peak = (
        height * width * IMAGE_BYTES_PER_PIXEL + at_once * MODEL_BYTES_PER_PIXEL + model_pixels * WINDOW_BYTES_PER_PIXEL
    )
    return Cost(height * width, holes, len(windows), model_pixels, largest, peak, blended)


def check_cost(
    cost: Cost,
    *,
    max_model_pixels: int | None = None,
    max_holes: int | None = None,
    max_bytes: int | None = None,
    max_blend_pixels: int | None = None,
    names: tuple[str, str, str, str] = (
        "--max-model-pixels",
        "--max-holes",
        "the available memory",
        "--max-blend-pixels",
    ),
) -> Cost:
    """``cost`` if it is within the limits; else :class:`SizeLimitError` naming the limit."""
    if max_holes is not None and cost.holes > max_holes:
        raise SizeLimitError(f"the mask has {cost.holes} separate holes, over {names[1]} ({max_holes})")
    if max_blend_pixels is not None and cost.blend_pixels > max_blend_pixels:
        raise SizeLimitError(
            f"blending these holes would solve over {cost.blend_pixels} pixels (their boxes plus a margin), "
            f"over {names[3]} ({max_blend_pixels}); send blend=none, or smaller holes"
        )
    if max_model_pixels is not None and cost.model_pixels > max_model_pixels:
        raise SizeLimitError(
            f"this request would run {cost.model_pixels} pixels through the model ({cost.windows} windows), "
            f"over {names[0]} ({max_model_pixels}); use strategy crop or resize, or fewer holes"
        )
    if max_bytes is not None and cost.peak_bytes > max_bytes:
        raise SizeLimitError(
            f"inpainting this image needs about {cost.peak_bytes / 2**30:.1f} GiB, over {names[2]} "
            f"({max_bytes / 2**30:.1f} GiB); use --strategy crop or resize"
        )
    return cost


def blend_warning(cost: Cost, max_blend_pixels: int, name: str = "--max-blend-pixels") -> str | None:
    """For ``gantool inpaint``: a one-line warning when the blend of ``cost`` solves over more
    than ``max_blend_pixels`` (0: never), with how long that takes; None within the limit.

    The CLI warns where the server refuses (:func:`check_cost`): a CLI run has no other
    clients to protect, and its user asked for this job, so it runs, but not silently."""
    if not max_blend_pixels or cost.blend_pixels <= max_blend_pixels:
        return None
    low, high = (cost.blend_pixels * rate for rate in BLEND_SECONDS_PER_PIXEL)
    return (
        f"blending these holes solves over {cost.blend_pixels} pixels (their boxes plus a margin), over "
        f"{name} ({max_blend_pixels}): about {_duration(low)} to {_duration(high)} on one core; "
        "--blend none skips it"
    )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def serve_memory_bound(
    base_bytes: int, max_queue: int, max_body_bytes: int, max_pixels: int, max_model_pixels: int
) -> dict[str, int]:
    """The documented bound on ``gantool serve``'s peak memory (docs/serving.md, "Memory bound"),
    term by term, and its ``total``: the loaded model and runtime (``base_bytes``, measured),
    the bodies being read (``max_queue`` x ``max_body_bytes``), the admitted images
    (``max_queue`` x ``max_pixels`` x IMAGE_BYTES_PER_PIXEL) and one model batch (batches are
    cut at ``max_model_pixels``: x MODEL_BYTES_PER_PIXEL for the activations, and
    WINDOW_BYTES_PER_PIXEL for its windows' crops, padded copies and outputs)."""
    terms = {
        "model_and_runtime": base_bytes,
        "bodies": max_queue * max_body_bytes,
        "images": max_queue * max_pixels * IMAGE_BYTES_PER_PIXEL,
        "model_batch": max_model_pixels * (MODEL_BYTES_PER_PIXEL + WINDOW_BYTES_PER_PIXEL),
    }
    return {**terms, "total": sum(terms.values())}


def available_memory() -> int | None:
    """Bytes of memory this process can still take (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None

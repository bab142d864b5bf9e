"""Where the model runs on an image, and the Python API (:class:`Inpainter`).

Reads top-down:

1. strategies: where the model runs on an image (``full``, ``crop`` windows
   around holes, or ``resize``), how same-size model inputs are batched and how
   results are pasted back (:func:`inpaint_images`, :func:`inpaint_arrays`);
2. mask inputs: a mask image, path or array, the alpha channel, ``--box`` rectangles;
3. :class:`Inpainter`: a backend opened once, with the strategy options.

The file pipeline (folders, outputs, reader and writer threads) is
:mod:`gantool.inference.pipeline`. Pixel conversions, padding and compositing come from
:mod:`gantool.core.processing`. Only hole pixels ever change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from gantool.core.config import ModelConfig
from gantool.core.constants import (
    AUTO_CROP_FACTOR,
    CROP_MARGIN_FRACTION,
    DEFAULT_BACKEND,
    DEFAULT_BLEND,
    DEFAULT_INPAINT_BATCH,
    DEFAULT_PRECISION,
    DEFAULT_PROVIDER,
    DEFAULT_STRATEGY,
    STRATEGIES,
)
from gantool.core.errors import InputError, check_choice
from gantool.core.processing import (
    alpha_hole_mask,
    blend_output,
    check_blend,
    check_lossless,
    crop_padding,
    float_to_output_array,
    image_to_array,
    image_to_output_array,
    import_cv2,
    keep_colour_profile,
    mask_to_array,
    output_array_to_image,
    output_mode,
    pad_to_multiple,
    paste_holes,
    read_image,
    resize_array,
    resize_mask,
)
from gantool.inference.planning import merge_overlapping
from gantool.runtime.backends import Backend, load_backend

# -------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Window:
    """A region of the image the model runs on; ``scaled_to`` = (h, w) resizes it first."""

    top: int
    left: int
    height: int
    width: int
    scaled_to: tuple[int, int] | None = None

    @property
    def region(self) -> tuple[slice, slice]:
        """(rows, columns) of the window in the full image."""
        return slice(self.top, self.top + self.height), slice(self.left, self.left + self.width)

    def overlaps(self, other: Window) -> bool:
        return (
            self.top < other.top + other.height
            and other.top < self.top + self.height
            and self.left < other.left + other.width
            and other.left < self.left + self.width
        )

    def union(self, other: Window) -> Window:
        top, left = min(self.top, other.top), min(self.left, other.left)
        bottom = max(self.top + self.height, other.top + other.height)
        right = max(self.left + self.width, other.left + other.width)
        return Window(top, left, bottom - top, right - left)


def choose_strategy(strategy: str, height: int, width: int, train_size: int) -> str:
    """Resolve ``auto``: ``crop`` above AUTO_CROP_FACTOR x the train size, else ``full``."""
    check_choice("strategy", strategy, STRATEGIES)
    if strategy == "auto":
        return "crop" if max(height, width) > AUTO_CROP_FACTOR * train_size else "full"
    return strategy


def hole_boxes(mask: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Bounding boxes (top, left, bottom, right; exclusive) of the 8-connected holes,
    sorted (OpenCV's connected components)."""
    hole = np.asarray(mask) > 0.5
    if not hole.any():
        return []
    cv2 = import_cv2()  # a core dependency; a broken install gets one line, not a traceback
    count, _, stats, _ = cv2.connectedComponentsWithStats(hole.view(np.uint8), connectivity=8)
    boxes = (
        (int(top), int(left), int(top + height), int(left + width))
        for left, top, width, height, _ in stats[1:count]  # label 0 is the background
    )
    return sorted(boxes)


def _span(lo: int, hi: int, min_length: int, limit: int) -> tuple[int, int]:
    """Grow [lo, hi) to ``min_length`` around its centre, then shift it inside [0, limit)."""
    if hi - lo < min_length:
        extra = min_length - (hi - lo)
        lo, hi = lo - extra // 2, hi + extra - extra // 2
    if lo < 0:
        lo, hi = 0, min(limit, hi - lo)
    if hi > limit:
        lo, hi = max(0, lo - (hi - limit)), limit
    return lo, hi


def crop_windows(mask: np.ndarray, train_size: int, margin: int | None = None) -> list[Window]:
    """Windows around the holes: each hole's box plus ``margin`` of context, at
    least ``train_size`` square, merged while any two overlap (so every hole
    pixel belongs to exactly one window)."""
    height, width = mask.shape
    if margin is None:
        margin = max(4, round(train_size * CROP_MARGIN_FRACTION))
    boxes = []
    for top, left, bottom, right in hole_boxes(mask):
        t, b = _span(top - margin, bottom + margin, train_size, height)
        l, r = _span(left - margin, right + margin, train_size, width)
        boxes.append((t, l, b, r))
    # Every window is at least min(train_size, image side) high and wide: the grid's cell.
    merged = merge_overlapping(boxes, min(train_size, height, width))
    return [Window(t, l, b - t, r - l) for t, l, b, r in merged]


def plan_windows(mask: np.ndarray, strategy: str, train_size: int, crop_margin: int | None = None) -> list[Window]:
    """Where the model runs for one image (no windows for an empty mask)."""
    height, width = mask.shape
    if not (mask > 0.5).any():
        return []
    strategy = choose_strategy(strategy, height, width, train_size)
    if strategy == "crop":
        return crop_windows(mask, train_size, crop_margin)
    if strategy == "resize" and max(height, width) > train_size:
        scale = train_size / max(height, width)
        size = (max(1, round(height * scale)), max(1, round(width * scale)))
        return [Window(0, 0, height, width, scaled_to=size)]
    return [Window(0, 0, height, width)]


@dataclass
class _Task:
    item: int
    window: Window
    image: np.ndarray  # 1 x 3 x h x w, padded
    mask: np.ndarray  # 1 x 1 x h x w, padded
    pad: tuple[int, int, int, int]


def _prepare(item: int, crop: np.ndarray, crop_mask: np.ndarray, window: Window, multiple: int) -> _Task:
    if window.scaled_to is not None:
        crop, crop_mask = resize_array(crop, window.scaled_to), resize_mask(crop_mask, window.scaled_to)
    batch_image = np.ascontiguousarray(crop.transpose(2, 0, 1)[None], dtype=np.float32)
    batch_mask = np.ascontiguousarray(crop_mask[None, None], dtype=np.float32)
    padded_image, padded_mask, pad = pad_to_multiple(batch_image, batch_mask, multiple)
    return _Task(item, window, padded_image, padded_mask, pad)


def _run_grouped(
    backend: Backend, tasks: list[_Task], batch_size: int, release_memory_pixels: int = 0
) -> list[np.ndarray]:
    """Run tasks of the same shape together, at most ``batch_size`` at a time."""
    outputs: list[np.ndarray | None] = [None] * len(tasks)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for index, task in enumerate(tasks):
        by_shape.setdefault(task.image.shape, []).append(index)
    for indices in by_shape.values():
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            result = backend.run(
                np.concatenate([tasks[i].image for i in chunk]),
                np.concatenate([tasks[i].mask for i in chunk]),
                release_memory_pixels,
            )
            for row, i in enumerate(chunk):
                outputs[i] = result[row : row + 1]
    return outputs  # type: ignore[return-value]


# A function giving the float H x W x 3 pixels of one window: only the windows the
# model runs on are converted to float, not the whole (possibly huge) image.
WindowPixels = Callable[[Window], np.ndarray]


def _fill_windows(
    backend: Backend,
    items: Sequence[tuple[WindowPixels, np.ndarray]],
    strategy: str,
    batch_size: int,
    crop_margin: int | None,
    blend: str = DEFAULT_BLEND,
    release_memory_pixels: int = 0,
) -> list[list[tuple[Window, np.ndarray]]]:
    """For each (pixels, mask): its windows and the model's float output for each,
    at the window's own size, post-processed by ``blend`` (per window).
    ``release_memory_pixels``: see :meth:`Backend.run`."""
    tasks = []
    for item, (pixels, mask) in enumerate(items):
        for window in plan_windows(mask, strategy, backend.train_size, crop_margin):
            tasks.append(_prepare(item, pixels(window), mask[window.region], window, backend.size_multiple))
    fills: list[list[tuple[Window, np.ndarray]]] = [[] for _ in items]
    for task, out in zip(tasks, _run_grouped(backend, tasks, batch_size, release_memory_pixels)):
        filled = crop_padding(out, task.pad)[0].transpose(1, 2, 0)
        if task.window.scaled_to is not None:
            filled = resize_array(filled, (task.window.height, task.window.width))
        if blend != "none":
            pixels, mask = items[task.item]
            filled = blend_output(pixels(task.window), filled, mask[task.window.region], blend)
        fills[task.item].append((task.window, filled))
    return fills


def inpaint_arrays(
    backend: Backend,
    items: Sequence[tuple[np.ndarray, np.ndarray]],
    strategy: str = DEFAULT_STRATEGY,
    batch_size: int = DEFAULT_INPAINT_BATCH,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
) -> list[np.ndarray]:
    """Inpaint float H x W x 3 images with H x W masks (1 = hole); any sizes.

    Returns float H x W x 3 arrays in which only hole pixels differ from the input.
    ``blend`` (a BLEND_MODES name) post-processes each window's model output.
    """
    check_blend(blend)
    for image, mask in items:
        if image.shape[:2] != mask.shape:
            raise InputError(f"mask is {mask.shape[1]}x{mask.shape[0]} but image is {image.shape[1]}x{image.shape[0]}")
    sources = [(lambda w, image=image: image[w.region], mask) for image, mask in items]
    results = [np.array(image, dtype=np.float32, copy=True) for image, _ in items]
    for result, (_, mask), fills in zip(
        results, items, _fill_windows(backend, sources, strategy, batch_size, crop_margin, blend)
    ):
        for window, filled in fills:
            region = result[window.region]
            region[...] = paste_holes(region, filled, mask[window.region])
    return results


ModelFills = list[tuple[Window, np.ndarray]]  # one image's windows and the model's output for each


def _image_window_pixels(image: Image.Image) -> WindowPixels:
    return lambda w: image_to_array(image.crop((w.left, w.top, w.left + w.width, w.top + w.height)))


def fill_images(
    backend: Backend,
    items: Sequence[tuple[Image.Image, np.ndarray]],
    strategy: str = DEFAULT_STRATEGY,
    batch_size: int = DEFAULT_INPAINT_BATCH,
    crop_margin: int | None = None,
    release_memory_pixels: int = 0,
) -> list[ModelFills]:
    """The model step of :func:`inpaint_images`: for each (image, H x W mask), its
    windows and the model's float output for each, neither blended nor composited.
    :func:`finish_image` turns one into the result, on any thread. A model run over at
    least ``release_memory_pixels`` pixels gives its memory back (:meth:`Backend.run`)."""
    for image, mask in items:
        check_mask_size(mask, image, "mask", "image")
    sources = [(_image_window_pixels(image), mask) for image, mask in items]
    return _fill_windows(backend, sources, strategy, batch_size, crop_margin, "none", release_memory_pixels)


def finish_image(image: Image.Image, mask: np.ndarray, fills: ModelFills, blend: str = DEFAULT_BLEND) -> Image.Image:
    """The step after the model: each window's output post-processed by ``blend``
    (BLEND_MODES), then written into the holes of a copy of ``image``. The result
    has the input's size and its family's mode (RGB, L or 16-bit I;16); known
    pixels are copied from the decoded input unchanged."""
    check_blend(blend)
    pixels = _image_window_pixels(image)
    mode = output_mode(image)
    known = np.array(image_to_output_array(image), copy=True)
    for window, filled in fills:
        if blend != "none":
            filled = blend_output(pixels(window), filled, mask[window.region], blend)
        region = known[window.region]
        region[...] = paste_holes(region, float_to_output_array(filled, mode), mask[window.region])
    return keep_colour_profile(image, output_array_to_image(known, mode))


def inpaint_images(
    backend: Backend,
    items: Sequence[tuple[Image.Image, np.ndarray]],
    strategy: str = DEFAULT_STRATEGY,
    batch_size: int = DEFAULT_INPAINT_BATCH,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
) -> list[Image.Image]:
    """Inpaint PIL images (H x W masks, 1 = hole): :func:`fill_images`, then
    :func:`finish_image` for each. ``blend``: the post-processing (BLEND_MODES)."""
    check_blend(blend)
    fills = fill_images(backend, items, strategy, batch_size, crop_margin)
    return [finish_image(image, mask, image_fills, blend) for (image, mask), image_fills in zip(items, fills)]


# ------------------------------------------------------------------------------- masks


def to_pil_image(obj: Image.Image | str | Path | np.ndarray, what: str = "image") -> Image.Image:
    """A PIL image from a PIL image, a path, or a uint8/uint16 array (H x W, H x W x 3 or x 4)."""
    if isinstance(obj, Image.Image):
        _check_not_empty(obj.width, obj.height, what)
        return check_lossless(obj, what)
    if isinstance(obj, (str, Path)):
        return read_image(obj, lossless=True)
    if isinstance(obj, np.ndarray):
        if obj.dtype not in (np.uint8, np.uint16) or obj.ndim not in (2, 3):
            raise InputError(
                f"{what} arrays must be uint8 (H x W [x 3|4]) or uint16 (H x W), got {obj.dtype} {obj.shape}"
            )
        if obj.dtype == np.uint16 and obj.ndim != 2:
            raise InputError(f"uint16 {what} arrays must be H x W (16-bit grey)")
        if obj.ndim == 3 and obj.shape[2] not in (3, 4):
            raise InputError(f"{what} arrays must have 3 or 4 channels, got {obj.shape[2]}")
        _check_not_empty(obj.shape[1], obj.shape[0], what)
        return Image.fromarray(np.ascontiguousarray(obj))
    raise InputError(f"{what} must be a PIL image, a path or a numpy array, got {type(obj).__name__}")


def _check_not_empty(width: int, height: int, what: str) -> None:
    if width < 1 or height < 1:
        raise InputError(f"the {what} is {width}x{height}: there is nothing to inpaint")


def check_mask_size(mask: np.ndarray, image: Image.Image, mask_name: str, image_name: str) -> np.ndarray:
    if mask.shape != (image.height, image.width):
        raise InputError(
            f"mask {mask_name} is {mask.shape[1]}x{mask.shape[0]} but {image_name} is "
            f"{image.width}x{image.height} (masks must match the displayed image size; no resizing)"
        )
    return mask


def load_mask(mask: Image.Image | str | Path | np.ndarray | None, image: Image.Image) -> np.ndarray:
    """An H x W float32 hole mask for ``image``: from ``mask`` (> 127 or 1 = hole) or,
    when ``mask`` is None, from the image's alpha channel (transparent = hole)."""
    if mask is None:
        alpha = alpha_hole_mask(image)
        if alpha is None:
            raise InputError("no mask: give one, or an image whose transparent pixels mark the holes")
        return alpha
    name = Path(mask).name if isinstance(mask, (str, Path)) else "array" if isinstance(mask, np.ndarray) else "image"
    if isinstance(mask, (str, Path)):
        mask = read_image(mask)
    array = mask_to_array(mask) if isinstance(mask, (Image.Image, np.ndarray)) else None
    if array is None:
        raise InputError(f"mask must be a PIL image, a path or a numpy array, got {type(mask).__name__}")
    return check_mask_size(array, image, name, "the image")


def parse_box(text: str, name: str = "--box") -> tuple[int, int, int, int]:
    """``"X,Y,W,H"`` in pixels of the displayed image -> (x, y, w, h). ``name``: what the
    user typed it into, for the error (``--box`` on the CLI, ``boxes`` in the API)."""
    parts = text.replace(" ", "").split(",")
    try:
        x, y, w, h = (int(p) for p in parts)
    except ValueError:
        raise InputError(f"{name} must be X,Y,W,H in whole pixels, got {text!r}") from None
    if w <= 0 or h <= 0:
        raise InputError(f"{name} width and height must be positive, got {text!r}")
    return x, y, w, h


def boxes_to_mask(boxes: Sequence[tuple[int, int, int, int]], width: int, height: int) -> np.ndarray:
    """Rectangles (x, y, w, h) as a hole mask, clipped to the image."""
    mask = np.zeros((height, width), np.float32)
    for x, y, w, h in boxes:
        if x >= width or y >= height or x + w <= 0 or y + h <= 0:
            raise InputError(f"box {x},{y},{w},{h} lies outside the {width}x{height} image")
        mask[max(0, y) : y + h, max(0, x) : x + w] = 1.0
    return mask


# --------------------------------------------------------------------------- Inpainter


class Inpainter:
    """Inpaint images with a gantool generator: the Python API of ``gantool inpaint``.

    >>> inpainter = Inpainter("runs/<run>/export")          # provider, backend: "auto"
    >>> result = inpainter.inpaint("photo.jpg", "mask.png")  # PIL image, same size
    >>> inpainter.provider                                    # what really runs

    ``model``: an export or run folder, a model file (.onnx, TorchScript .pt,
    checkpoint .pt, .safetensors), or None for the shipped model. ``strategy``
    is the default for :meth:`inpaint` (see :func:`plan_windows`). ``blend`` is
    the post-processing of the model's output: ``poisson`` (GLCIC's fast-marching
    fill + Poisson blending, :func:`gantool.core.processing.poisson_blend`) or ``none``.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        provider: str = DEFAULT_PROVIDER,
        backend: str = DEFAULT_BACKEND,
        *,
        strategy: str = DEFAULT_STRATEGY,
        batch_size: int = DEFAULT_INPAINT_BATCH,
        crop_margin: int | None = None,
        precision: str = DEFAULT_PRECISION,
        blend: str = DEFAULT_BLEND,
    ) -> None:
        check_choice("strategy", strategy, STRATEGIES)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch size must be a whole number >= 1, got {batch_size!r}")
        if crop_margin is not None and (not isinstance(crop_margin, int) or crop_margin < 0):
            raise InputError(f"crop margin must be a whole number >= 0, got {crop_margin!r}")
        self.blend = check_blend(blend)
        self.backend = load_backend(model, provider, backend, precision)
        self.strategy = strategy
        self.batch_size = batch_size
        self.crop_margin = crop_margin

    @property
    def provider(self) -> str:
        """The provider (ONNX Runtime) or torch device that really runs."""
        return self.backend.provider

    @property
    def provider_note(self) -> str:
        return self.backend.provider_note

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def metadata(self) -> dict[str, str]:
        return self.backend.metadata

    @property
    def config(self) -> ModelConfig:
        return self.backend.config

    def run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """NCHW float32 in, NCHW float32 out, any H and W (reflect-padded and cropped back)."""
        if image.ndim != 4 or mask.ndim != 4:
            raise InputError("run() takes N x 3 x H x W images and N x 1 x H x W masks")
        padded_image, padded_mask, pad = pad_to_multiple(
            np.asarray(image, np.float32), (np.asarray(mask) > 0.5).astype(np.float32), self.backend.size_multiple
        )
        return np.ascontiguousarray(crop_padding(self.backend.run(padded_image, padded_mask), pad))

    def inpaint(
        self,
        image: Image.Image | str | Path | np.ndarray,
        mask: Image.Image | str | Path | np.ndarray | None = None,
        strategy: str | None = None,
        blend: str | None = None,
    ) -> Image.Image:
        """Fill the holes of ``image`` and return a PIL image of the same size.

        ``image``: a PIL image, a path, or an H x W x 3 (or H x W) uint8/uint16 array.
        ``mask``: a PIL image, path or array; > 127 (8-bit) or 1 (0/1 arrays) = hole;
        None uses the image's alpha channel (transparent = hole). Only hole pixels
        change; the result is RGB, L or 16-bit (I;16) like the input's family.
        ``strategy`` and ``blend`` override the inpainter's defaults for this call.
        """
        pil_image = to_pil_image(image, "image")
        mask_array = load_mask(mask, pil_image)
        return inpaint_images(
            self.backend,
            [(pil_image, mask_array)],
            strategy=strategy or self.strategy,
            batch_size=self.batch_size,
            crop_margin=self.crop_margin,
            blend=blend or self.blend,
        )[0]

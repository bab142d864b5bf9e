"""``gantool eval``: a generator against classical inpainting on seeded holes.

Every image of a folder is centre-cropped to a square, resized to ``size`` and
quantized to 8 bits (that is the ground truth); a seeded hole
(:func:`gantool.nn.masks.generate_mask`) is cut into it; each method fills it from
the same 8-bit input, and its 8-bit result (what a user would save) is scored
against the truth with :mod:`gantool.nn.losses`:

- PSNR, SSIM and L1 over the whole image;
- PSNR and L1 over the hole pixels; SSIM over the hole's bounding box.

Methods: ``mean`` (the hole filled with the mean of the image's known pixels),
``telea`` and ``ns`` (OpenCV's ``cv2.inpaint`` with INPAINT_TELEA and
INPAINT_NS) and ``gantool`` (the model's raw output); with ``blend="poisson"``
also ``gantool_poisson``: the same output after GLCIC's post-processing
(:func:`gantool.core.processing.poisson_blend`), as ``gantool inpaint`` writes it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gantool.core.artifacts import META_TRAIN_STEP, META_WEIGHTS_SHA256
from gantool.core.constants import DEFAULT_BLEND, DEFAULT_EVAL_GRID, MASK_KINDS
from gantool.core.errors import InputError
from gantool.core.fileio import atomic_save, ensure_writable_dir
from gantool.core.processing import (
    blend_output,
    check_blend,
    image_to_array,
    import_cv2,
    read_image,
    resize_array,
    to_uint8,
)
from gantool.inference.inpainter import inpaint_arrays
from gantool.nn.masks import generate_mask
from gantool.runtime.backends import load_backend

log = logging.getLogger(__name__)

CLASSICAL_METHODS = ("mean", "telea", "ns")
METHOD_NAMES = {
    "mean": "mean-pixel fill",
    "telea": "OpenCV Telea",
    "ns": "OpenCV Navier-Stokes",
    "gantool": "gantool (raw output)",
    "gantool_poisson": "gantool + Poisson blend",
}
METRICS = ("psnr_hole", "psnr", "ssim_hole", "ssim", "l1_hole", "l1")
GRID_COLUMNS = ("masked", "telea", "ns", "gantool", "gantool_poisson", "truth")
INPAINT_RADIUS = 3  # cv2.inpaint's neighbourhood radius, as in OpenCV's own examples

# A PNG text chunk marks eval's own grids, so a grid is never scored as ground truth.
GRID_MARK = ("gantool", "eval-grid")


# ----------------------------------------------------------------------------- metrics


def image_metrics(prediction: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Metrics of one H x W x 3 float image in [0, 1] against ``truth`` (mask H x W, 1 = hole).

    Identical images give PSNR = +inf, SSIM = 1 and L1 = 0.
    """
    import torch

    from gantool.nn.losses import l1, psnr, ssim

    pred = torch.from_numpy(np.ascontiguousarray(prediction.transpose(2, 0, 1)[None], dtype=np.float32))
    real = torch.from_numpy(np.ascontiguousarray(truth.transpose(2, 0, 1)[None], dtype=np.float32))
    hole = torch.from_numpy(np.ascontiguousarray((mask > 0.5)[None, None], dtype=np.float32))
    ys, xs = np.nonzero(mask > 0.5)
    if len(ys):
        rows, cols = slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1)
        ssim_hole = float(ssim(pred[..., rows, cols], real[..., rows, cols])[0])
    else:
        ssim_hole = 1.0
    return {
        "psnr_hole": float(psnr(pred, real, hole)[0]),
        "psnr": float(psnr(pred, real)[0]),
        "ssim_hole": ssim_hole,
        "ssim": float(ssim(pred, real)[0]),
        "l1_hole": float(l1(pred, real, hole)[0]),
        "l1": float(l1(pred, real)[0]),
    }


# ------------------------------------------------------------------------------ data


def square_resize(image: np.ndarray, size: int) -> np.ndarray:
    """Centre square crop, resized to ``size`` x ``size``, quantized to 8 bits (as float)."""
    height, width = image.shape[:2]
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    crop = image[top : top + side, left : left + side]
    return to_uint8(resize_array(crop, (size, size))).astype(np.float32) / 255.0


def is_eval_grid(path: Path) -> bool:
    """Whether ``path`` is a grid written by ``gantool eval`` (marked, or the default name)."""
    if path.name == DEFAULT_EVAL_GRID:
        return True
    if path.suffix.lower() != ".png":
        return False
    try:
        with Image.open(path) as image:
            return image.info.get(GRID_MARK[0]) == GRID_MARK[1]
    except (OSError, ValueError):
        return False  # an unreadable file is reported when it is read


def find_eval_images(data: str | Path, count: int | None = None) -> list[Path]:
    from gantool.training.data import find_images

    found = find_images(data)
    paths = [p for p in found if not is_eval_grid(p)]
    if len(paths) < len(found):
        log.warning("ignored %d comparison grid(s) of gantool eval in %s", len(found) - len(paths), data)
    if not paths:
        raise InputError(f"no images in {data}")
    return paths[:count] if count else paths


GRID_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".bmp": "BMP", ".tif": "TIFF",
                ".tiff": "TIFF"}  # fmt: skip


def grid_format_for(grid: Path) -> str:
    """The Pillow format the grid's file name asks for; another suffix is refused before any work."""
    try:
        return GRID_FORMATS[grid.suffix.lower()]
    except KeyError:
        raise InputError(
            f"--grid {grid}: name a {', '.join(sorted(set(GRID_FORMATS)))} file (the suffix picks the format)"
        ) from None


def check_grid_outside_data(grid: Path, data: Path) -> None:
    """eval never writes into its data: a grid there would replace an input or be scored next time."""
    grid_at, data_at = grid.resolve(), data.resolve()
    if grid_at == data_at or data_at in grid_at.parents:
        raise InputError(
            f"--grid {grid} is inside --data {data}; eval never writes there: "
            "choose a grid path outside the data folder"
        )


def seeded_mask(kind: str, seed: int, index: int, size: int, local_size: int, draw: int = 0) -> np.ndarray:
    """Hole number ``draw`` for image ``index``: depends on (seed, index, draw) only,
    not on the other images."""
    if kind not in MASK_KINDS:
        raise InputError(f"--masks must be one of {', '.join(MASK_KINDS)}, got {kind!r}")
    mask, _ = generate_mask(kind, np.random.default_rng([seed, index, draw]), size, local_size)
    return mask


# --------------------------------------------------------------------------- methods


def mean_fill(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Holes filled with the mean colour of the image's known pixels."""
    known = mask < 0.5
    colour = image[known].mean(axis=0) if known.any() else np.full(3, 0.5, np.float32)
    out = image.copy()
    out[~known] = colour
    return out


def opencv_inpaint(image: np.ndarray, mask: np.ndarray, method: str, radius: int = INPAINT_RADIUS) -> np.ndarray:
    """``cv2.inpaint`` (``method`` "telea" or "ns") on the 8-bit image; float result."""
    cv2 = import_cv2()
    flag = {"telea": cv2.INPAINT_TELEA, "ns": cv2.INPAINT_NS}[method]
    # cv2.inpaint treats channels independently, so RGB order needs no swap.
    filled = cv2.inpaint(to_uint8(image), (mask > 0.5).astype(np.uint8) * 255, radius, flag)
    return filled.astype(np.float32) / 255.0


# ---------------------------------------------------------------------------- results


@dataclass
class EvalResult:
    settings: dict[str, Any]
    images: list[str]
    # method -> metric -> per-image values (in the order of ``images``)
    per_image: dict[str, dict[str, list[float]]]
    grid: Path | None = None
    model: dict[str, str] = field(default_factory=dict)

    def mean(self, method: str, metric: str) -> float:
        values = self.per_image[method][metric]
        return float(np.mean(values)) if values else math.nan

    @property
    def methods(self) -> list[str]:
        return list(self.per_image)

    def to_dict(self) -> dict[str, Any]:
        def clean(v: float) -> float | str:
            return v if math.isfinite(v) else str(v)  # JSON has no inf

        return {
            "settings": self.settings,
            "model": self.model,
            "images": self.images,
            "mean": {m: {k: clean(self.mean(m, k)) for k in METRICS} for m in self.methods},
            "per_image": {m: {k: [clean(v) for v in vals] for k, vals in d.items()} for m, d in self.per_image.items()},
            "grid": str(self.grid) if self.grid else None,
        }

    def markdown(self) -> str:
        """The mean over images of every metric, one row per method (best value in bold)."""
        header = "| method | PSNR hole (dB) | PSNR (dB) | SSIM hole | SSIM | L1 hole | L1 |"
        lines = [header, "|---|---|---|---|---|---|---|"]
        best: dict[str, float | None] = {}
        for metric in METRICS:
            # An infinite PSNR (an exact fill) is shown as "inf" but not ranked: a mean
            # with one exact image says nothing about the others.
            values = [v for v in (self.mean(m, metric) for m in self.methods) if math.isfinite(v)]
            best[metric] = (min(values) if metric.startswith("l1") else max(values)) if values else None
        for method in self.methods:
            cells = []
            for metric in METRICS:
                value = self.mean(method, metric)
                if not math.isfinite(value):
                    cells.append(str(value))
                    continue
                text = f"{value:.2f}" if metric.startswith("psnr") else f"{value:.4f}"
                cells.append(f"**{text}**" if value == best[metric] and len(self.methods) > 1 else text)
            lines.append(f"| {METHOD_NAMES.get(method, method)} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def comparison_grid(rows: Sequence[dict[str, np.ndarray]], columns: Sequence[str] = GRID_COLUMNS) -> np.ndarray:
    """uint8 grid: one row per image, ``columns`` side by side (holes white in "masked")."""
    gap = 2
    tiles = []
    for row in rows:
        cells = []
        for name in columns:
            cells.append(to_uint8(row[name]))
            cells.append(np.full((row[name].shape[0], gap, 3), 255, np.uint8))
        tiles.append(np.concatenate(cells[:-1], axis=1))
        tiles.append(np.full((gap, tiles[-1].shape[1], 3), 255, np.uint8))
    return np.concatenate(tiles[:-1], axis=0)


# ------------------------------------------------------------------------------- run


def _checked_local_size(masks: str, size: int, local_size: int | None, count: int | None, masks_per_image: int) -> int:
    """Refuse bad settings before any work; returns the hole window (default size // 2)."""
    if size < 16:
        raise InputError(f"--size must be at least 16, got {size}")
    local_size = size // 2 if local_size is None else local_size
    if not 8 <= local_size < size:
        raise InputError(f"--local-size must be between 8 and --size - 1, got {local_size}")
    if count is not None and count < 1:
        raise InputError("--count must be at least 1")
    if masks_per_image < 1:
        raise InputError("--masks-per-image must be at least 1")
    if masks not in MASK_KINDS:
        raise InputError(f"--masks must be one of {', '.join(MASK_KINDS)}, got {masks!r}")
    return local_size


def _write_grid(grid_path: Path, grid_items: list[dict[str, np.ndarray]], overwrite: bool, grid_format: str) -> None:
    """The comparison grid in the format its name says, with the PNG text mark that keeps a PNG
    grid from being scored as data."""
    from PIL.PngImagePlugin import PngInfo

    columns = [c for c in GRID_COLUMNS if c in grid_items[0]]
    picture = comparison_grid(grid_items, columns)
    mark = PngInfo()
    mark.add_text(*GRID_MARK)
    # PNG carries the mark, WebP is written losslessly, JPEG at quality 95.
    options: dict[str, dict[str, Any]] = {"PNG": {"pnginfo": mark}, "WEBP": {"lossless": True}, "JPEG": {"quality": 95}}
    extra = options.get(grid_format, {})
    atomic_save(
        grid_path, lambda tmp: Image.fromarray(picture).save(tmp, format=grid_format, **extra), overwrite=overwrite
    )


def evaluate(
    model: str | Path | None,
    data: str | Path,
    masks: str = "box",
    size: int = 256,
    seed: int = 0,
    local_size: int | None = None,
    count: int | None = None,
    masks_per_image: int = 1,
    provider: str = "auto",
    backend: str = "auto",
    grid: str | Path | None = None,
    grid_rows: int = 8,
    overwrite: bool = False,
    classical: bool = True,
    blend: str = DEFAULT_BLEND,
) -> EvalResult:
    """Score ``model`` (a file, export folder, or None for the shipped model) and
    the classical baselines on the images under ``data``.

    ``local_size`` is the window holes are drawn in (default ``size // 2``; box
    holes are local_size/2 to local_size on a side); each image is scored with
    ``masks_per_image`` different holes. ``grid`` writes a PNG of the first hole
    of the first ``grid_rows`` images: masked | Telea | Navier-Stokes | gantool |
    gantool + blend | truth. ``blend`` other than "none" adds a row (and a grid column)
    for the model's output post-processed that way; the raw output keeps its row.
    """
    local_size = _checked_local_size(masks, size, local_size, count, masks_per_image)
    grid_path = Path(grid) if grid is not None else None
    if grid_path is not None:
        grid_format = grid_format_for(grid_path)
        check_grid_outside_data(grid_path, Path(data))
        if grid_path.exists() and not overwrite:
            raise InputError(f"{grid_path} exists (use --overwrite, or another --grid)")
        ensure_writable_dir(grid_path.parent)  # fail before the work, not after it
    check_blend(blend)
    if classical or blend != "none":
        import_cv2()  # fail before any work when OpenCV is missing
    paths = find_eval_images(data, count)
    runner = load_backend(model, provider, backend)

    blended = () if blend == "none" else (f"gantool_{blend}",)  # a row beside the raw output
    methods = [*(CLASSICAL_METHODS if classical else ()), "gantool", *blended]
    per_image: dict[str, dict[str, list[float]]] = {m: {k: [] for k in METRICS} for m in methods}
    grid_items: list[dict[str, np.ndarray]] = []
    samples = []
    small: list[str] = []
    for index, path in enumerate(paths):
        image = image_to_array(read_image(path))
        if min(image.shape[:2]) < size:
            small.append(f"{path.name} ({image.shape[1]}x{image.shape[0]})")
        truth = square_resize(image, size)
        for draw in range(masks_per_image):
            samples.append(f"{path.name}#{draw}" if masks_per_image > 1 else path.name)
            mask = seeded_mask(masks, seed, index, size, local_size, draw)
            in_grid = grid_path is not None and draw == 0 and len(grid_items) < grid_rows
            _score(runner, truth, mask, methods, classical, blend, per_image, grid_items if in_grid else None)

    if small:
        log.warning(
            "%d image(s) smaller than --size %d were enlarged, which flatters every method (first: %s)",
            len(small),
            size,
            small[0],
        )
    if grid_path is not None:
        _write_grid(grid_path, grid_items, overwrite, grid_format)
    settings = {
        "data": str(data),
        "masks": masks,
        "size": size,
        "local_size": local_size,
        "seed": seed,
        "count": len(paths),
        "masks_per_image": masks_per_image,
        "backend": runner.name,
        "provider": runner.provider,
        "model_file": str(runner.path),
        "opencv_radius": INPAINT_RADIUS if classical else None,
        "blend": blend,
    }
    model_meta = {k: v for k, v in runner.metadata.items() if k in (META_TRAIN_STEP, META_WEIGHTS_SHA256)}
    return EvalResult(settings, samples, per_image, grid_path, model_meta)


def _score(
    runner: Any,
    truth: np.ndarray,
    mask: np.ndarray,
    methods: list[str],
    classical: bool,
    blend: str,
    per_image: dict[str, dict[str, list[float]]],
    grid_items: list[dict[str, np.ndarray]] | None,
) -> None:
    """Fill one hole with every method; append the metrics (and a grid row)."""
    outputs: dict[str, np.ndarray] = {}
    if classical:
        outputs["mean"] = mean_fill(truth, mask)
        outputs["telea"] = opencv_inpaint(truth, mask, "telea")
        outputs["ns"] = opencv_inpaint(truth, mask, "ns")
    model_out = inpaint_arrays(runner, [(truth, mask)], strategy="full", batch_size=1, blend="none")[0]
    outputs["gantool"] = to_uint8(model_out).astype(np.float32) / 255.0  # what would be saved
    if blend != "none":
        # The model runs once; its output is blended as inpaint_arrays(..., blend=blend) would.
        blended = blend_output(truth, model_out, mask, blend)
        outputs[f"gantool_{blend}"] = to_uint8(blended).astype(np.float32) / 255.0
    for method in methods:
        for key, value in image_metrics(outputs[method], truth, mask).items():
            per_image[method][key].append(value)
    if grid_items is not None:
        grid_items.append({"masked": np.where(mask[..., None] > 0.5, 1.0, truth), "truth": truth, **outputs})

"""The file-level inpainting pipeline behind ``gantool inpaint``.

Reads top-down:

1. strategies: where the model runs on an image (``full``, ``crop`` windows
   around holes, or ``resize``) and how results are pasted back; the same
   code serves :class:`gantool.runtime.Inpainter` and the command line;
2. masks: ``--mask`` file or folder, ``--box`` rectangles, or the alpha channel;
3. files: collecting inputs, naming outputs, batching, writing atomically.

Pixel conversions, padding and compositing come from :mod:`gantool.processing`.
Only hole pixels ever change: the written pixels outside the hole are copied
from the decoded input, bit for bit.
"""

from __future__ import annotations

import glob
import logging
import re
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from gantool.constants import DEFAULT_BLEND
from gantool.errors import GantoolError, InputError
from gantool.fileio import atomic_save
from gantool.processing import (
    PNG_COMPRESS_LEVEL,
    IMAGE_EXTENSIONS,
    alpha_hole_mask,
    blend_output,
    check_blend,
    crop_padding,
    float_to_output_array,
    image_to_array,
    image_to_output_array,
    mask_to_array,
    output_array_to_image,
    output_mode,
    pad_to_multiple,
    paste_holes,
    read_image,
    resize_array,
    resize_mask,
)

if TYPE_CHECKING:
    from gantool.runtime import Backend

log = logging.getLogger(__name__)

STRATEGIES = ("auto", "full", "crop", "resize")
# ``auto`` switches from ``full`` to ``crop`` when max(H, W) > AUTO_CROP_FACTOR * train size.
AUTO_CROP_FACTOR = 2
# ``crop`` context around each hole, as a fraction of the train size; each window
# is also at least train size x train size (the scale the model was trained at).
CROP_MARGIN_FRACTION = 0.25
OUTPUT_SUFFIX = ".inpainted.png"
_GLOB_CHARS = re.compile(r"[*?\[]")


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
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    if strategy == "auto":
        return "crop" if max(height, width) > AUTO_CROP_FACTOR * train_size else "full"
    return strategy


def hole_boxes(mask: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Bounding boxes (top, left, bottom, right; exclusive) of the 8-connected holes.

    Row runs of hole pixels are joined with a union-find when they touch a run
    in the row above, so no image-processing dependency is needed.
    """
    hole = np.asarray(mask) > 0.5
    if not hole.any():
        return []
    height = hole.shape[0]
    edges = np.diff(np.pad(hole.astype(np.int8), ((0, 0), (1, 1))), axis=1)
    rows, starts = np.nonzero(edges == 1)
    _, ends = np.nonzero(edges == -1)  # exclusive; row-major order matches ``starts``
    parent = list(range(len(rows)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_run = np.searchsorted(rows, np.arange(height + 1))
    for row in range(1, height):
        i, i_end = int(first_run[row - 1]), int(first_run[row])
        j, j_end = i_end, int(first_run[row + 1])
        while i < i_end and j < j_end:
            if starts[i] <= ends[j] and starts[j] <= ends[i]:  # touching, diagonals included
                parent[find(j)] = find(i)
            if ends[i] < ends[j]:
                i += 1
            else:
                j += 1

    boxes: dict[int, list[int]] = {}
    for k in range(len(rows)):
        r, s, e = int(rows[k]), int(starts[k]), int(ends[k])
        box = boxes.setdefault(find(k), [r, s, r + 1, e])
        box[0], box[1] = min(box[0], r), min(box[1], s)
        box[2], box[3] = max(box[2], r + 1), max(box[3], e)
    return sorted(tuple(b) for b in boxes.values())  # type: ignore[misc]


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
    windows = []
    for top, left, bottom, right in hole_boxes(mask):
        t, b = _span(top - margin, bottom + margin, train_size, height)
        l, r = _span(left - margin, right + margin, train_size, width)
        windows.append(Window(t, l, b - t, r - l))
    merged = True
    while merged:
        merged = False
        for i in range(len(windows)):
            for j in range(i + 1, len(windows)):
                if windows[i].overlaps(windows[j]):
                    windows[i] = windows[i].union(windows.pop(j))
                    merged = True
                    break
            if merged:
                break
    return windows


def plan_windows(
    mask: np.ndarray, strategy: str, train_size: int, crop_margin: int | None = None
) -> list[Window]:
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


def _run_grouped(backend: Backend, tasks: list[_Task], batch_size: int) -> list[np.ndarray]:
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
) -> list[list[tuple[Window, np.ndarray]]]:
    """For each (pixels, mask): its windows and the model's float output for each,
    at the window's own size, post-processed by ``blend`` (per window)."""
    tasks = []
    for item, (pixels, mask) in enumerate(items):
        for window in plan_windows(mask, strategy, backend.train_size, crop_margin):
            tasks.append(_prepare(item, pixels(window), mask[window.region], window, backend.size_multiple))
    fills: list[list[tuple[Window, np.ndarray]]] = [[] for _ in items]
    for task, out in zip(tasks, _run_grouped(backend, tasks, batch_size)):
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
    strategy: str = "auto",
    batch_size: int = 4,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
) -> list[np.ndarray]:
    """Inpaint float H x W x 3 images with H x W masks (1 = hole); any sizes.

    ``blend`` (a BLEND_MODES name) post-processes each window's model output.
    Returns float H x W x 3 arrays in which only hole pixels differ from the input.
    """
    check_blend(blend)
    for image, mask in items:
        if image.shape[:2] != mask.shape:
            raise InputError(f"mask is {mask.shape[1]}x{mask.shape[0]} but image is {image.shape[1]}x{image.shape[0]}")
    sources = [(lambda w, image=image: image[w.region], mask) for image, mask in items]
    results = [np.array(image, dtype=np.float32, copy=True) for image, _ in items]
    for result, (_, mask), fills in zip(results, items, _fill_windows(backend, sources, strategy, batch_size, crop_margin, blend)):
        for window, filled in fills:
            region = result[window.region]
            region[...] = paste_holes(region, filled, mask[window.region])
    return results


def inpaint_images(
    backend: Backend,
    items: Sequence[tuple[Image.Image, np.ndarray]],
    strategy: str = "auto",
    batch_size: int = 4,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
) -> list[Image.Image]:
    """Inpaint PIL images (H x W masks, 1 = hole). Each result has the input's size
    and its family's mode (RGB, L or 16-bit I;16); known pixels are copied from
    the decoded input unchanged. ``blend``: the post-processing (BLEND_MODES)."""
    check_blend(blend)

    def window_pixels(image: Image.Image) -> WindowPixels:
        return lambda w: image_to_array(image.crop((w.left, w.top, w.left + w.width, w.top + w.height)))

    for image, mask in items:
        check_mask_size(mask, image, "mask", "image")
    sources = [(window_pixels(image), mask) for image, mask in items]
    outputs = []
    for (image, mask), fills in zip(items, _fill_windows(backend, sources, strategy, batch_size, crop_margin, blend)):
        mode = output_mode(image)
        known = np.array(image_to_output_array(image), copy=True)
        for window, filled in fills:
            region = known[window.region]
            region[...] = paste_holes(region, float_to_output_array(filled, mode), mask[window.region])
        outputs.append(output_array_to_image(known, mode))
    return outputs


# ------------------------------------------------------------------------------- masks


def to_pil_image(obj: Image.Image | str | Path | np.ndarray, what: str = "image") -> Image.Image:
    """A PIL image from a PIL image, a path, or a uint8/uint16 array (H x W, H x W x 3 or x 4)."""
    if isinstance(obj, Image.Image):
        return obj
    if isinstance(obj, (str, Path)):
        return read_image(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype not in (np.uint8, np.uint16) or obj.ndim not in (2, 3):
            raise InputError(
                f"{what} arrays must be uint8 (H x W [x 3|4]) or uint16 (H x W), got {obj.dtype} {obj.shape}"
            )
        if obj.dtype == np.uint16 and obj.ndim != 2:
            raise InputError(f"uint16 {what} arrays must be H x W (16-bit grey)")
        if obj.ndim == 3 and obj.shape[2] not in (3, 4):
            raise InputError(f"{what} arrays must have 3 or 4 channels, got {obj.shape[2]}")
        return Image.fromarray(np.ascontiguousarray(obj))
    raise InputError(f"{what} must be a PIL image, a path or a numpy array, got {type(obj).__name__}")


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


def parse_box(text: str) -> tuple[int, int, int, int]:
    """``"X,Y,W,H"`` in pixels of the displayed image -> (x, y, w, h)."""
    parts = text.replace(" ", "").split(",")
    try:
        x, y, w, h = (int(p) for p in parts)
    except ValueError:
        raise InputError(f"--box must be X,Y,W,H in whole pixels, got {text!r}") from None
    if w <= 0 or h <= 0:
        raise InputError(f"--box width and height must be positive, got {text!r}")
    return x, y, w, h


def box_mask(boxes: Sequence[tuple[int, int, int, int]], width: int, height: int) -> np.ndarray:
    """Rectangles (x, y, w, h) as a hole mask, clipped to the image."""
    mask = np.zeros((height, width), np.float32)
    for x, y, w, h in boxes:
        if x >= width or y >= height or x + w <= 0 or y + h <= 0:
            raise InputError(f"box {x},{y},{w},{h} lies outside the {width}x{height} image")
        mask[max(0, y) : y + h, max(0, x) : x + w] = 1.0
    return mask


@dataclass(frozen=True)
class ImageJob:
    """One input image and where its result goes."""

    source: Path
    output: Path
    relative: Path  # path below the input folder it was found in (its name for files)


class MaskSource:
    """The holes for each image: ``--mask`` (a file for all images, or a folder
    matched by file stem), ``--box`` rectangles (both are combined when given
    together), else the image's alpha channel."""

    def __init__(self, mask: str | Path | None = None, boxes: Sequence[tuple[int, int, int, int]] = ()) -> None:
        self.path = Path(mask).expanduser() if mask is not None else None
        if self.path is not None and not self.path.exists():
            raise InputError(f"mask not found: {self.path}")
        self.boxes = list(boxes)
        self._file_mask: np.ndarray | None = None
        self._by_stem: dict[str, list[Path]] = {}
        if self.path is not None and self.path.is_dir():
            for candidate in sorted(self.path.rglob("*")):
                if candidate.is_file() and candidate.suffix.lower() in IMAGE_EXTENSIONS:
                    self._by_stem.setdefault(candidate.stem, []).append(candidate)

    @property
    def folder(self) -> Path | None:
        return self.path if self.path is not None and self.path.is_dir() else None

    def protected_files(self) -> list[Path]:
        """Mask files: never to be overwritten by an output."""
        if self.path is None:
            return []
        return [self.path] if self.path.is_file() else [p for ps in self._by_stem.values() for p in ps]

    def _mask_file_for(self, job: ImageJob) -> Path:
        assert self.path is not None
        if self.path.is_file():
            return self.path
        same_place = [p for p in self._by_stem.get(job.source.stem, []) if p.parent == self.path / job.relative.parent]
        matches = same_place or self._by_stem.get(job.source.stem, [])
        if not matches:
            raise InputError(f"no mask named {job.source.stem}.* in {self.path}")
        if len(matches) > 1:
            names = ", ".join(str(p.relative_to(self.path)) for p in matches[:3])
            raise InputError(f"several masks match {job.source.name} in {self.path}: {names}")
        return matches[0]

    def for_image(self, job: ImageJob, image: Image.Image) -> np.ndarray:
        parts = []
        if self.path is not None:
            mask_file = self._mask_file_for(job)
            if mask_file == self.path and self._file_mask is not None:
                array = self._file_mask
            else:
                array = mask_to_array(read_image(mask_file))
                if mask_file == self.path:  # one mask for all images: decode it once
                    self._file_mask = array
            parts.append(check_mask_size(array, image, mask_file.name, job.source.name))
        if self.boxes:
            parts.append(box_mask(self.boxes, image.width, image.height))
        if parts:
            return np.maximum.reduce(parts) if len(parts) > 1 else parts[0]
        alpha = alpha_hole_mask(image)
        if alpha is None:
            raise InputError(
                f"no mask for {job.source.name}: give --mask or --box, or an image with transparent holes"
            )
        return alpha


# ------------------------------------------------------------------------------- files


def _is_candidate(path: Path) -> bool:
    """An image found while scanning: right extension, not one of our outputs."""
    return (
        path.is_file()
        and path.suffix.lower() in IMAGE_EXTENSIONS
        and ".inpainted." not in path.name
        and not path.name.startswith(".")
    )


def collect_images(inputs: Sequence[str | Path], skip: Sequence[Path] = ()) -> list[tuple[Path, Path]]:
    """Files, folders (recursive) and globs -> [(image path, path relative to its folder)].

    Folder scans skip ``*.inpainted.*`` files and anything inside ``skip``
    (the mask folder); named files are always taken.
    """
    skip_resolved = [p.resolve() for p in skip]

    def skipped(path: Path) -> bool:
        resolved = path.resolve()
        return any(resolved == s or s in resolved.parents for s in skip_resolved)

    found: list[tuple[Path, Path]] = []
    seen: set[Path] = set()

    def add(path: Path, relative: Path) -> None:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            found.append((path, relative))

    for raw in inputs:
        path = Path(raw).expanduser()
        if path.is_dir():
            for candidate in sorted(path.rglob("*")):
                if _is_candidate(candidate) and not skipped(candidate):
                    add(candidate, candidate.relative_to(path))
        elif path.is_file():
            add(path, Path(path.name))
        elif _GLOB_CHARS.search(str(raw)):
            matches = [Path(m) for m in sorted(glob.glob(str(path), recursive=True))]
            images = [m for m in matches if _is_candidate(m) and not skipped(m)]
            if not images:
                raise InputError(f"no images match {raw}")
            for image in images:
                add(image, Path(image.name))
        else:
            raise InputError(f"no such file or folder: {raw}")
    if not found:
        raise InputError(f"no images found in {', '.join(str(i) for i in inputs)}")
    return found


def plan_jobs(images: Sequence[tuple[Path, Path]], output: str | Path | None = None) -> list[ImageJob]:
    """Name each output: ``<stem>.inpainted.png`` beside the input or under
    ``output`` (a folder; folder inputs keep their sub-folders), or ``output``
    itself when it ends in .png and there is one image."""
    out = Path(output).expanduser() if output is not None else None
    if out is not None and out.suffix.lower() == ".png" and not out.is_dir():
        if len(images) != 1:
            raise InputError(f"-o {out} names one file but there are {len(images)} images: give a folder")
        source, relative = images[0]
        return [ImageJob(source, out, relative)]
    if out is not None and out.exists() and not out.is_dir():
        raise InputError(f"-o {out} is an existing file that is not a .png: give a folder or a .png name")
    jobs, claimed = [], {}
    for source, relative in images:
        name = relative.with_name(source.stem + OUTPUT_SUFFIX)
        dest = out / name if out is not None else source.with_name(name.name)
        key = dest.resolve()
        if key in claimed:
            raise InputError(f"{claimed[key]} and {source} would both be written to {dest}")
        claimed[key] = source
        jobs.append(ImageJob(source, dest, relative))
    return jobs


@dataclass
class FileResult:
    source: Path
    output: Path | None = None
    error: str | None = None
    unchanged: bool = False  # the mask had no hole: the image was written as it was

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class RunSummary:
    results: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0
    provider: str = ""
    backend: str = ""

    @property
    def inpainted(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)

    def line(self) -> str:
        return (
            f"{self.inpainted} inpainted, {self.failed} failed in {self.seconds:.1f} s "
            f"(provider {self.provider}, backend {self.backend})"
        )


# Per-file problems that skip one file, not the run.
_FILE_ERRORS = (GantoolError, OSError, ValueError, MemoryError, Image.DecompressionBombError)


def _chunks(items: Sequence[ImageJob], size: int) -> Iterator[Sequence[ImageJob]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _check_output(job: ImageJob, overwrite: bool, protected: set[Path]) -> None:
    if job.output.resolve() in protected:
        raise InputError(f"refusing to write {job.output}: it is an input or mask file")
    if job.output.exists() and not overwrite:
        raise InputError(f"{job.output} exists (use --overwrite)")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def inpaint_files(
    backend: Backend,
    jobs: Sequence[ImageJob],
    masks: MaskSource,
    *,
    strategy: str = "auto",
    batch_size: int = 4,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
    overwrite: bool = False,
    on_result: Callable[[FileResult], None] | None = None,
) -> RunSummary:
    """Inpaint every job; a bad file is recorded (one line) and skipped.

    Images are read ``batch_size`` at a time; same-size model inputs among them
    are run as one batch. Outputs are PNG, written atomically, never over an
    input or mask file, and over an existing file only with ``overwrite``.
    """
    check_blend(blend)  # an unknown mode, or no OpenCV, fails the run before any file
    start = time.perf_counter()
    summary = RunSummary(provider=backend.provider, backend=backend.name)
    protected = {job.source.resolve() for job in jobs} | {p.resolve() for p in masks.protected_files()}

    def report(result: FileResult) -> None:
        summary.results.append(result)
        if on_result is not None:
            on_result(result)

    def save(job: ImageJob, image: Image.Image) -> None:
        atomic_save(job.output, lambda tmp: image.save(tmp, format="PNG", compress_level=PNG_COMPRESS_LEVEL),
                    overwrite=overwrite)

    # PNG encoding runs on a writer thread (zlib releases the GIL), overlapping the
    # next batch's model run; results are reported in job order.
    pending: deque[tuple[ImageJob, np.ndarray, Future[None]]] = deque()

    def settle(keep: int) -> None:
        while len(pending) > keep:
            job, mask, write = pending.popleft()
            try:
                write.result()
                report(FileResult(job.source, output=job.output, unchanged=not (mask > 0.5).any()))
            except _FILE_ERRORS as e:
                report(FileResult(job.source, error=f"{job.source}: {_one_line(e)}"))

    def load(chunk: Sequence[ImageJob]) -> tuple[list[tuple[ImageJob, Image.Image, np.ndarray]], list[FileResult]]:
        loaded, failed = [], []
        for job in chunk:
            try:
                _check_output(job, overwrite, protected)
                image = read_image(job.source)
                loaded.append((job, image, masks.for_image(job, image)))
            except _FILE_ERRORS as e:
                failed.append(FileResult(job.source, error=f"{job.source}: {_one_line(e)}"))
        return loaded, failed

    chunks = list(_chunks(jobs, batch_size))
    # A reader thread decodes the next batch while this one runs (one thread: MaskSource
    # is used from it alone).
    with ThreadPoolExecutor(1, thread_name_prefix="gantool-read") as reader, \
            ThreadPoolExecutor(1, thread_name_prefix="gantool-write") as writer:
        upcoming = reader.submit(load, chunks[0]) if chunks else None
        for number, _ in enumerate(chunks):
            loaded, failed = upcoming.result()
            upcoming = reader.submit(load, chunks[number + 1]) if number + 1 < len(chunks) else None
            for result in failed:
                report(result)
            try:
                outputs = inpaint_images(
                    backend, [(img, m) for _, img, m in loaded], strategy, batch_size, crop_margin, blend
                )
            except _FILE_ERRORS:
                outputs = None  # retried one by one below, so one bad image does not fail its batch
            for index, (job, image, mask) in enumerate(loaded):
                try:
                    if outputs is None:
                        result = inpaint_images(backend, [(image, mask)], strategy, 1, crop_margin, blend)[0]
                    else:
                        result = outputs[index]
                except _FILE_ERRORS as e:
                    report(FileResult(job.source, error=f"{job.source}: {_one_line(e)}"))
                    continue
                pending.append((job, mask, writer.submit(save, job, result)))
            settle(keep=batch_size)  # at most one batch of finished images waits in memory
        settle(keep=0)
    summary.seconds = time.perf_counter() - start
    return summary

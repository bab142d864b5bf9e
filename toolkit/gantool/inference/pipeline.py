"""The file pipeline behind ``gantool inpaint``: inputs, masks, outputs, threads.

Reads top-down:

1. jobs: collecting input files (files, folders, globs), naming outputs
   (:func:`collect_images`, :func:`plan_jobs`), and where each image's holes
   come from (:class:`MaskSource`);
2. :func:`inpaint_files`: the loop, with a reader thread decoding the next
   batch and a writer thread encoding PNGs while the model runs;
3. :func:`run_inpaint`: the whole command as one call (the CLI and the
   benchmarks both use it).

Only hole pixels change: known pixels are copied from the decoded input bit for
bit. Outputs are written atomically, never over an input or mask file.
"""

from __future__ import annotations

import glob
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from gantool.core.constants import (
    DEFAULT_BACKEND,
    DEFAULT_BLEND,
    DEFAULT_INPAINT_BATCH,
    DEFAULT_MAX_BLEND_PIXELS,
    DEFAULT_PRECISION,
    DEFAULT_PROVIDER,
    DEFAULT_STRATEGY,
)
from gantool.core.errors import GantoolError, InputError, first_line
from gantool.core.fileio import atomic_save
from gantool.core.processing import (
    IMAGE_EXTENSIONS,
    allow_pixels,
    alpha_hole_mask,
    check_blend,
    mask_to_array,
    read_image,
    save_png,
)
from gantool.inference.cost import available_memory, blend_warning, check_cost, estimate_cost
from gantool.inference.inpainter import ModelFills, boxes_to_mask, check_mask_size, fill_images, finish_image
from gantool.runtime.backends import Backend, load_backend

log = logging.getLogger(__name__)

OUTPUT_SUFFIX = ".inpainted.png"
# An -o with one of these suffixes names an image file in another format: refused, never a folder.
NOT_PNG_IMAGE_SUFFIXES = tuple(e for e in (*IMAGE_EXTENSIONS, ".gif", ".avif", ".heic", ".jxl") if e != ".png")
_GLOB_CHARS = re.compile(r"[*?\[]")


# -------------------------------------------------------------------------------- jobs


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
            parts.append(boxes_to_mask(self.boxes, image.width, image.height))
        if parts:
            return np.maximum.reduce(parts) if len(parts) > 1 else parts[0]
        alpha = alpha_hole_mask(image)
        if alpha is None:
            raise InputError(f"no mask for {job.source.name}: give --mask or --box, or an image with transparent holes")
        return alpha


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
        elif path.exists():  # a FIFO, socket or device: reading it would block or never end
            raise InputError(f"not a regular file: {raw}")
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
    if out is not None and out.suffix.lower() in NOT_PNG_IMAGE_SUFFIXES and not out.is_dir():
        raise InputError(
            f"-o {out}: outputs are written as PNG (so known pixels stay exactly as they were); "
            f"name a .png file, or a folder"
        )
    if out is not None and out.suffix.lower() == ".png" and not out.is_dir():
        if len(images) != 1:
            raise InputError(f"-o {out} names one file but there are {len(images)} images: give a folder")
        source, relative = images[0]
        return [ImageJob(source, out, relative)]
    if out is not None and out.exists() and not out.is_dir():
        raise InputError(f"-o {out} is an existing file that is not a .png: give a folder or a .png name")
    jobs: list[ImageJob] = []
    claimed: dict[Path, Path] = {}
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
    output: Path | None = None  # None when nothing was written (an error, or no hole)
    error: str | None = None
    no_hole: bool = False  # the mask had no hole pixel: skipped, nothing written
    skipped: bool = False  # its output existed (skip_existing): kept, nothing written

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def inpainted(self) -> bool:
        return self.ok and not self.no_hole and not self.skipped


@dataclass
class RunSummary:
    results: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0
    provider: str = ""
    backend: str = ""

    @property
    def inpainted(self) -> int:
        return sum(r.inpainted for r in self.results)

    @property
    def no_hole(self) -> int:
        return sum(r.no_hole for r in self.results)

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.results)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)

    @property
    def succeeded(self) -> bool:
        """Nothing failed, and something was inpainted or was already done (a resumed run);
        images without holes alone are not a success. The exit status of the CLI, with --ray too."""
        return self.failed == 0 and (self.inpainted > 0 or self.skipped > 0)

    def skip_notes(self) -> str:
        notes = f", {self.skipped} skipped (output exists)" if self.skipped else ""
        return notes + (f", {self.no_hole} skipped (no hole)" if self.no_hole else "")

    def line(self) -> str:
        return (
            f"{self.inpainted} inpainted{self.skip_notes()}, {self.failed} failed in {self.seconds:.1f} s "
            f"(provider {self.provider}, backend {self.backend})"
        )


# -------------------------------------------------------------------- per-file steps
# Shared by inpaint_files and gantool.inference.ray, so both apply the same rules.

# Per-file problems that skip one file, not the run.
FILE_ERRORS = (GantoolError, OSError, ValueError, MemoryError, Image.DecompressionBombError)


def _chunks(items: Sequence[ImageJob], size: int) -> Iterator[Sequence[ImageJob]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def protected_paths(jobs: Sequence[ImageJob], masks: MaskSource) -> set[Path]:
    """Inputs and mask files (resolved): never written to."""
    return {job.source.resolve() for job in jobs} | {p.resolve() for p in masks.protected_files()}


def check_output(job: ImageJob, overwrite: bool, protected: set[Path]) -> None:
    if job.output.resolve() in protected:
        raise InputError(f"refusing to write {job.output}: it is an input or mask file")
    if job.output.exists() and not overwrite:
        raise InputError(f"{job.output} exists (use --overwrite to replace it, or --skip-existing to keep it)")


def already_done(job: ImageJob, skip_existing: bool, protected: set[Path]) -> bool:
    """With ``skip_existing``: the output exists (an earlier run made it) and is no input or mask."""
    return skip_existing and job.output.exists() and job.output.resolve() not in protected


def check_skip_options(overwrite: bool, skip_existing: bool) -> None:
    if overwrite and skip_existing:
        raise InputError("--overwrite and --skip-existing contradict each other: give one")


def file_error(job: ImageJob, error: BaseException) -> FileResult:
    """The failed file's line: its path, then the cause (which names the path itself, often)."""
    cause = first_line(error)
    return FileResult(job.source, error=cause if str(job.source) in cause else f"{job.source}: {cause}")


class NoHole(Exception):
    """The image's mask has no hole pixel: it is skipped and nothing is written (not an error)."""


def no_hole(job: ImageJob) -> FileResult:
    return FileResult(job.source, no_hole=True)


def skipped(job: ImageJob) -> FileResult:
    return FileResult(job.source, output=job.output, skipped=True)


def load_job(job: ImageJob, masks: MaskSource, overwrite: bool, protected: set[Path]) -> tuple[Image.Image, np.ndarray]:
    """Check where the output goes, decode the image, find its holes.

    Raises FILE_ERRORS for a bad file and :class:`NoHole` for an image with nothing to fill.
    """
    check_output(job, overwrite, protected)
    image = read_image(job.source, lossless=True)
    mask = masks.for_image(job, image)
    if not (mask > 0.5).any():
        raise NoHole(job.source)
    return image, mask


def fill_loaded(
    backend: Backend,
    items: Sequence[tuple[Image.Image, np.ndarray]],
    strategy: str,
    batch_size: int,
    crop_margin: int | None,
) -> list[ModelFills | Exception]:
    """The model's output (:func:`gantool.inference.inpainter.fill_images`) for each item, or the
    error that image raised: a failing batch is retried one by one, so one bad image
    does not fail its batch."""
    try:
        return list(fill_images(backend, items, strategy, batch_size, crop_margin))
    except FILE_ERRORS:
        pass
    results: list[ModelFills | Exception] = []
    for image, mask in items:
        try:
            results.append(fill_images(backend, [(image, mask)], strategy, 1, crop_margin)[0])
        except FILE_ERRORS as e:
            results.append(e)
    return results


def finish_and_write(
    job: ImageJob, image: Image.Image, mask: np.ndarray, fills: ModelFills, blend: str, overwrite: bool
) -> None:
    """The step after the model for one file: blend and composite
    (:func:`gantool.inference.inpainter.finish_image`), then the PNG at ``job.output``, atomically."""
    result = finish_image(image, mask, fills, blend)
    atomic_save(job.output, lambda tmp: save_png(result, tmp), overwrite=overwrite)


def written(job: ImageJob) -> FileResult:
    return FileResult(job.source, output=job.output)


# -------------------------------------------------------------------------- the loop


def _check_job_cost(
    job: ImageJob,
    mask: np.ndarray,
    backend: Backend,
    strategy: str,
    batch_size: int,
    crop_margin: int | None,
    blend: str,
    max_blend_pixels: int,
) -> None:
    """Refuse a file whose estimate exceeds the available memory (a message here rather than the
    kernel's OOM killer mid-run); warn when its blend is over ``max_blend_pixels``."""
    cost = estimate_cost(
        mask, strategy, backend.train_size, backend.size_multiple, crop_margin, batch_size,
        blend=blend if max_blend_pixels else "none",  # the blend's area costs a pass over the mask
    )  # fmt: skip
    check_cost(cost, max_bytes=available_memory())
    warning = blend_warning(cost, max_blend_pixels)
    if warning is not None:
        log.warning("%s: %s", job.source, warning)


def inpaint_files(
    backend: Backend,
    jobs: Sequence[ImageJob],
    masks: MaskSource,
    *,
    strategy: str = DEFAULT_STRATEGY,
    batch_size: int = DEFAULT_INPAINT_BATCH,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
    overwrite: bool = False,
    skip_existing: bool = False,
    on_result: Callable[[FileResult], None] | None = None,
    max_blend_pixels: int = DEFAULT_MAX_BLEND_PIXELS,
) -> RunSummary:
    """Inpaint every job; a bad file is recorded (one line) and skipped.
    ``skip_existing``: a job whose output exists is counted as skipped (resuming a run).
    ``max_blend_pixels``: warn (logged, one line per file) when a file's Poisson blend
    solves over more pixels (:func:`gantool.inference.cost.blend_warning`); 0 never.

    Images are read ``batch_size`` at a time; same-size model inputs among them
    are run as one batch. Outputs are PNG, written atomically, never over an
    input or mask file, and over an existing file only with ``overwrite``.
    """
    check_blend(blend)  # an unknown mode, or no OpenCV, fails the run before any file
    check_skip_options(overwrite, skip_existing)
    start = time.perf_counter()
    summary = RunSummary(provider=backend.provider, backend=backend.name)
    protected = protected_paths(jobs, masks)

    def report(result: FileResult) -> None:
        summary.results.append(result)
        if on_result is not None:
            on_result(result)

    # Blending, compositing and PNG encoding run on a writer thread (OpenCV and zlib
    # release the GIL), overlapping the next batch's model run; results are reported
    # in job order.
    pending: deque[tuple[ImageJob, Future[None]]] = deque()

    def settle(keep: int) -> None:
        while len(pending) > keep:
            job, write = pending.popleft()
            try:
                write.result()
                report(written(job))
            except FILE_ERRORS as e:
                report(file_error(job, e))

    def load(chunk: Sequence[ImageJob]) -> tuple[list[tuple[ImageJob, Image.Image, np.ndarray]], list[FileResult]]:
        loaded, failed = [], []
        for job in chunk:
            if already_done(job, skip_existing, protected):
                failed.append(skipped(job))
                continue
            try:
                image, mask = load_job(job, masks, overwrite, protected)
                _check_job_cost(job, mask, backend, strategy, batch_size, crop_margin, blend, max_blend_pixels)
                loaded.append((job, image, mask))
            except NoHole:
                failed.append(no_hole(job))
            except FILE_ERRORS as e:
                failed.append(file_error(job, e))
        return loaded, failed

    chunks = list(_chunks(jobs, batch_size))
    # A reader thread decodes the next batch while this one runs (one thread: MaskSource
    # is used from it alone).
    with (
        ThreadPoolExecutor(1, thread_name_prefix="gantool-read") as reader,
        ThreadPoolExecutor(1, thread_name_prefix="gantool-write") as writer,
    ):
        upcoming = reader.submit(load, chunks[0]) if chunks else None
        for number, _ in enumerate(chunks):
            assert upcoming is not None  # one submitted per chunk
            loaded, failed = upcoming.result()
            upcoming = reader.submit(load, chunks[number + 1]) if number + 1 < len(chunks) else None
            for result in failed:
                report(result)
            outputs = fill_loaded(backend, [(img, m) for _, img, m in loaded], strategy, batch_size, crop_margin)
            for (job, image, mask), fills in zip(loaded, outputs):
                if isinstance(fills, Exception):
                    report(file_error(job, fills))
                else:
                    pending.append((job, writer.submit(finish_and_write, job, image, mask, fills, blend, overwrite)))
            settle(keep=batch_size)  # at most one batch of finished images waits in memory
        settle(keep=0)
    summary.seconds = time.perf_counter() - start
    return summary


def run_inpaint(
    images: Sequence[str | Path],
    backend: Backend | None = None,
    *,
    model: str | Path | None = None,
    provider: str = DEFAULT_PROVIDER,
    backend_name: str = DEFAULT_BACKEND,
    precision: str = DEFAULT_PRECISION,
    mask: str | Path | None = None,
    boxes: Sequence[tuple[int, int, int, int]] = (),
    output: str | Path | None = None,
    strategy: str = DEFAULT_STRATEGY,
    batch_size: int = DEFAULT_INPAINT_BATCH,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
    overwrite: bool = False,
    skip_existing: bool = False,
    max_pixels: int | None = None,
    on_start: Callable[[Backend, Sequence[ImageJob]], None] | None = None,
    on_result: Callable[[FileResult], None] | None = None,
    max_blend_pixels: int = DEFAULT_MAX_BLEND_PIXELS,
) -> RunSummary:
    """``gantool inpaint`` as one call: find the inputs, name the outputs, open the
    model (unless ``backend`` is given), then :func:`inpaint_files`.

    Inputs and masks are checked before the model is loaded, so a typo fails fast.
    ``on_start(backend, jobs)`` runs once the model is open. ``max_pixels``: decode
    images of up to this many pixels (default: Pillow's decompression-bomb limit).
    """
    check_skip_options(overwrite, skip_existing)
    if max_pixels is not None:
        allow_pixels(max_pixels)
    masks = MaskSource(mask, boxes)
    # The mask (file or folder) may sit inside an input folder: it is not an input.
    found = collect_images(images, skip=[masks.path] if masks.path is not None else [])
    jobs = plan_jobs(found, output)
    if backend is None:
        backend = load_backend(model, provider, backend_name, precision)
    if on_start is not None:
        on_start(backend, jobs)
    return inpaint_files(
        backend, jobs, masks, strategy=strategy, batch_size=batch_size, crop_margin=crop_margin, blend=blend,
        overwrite=overwrite, skip_existing=skip_existing, on_result=on_result, max_blend_pixels=max_blend_pixels,
    )  # fmt: skip

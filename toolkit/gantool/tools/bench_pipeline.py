"""`gantool bench inpaint`'s file-level goals (:mod:`gantool.tools.bench_inpaint` runs them): the
end-to-end file pipeline against the time in the model, the crop strategy on a large image against
a small one, and the blend's cost next to the model's. Never used by tests for timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gantool.core.constants import DEFAULT_BLEND
from gantool.inference.inpainter import inpaint_images
from gantool.inference.pipeline import run_inpaint
from gantool.runtime.backends import load_backend
from gantool.tools.timing import timed


class _TimedBackend:
    """Delegates to a backend and sums the seconds spent in ``run``."""

    def __init__(self, backend: Any) -> None:
        self._backend, self.run_seconds, self.calls = backend, 0.0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def run(self, image: np.ndarray, mask: np.ndarray, release_memory_pixels: int = 0) -> np.ndarray:
        start = time.perf_counter()
        try:
            return self._backend.run(image, mask, release_memory_pixels)
        finally:
            self.run_seconds += time.perf_counter() - start
            self.calls += 1


def _box_mask_array(size: int, hole: int) -> np.ndarray:
    mask = np.zeros((size, size), np.uint8)
    start = (size - hole) // 2
    mask[start : start + hole, start : start + hole] = 255
    return mask


def write_bench_folder(root: Path, images: int, size: int) -> tuple[Path, Path]:
    """``root/images/img_NNN.png`` (size x size) and ``root/mask.png`` (one centred box)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = root / "images"
    folder.mkdir()
    for i in range(images):
        Image.fromarray(_smooth_noisy_rgb(size, rng)).save(folder / f"img_{i:03d}.png")
    mask_path = root / "mask.png"
    Image.fromarray(_box_mask_array(size, size // 4)).save(mask_path)
    return folder, mask_path


def bench_end_to_end(
    model: str | Path | None,
    images: int,
    size: int,
    provider: str,
    strategy: str = "auto",
    batch_size: int = 4,
    blend: str = DEFAULT_BLEND,
) -> dict[str, Any]:
    """``gantool inpaint``'s file loop (read, mask, pre/post-process, run, write PNG)
    over ``images`` files of ``size`` px: wall time against summed backend.run time."""
    import tempfile

    start = time.perf_counter()
    backend = _TimedBackend(load_backend(model, provider, "onnx"))
    load_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="gantool-bench-") as tmp:
        folder, mask_path = write_bench_folder(Path(tmp), images, size)
        out = Path(tmp) / "out"
        start = time.perf_counter()
        summary = run_inpaint(
            [folder],
            backend,  # type: ignore[arg-type]  # a Backend by delegation
            mask=mask_path,
            output=out,
            strategy=strategy,
            batch_size=batch_size,
            blend=blend,
        )
        wall = time.perf_counter() - start
    outside = max(0.0, wall - backend.run_seconds)
    return {
        "images": images,
        "size": size,
        "strategy": strategy,
        "batch_size": batch_size,
        "blend": blend,
        "backend": "onnx",
        "provider": backend.provider,
        "failed": summary.failed,
        "model_load_s": load_s,
        "wall_s": wall,
        "model_run_s": backend.run_seconds,
        "run_calls": backend.calls,
        "outside_model_fraction": outside / wall if wall > 0 else None,
        "measures": "pipeline.run_inpaint (what `gantool inpaint` runs, the model already loaded): "
        "wall time vs the summed backend.run time",
    }


def bench_crop(
    model: str | Path | None, provider: str, large: int = 2048, small: int = 256, hole: int = 128, repeats: int = 3
) -> dict[str, Any]:
    """--strategy crop on a ``large`` image with one ``hole`` x ``hole`` hole vs
    --strategy full on a ``small`` image with the same hole (PIL image in, PIL image out)."""
    from PIL import Image

    backend = load_backend(model, provider, "onnx")
    rng = np.random.default_rng(0)
    timings = {}
    for name, side, strategy in (("large_crop", large, "crop"), ("small_full", small, "full")):
        picture = Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
        mask = (_box_mask_array(side, min(hole, side // 2)) > 127).astype(np.float32)
        # blend="none": the strategies are compared here; the blend is timed on its own (bench_blend).
        run = lambda: inpaint_images(backend, [(picture, mask)], strategy=strategy, batch_size=1, blend="none")
        timings[name] = statistics.median(timed(run, repeats, 1, torch.device("cpu")))
    return {
        "large": large,
        "small": small,
        "hole": hole,
        "provider": backend.provider,
        "large_crop_s": timings["large_crop"],
        "small_full_s": timings["small_full"],
        "ratio": timings["large_crop"] / timings["small_full"],
    }


def _smooth_noisy_rgb(size: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth gradients with noise (uint8 H x W x 3): PNG sizes like photos', not like flat colour."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    base = np.stack([x, y, (x + y) / 2], axis=2) * 180 + rng.integers(0, 60, (size, size, 3))
    return base.astype(np.uint8)


def bench_blend(
    model: str | Path | None,
    provider: str,
    size: int = 512,
    hole: int = 128,
    repeats: int = 3,
    strategies: Sequence[str] = ("full", "auto"),
    blend: str = DEFAULT_BLEND,
) -> list[dict[str, Any]]:
    """The cost of the post-processing next to the model's: one ``size`` px image with a
    ``hole`` px square hole, per strategy. ``model_ms`` is the median time in
    backend.run (the windows the strategy runs), ``blend_ms`` the median time of
    processing.blend_output on the same windows' outputs (what inpaint_images adds)."""
    from PIL import Image

    from gantool.core.processing import blend_output, image_to_array
    from gantool.inference.inpainter import fill_images

    backend: Any = _TimedBackend(load_backend(model, provider, "onnx"))  # a Backend by delegation
    picture = Image.fromarray(_smooth_noisy_rgb(size, np.random.default_rng(0)))
    mask = (_box_mask_array(size, min(hole, size // 2)) > 127).astype(np.float32)
    pixels = image_to_array(picture)
    rows = []
    for strategy in strategies:
        model_times = []
        for _ in range(repeats + 1):  # the first run warms up
            backend.run_seconds = 0.0
            fills = fill_images(backend, [(picture, mask)], strategy=strategy, batch_size=1)[0]
            model_times.append(backend.run_seconds)

        def post_process() -> None:
            for window, filled in fills:
                blend_output(pixels[window.region], filled, mask[window.region], blend)

        blend_times = timed(post_process, repeats, 1, torch.device("cpu"))
        model_ms, blend_ms = statistics.median(model_times[1:]) * 1e3, statistics.median(blend_times) * 1e3
        rows.append(
            {
                "strategy": strategy,
                "size": size,
                "hole": hole,
                "blend": blend,
                "provider": backend.provider,
                "windows": [[w.height, w.width] for w, _ in fills],
                "model_ms": model_ms,
                "blend_ms": blend_ms,
                "blend_vs_model": blend_ms / model_ms if model_ms > 0 else None,
                "runs": repeats,
            }
        )
    return rows

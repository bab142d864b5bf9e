"""Benchmarks: medians and ratios measured side by side in one process.

``bench_train`` times gantool's joint training step against a reproduction of
GLCIC-PyTorch's phase-3 iteration on the same networks, batch and machine
(fp32, NCHW, Adadelta, sigmoid + BCE, and D's weight gradients computed during
G's backward, as that implementation does). ``bench_inpaint`` times the
inference backends (eager, TorchScript, ONNX Runtime) per provider, size and
batch, and measures the inference goals. Never used by tests for timing.

``bench_inpaint`` times *paths*: a backend, or ``backend:precision`` (``onnx:int8``,
``eager:bf16``, ``pt2:bf16``). Each row has the hole PSNR of its output against
eager fp32 on the same inputs and whether that passes the precision's gate
(:data:`PRECISION_GATES`); the fastest passing path is named per provider, size
and batch, and compared with torch bf16 + channels_last eager at 512 px, batch 1.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gantool.core.config import BENCH_TRAIN_BATCH, TrainConfig
from gantool.core.constants import (
    BACKENDS,
    BENCH_INPAINT_PATHS,
    DEFAULT_BLEND,
    DEFAULT_INT8_MIN_PSNR,
    PRECISION_BACKENDS,
)
from gantool.core.errors import GantoolError, InputError, ModelError, check_choice, choice_error, first_line
from gantool.core.processing import check_blend
from gantool.export.exporter import MIN_BF16_PSNR, MIN_FP16_PSNR
from gantool.export.parity import psnr_hole_uint8
from gantool.inference.inpainter import inpaint_images
from gantool.inference.pipeline import run_inpaint
from gantool.nn.networks import CompletionNetwork, ContextDiscriminator, crop_local, fold_batchnorm
from gantool.runtime.backends import load_backend
from gantool.runtime.providers import cuda_device_visible
from gantool.training.loop import (
    DiscriminatorPair,
    Networks,
    autocast_for,
    build_optimizers,
    resolve_device,
    train_step,
    use_amp,
    use_channels_last,
)


def _timed(step: Callable[[], object], steps: int, warmup: int, device: torch.device) -> list[float]:
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _random_batch(cfg: TrainConfig, device: torch.device, memory_format: torch.memory_format):
    g = torch.Generator().manual_seed(0)
    real = torch.rand(cfg.batch_size, 3, cfg.size, cfg.size, generator=g)
    mask = torch.zeros(cfg.batch_size, 1, cfg.size, cfg.size)
    corners = torch.randint(0, cfg.size - cfg.local_size + 1, (cfg.batch_size, 2), generator=g)
    for m, (t, l) in zip(mask, corners.tolist()):
        q = cfg.local_size // 4
        m[:, t + q : t + 3 * q, l + q : l + 3 * q] = 1
    return real.to(device, memory_format=memory_format), mask.to(device, memory_format=memory_format), corners


def gantool_step_fn(cfg: TrainConfig, device: torch.device, amp: bool, channels_last: bool) -> Callable[[], object]:
    torch.manual_seed(0)
    model_cfg = cfg.model_config()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    g = CompletionNetwork(model_cfg).to(device=device, memory_format=fmt)  # type: ignore[call-overload]
    d = ContextDiscriminator(model_cfg).to(device=device, memory_format=fmt)  # type: ignore[call-overload]
    nets = Networks(g, d, g, DiscriminatorPair(d))
    opt_g, opt_d = build_optimizers(nets, cfg)
    batch = _random_batch(cfg, device, fmt)
    autocast = autocast_for(device, amp)
    return lambda: train_step("joint", nets, opt_g, opt_d, batch, cfg, autocast)


def reference_step_fn(cfg: TrainConfig, device: torch.device) -> Callable[[], object]:
    """GLCIC-PyTorch's phase-3 iteration, reproduced for timing (same networks)."""
    torch.manual_seed(0)
    model_cfg = cfg.model_config()
    g = CompletionNetwork(model_cfg).to(device)
    d = ContextDiscriminator(model_cfg).to(device)
    opt_g, opt_d = torch.optim.Adadelta(g.parameters()), torch.optim.Adadelta(d.parameters())
    real, mask, corners = _random_batch(cfg, device, torch.contiguous_format)
    ones = torch.ones(cfg.batch_size, device=device)
    zeros = torch.zeros(cfg.batch_size, device=device)

    def step() -> None:
        output = g(real, mask)
        fake = output.detach()
        loss_fake = F.binary_cross_entropy(torch.sigmoid(d(crop_local(fake, corners, cfg.local_size), fake)), zeros)
        loss_real = F.binary_cross_entropy(torch.sigmoid(d(crop_local(real, corners, cfg.local_size), real)), ones)
        ((loss_fake + loss_real) * cfg.alpha / 2).backward()
        opt_d.step()
        opt_d.zero_grad()  # before G's backward: D's weight grads are computed (and leak) below
        loss_rec = F.mse_loss(output * mask, real * mask)
        loss_adv = F.binary_cross_entropy(torch.sigmoid(d(crop_local(output, corners, cfg.local_size), output)), ones)
        ((loss_rec + cfg.alpha * loss_adv) / 2).backward()
        opt_g.step()
        opt_g.zero_grad()

    return step


def bench_train(
    size: int = TrainConfig.size,
    local_size: int = TrainConfig.local_size,
    batch_size: int = BENCH_TRAIN_BATCH,
    width: int = TrainConfig.width,
    steps: int = 5,
    warmup: int = 2,
    device: str = "auto",
    amp: bool | None = None,
    channels_last: bool | None = None,
    reference: bool = True,
) -> dict[str, Any]:
    """Median seconds per joint iteration and images/s, for gantool and (optionally)
    the reference loop, with their ratio.

    ``amp`` and ``channels_last`` default as in ``gantool train`` (on for CUDA,
    off on the CPU), so the default benchmark times the default training setup.
    """
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**6:
            raise InputError(f"--{name} must be an integer in {low}..1000000, got {value!r}")
    cfg = TrainConfig(
        size=size,
        local_size=local_size,
        batch_size=batch_size,
        width=width,
        amp=amp,
        device=device,
        channels_last=channels_last,
    ).validate()
    dev = resolve_device(device)
    amp, channels_last = use_amp(cfg, dev), use_channels_last(cfg, dev)
    rows = []
    runs = [
        ("gantool", gantool_step_fn(cfg, dev, amp, channels_last), {"amp_bf16": amp, "channels_last": channels_last})
    ]
    if reference:
        runs.append(
            (
                "reference (GLCIC-PyTorch phase 3)",
                reference_step_fn(cfg, dev),
                {"amp_bf16": False, "channels_last": False},
            )
        )
    for name, fn, flags in runs:
        times = _timed(fn, steps, warmup, dev)
        median = statistics.median(times)
        rows.append(
            {
                "name": name,
                **flags,
                "median_s_per_iter": median,
                "images_per_s": batch_size / median,
                "min_s": min(times),
                "max_s": max(times),
                "steps": steps,
            }
        )
    result: dict[str, Any] = {
        "benchmark": "train",
        "device": str(dev),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "size": size,
        "local_size": local_size,
        "batch_size": batch_size,
        "width": width,
        "rows": rows,
    }
    if reference:
        result["speedup_vs_reference"] = float(rows[1]["median_s_per_iter"]) / float(rows[0]["median_s_per_iter"])  # type: ignore[arg-type]
    return result


# ------------------------------------------------------------------------ bench inpaint

# Slowest first, as the table reads best.
INPAINT_BACKENDS = BACKENDS[::-1]
# The paths `gantool bench inpaint` times by default: each backend, and the precisions it can run.
INPAINT_PATHS = BENCH_INPAINT_PATHS
# Each precision's gate against eager fp32 on the same inputs: ("max_abs", limit) or ("psnr_hole", dB).
# fp32's limit allows TF32 on GPUs and reordered sums; the others are the export gates.
PRECISION_GATES: dict[str, tuple[str, float]] = {
    "fp32": ("max_abs", 1e-3),
    "fp16": ("psnr_hole", MIN_FP16_PSNR),
    "bf16": ("psnr_hole", MIN_BF16_PSNR),
    "int8": ("psnr_hole", DEFAULT_INT8_MIN_PSNR),
}
# The baseline of the speed goal: plain PyTorch at its best (bf16 autocast + channels_last).
GOAL_BASELINE = "eager:bf16"
GOAL_SPEEDUP = 1.2


def parse_path(path: str) -> tuple[str, str]:
    """``"onnx:int8"`` -> ("onnx", "int8"); ``"pt2"`` -> ("pt2", "fp32")."""
    backend, _, precision = path.partition(":")
    precision = precision or "fp32"
    check_choice("backend", backend, INPAINT_BACKENDS)
    if precision not in PRECISION_GATES or (precision != "fp32" and backend not in PRECISION_BACKENDS[precision]):
        choices = [p for p in INPAINT_PATHS if p.startswith(backend)]
        raise choice_error("path", path, choices)
    return backend, precision


def _peak_rss_reset() -> bool:
    """Reset the kernel's peak-RSS counter (Linux: writing 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class _PeakMemory:
    """Peak resident memory above the starting point while the block runs, in MB.

    Linux: VmHWM after the block minus VmRSS before it, with the peak counter
    reset first (so native allocations of torch and ONNX Runtime count, which
    tracemalloc cannot see). Elsewhere: the growth of ru_maxrss, a lower bound
    (0 when an earlier run already went higher).
    """

    def __enter__(self) -> _PeakMemory:
        import resource

        self.exact = _peak_rss_reset()
        self.start_kb = _status_kb("VmRSS") if self.exact else None
        if self.start_kb is None:
            self.exact = False
            scale = 1 if sys.platform != "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
            self.start_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // scale
        self.peak_mb: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        import resource

        if self.exact:
            peak_kb = _status_kb("VmHWM")
        else:
            scale = 1 if sys.platform != "darwin" else 1024
            peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // scale
        if peak_kb is not None and self.start_kb is not None:
            self.peak_mb = max(0, peak_kb - self.start_kb) / 1024


class _TracedTorchScript:
    """The BN-folded eager generator traced in memory: the TorchScript backend
    for a model folder that ships no generator.torchscript.pt (as models/)."""

    name = "torchscript"

    def __init__(self, eager: Any) -> None:
        folded = fold_batchnorm(eager.module.cpu()).to(eager.device)
        side = eager.size_multiple * 8
        example = (
            torch.rand(1, 3, side, side, device=eager.device),
            torch.zeros(1, 1, side, side, device=eager.device),
        )
        with torch.no_grad(), warnings.catch_warnings():
            # Local: TorchScript's deprecation notice is not the user's concern here.
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13
            warnings.simplefilter("ignore", FutureWarning)  # torch 2.14
            self.module = torch.jit.trace(folded, example, check_trace=False)
        self.device, self.provider, self.config = eager.device, eager.provider, eager.config
        self.size_multiple, self.train_size = eager.size_multiple, eager.train_size
        self.precision = "fp32"

    def run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = self.module(torch.from_numpy(image).to(self.device), torch.from_numpy(mask).to(self.device))
        return out.float().cpu().numpy()


def open_inpaint_backend(
    model: str | Path | None, backend: str, provider: str, precision: str = "fp32"
) -> tuple[Any, str]:
    """(runner with ``run(image, mask)``, note) for one backend on one provider."""
    try:
        return load_backend(model, provider, backend, precision), ""
    except ModelError:
        if backend != "torchscript":
            raise
    eager = load_backend(model, provider, "eager")
    return _TracedTorchScript(eager), "no generator.torchscript.pt: the folded generator traced in memory"


def count_generator_flops(config: Any, size: int, batch: int) -> int:
    """FLOPs of one eager generator forward (torch.utils.flop_counter; 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    generator = CompletionNetwork(config).eval()  # FLOPs depend on shapes only, not on weights
    image, mask = torch.zeros(batch, 3, size, size), torch.zeros(batch, 1, size, size)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        generator(image, mask)
    return int(counter.get_total_flops())


def _bench_inputs(size: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    image = rng.random((batch, 3, size, size), dtype=np.float32)
    mask = np.zeros((batch, 1, size, size), np.float32)
    mask[..., size // 4 : size // 2, size // 4 : size // 2] = 1.0
    return image, mask


def _resolve_providers(providers: Sequence[str]) -> list[str]:
    out: list[str] = []
    for p in providers:
        if p == "auto":
            out += ["cpu", "cuda"] if cuda_device_visible() else ["cpu"]
        else:
            out.append(p)
    return list(dict.fromkeys(out))


class _Reference:
    """Eager fp32 outputs on the CPU, per (size, batch): what every row's hole PSNR is measured against."""

    def __init__(self, model: str | Path | None) -> None:
        self.model = model
        self.backend: Any = None  # opened on first use
        self.outputs: dict[tuple[int, ...], np.ndarray] = {}

    def output(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        key = image.shape
        if key not in self.outputs:
            if self.backend is None:
                self.backend = load_backend(self.model, "cpu", "eager", "fp32")
            self.outputs[key] = self.backend.run(image, mask)
        return self.outputs[key]


def _gate(precision: str, output: np.ndarray, reference: np.ndarray, mask: np.ndarray) -> tuple[float, bool]:
    """(hole PSNR vs fp32, whether the output passes its precision's gate)."""
    psnr = psnr_hole_uint8(output, reference, mask)
    kind, limit = PRECISION_GATES[precision]
    if kind == "max_abs":
        finite = bool(np.isfinite(output).all())
        return psnr, finite and float(np.abs(output.astype(np.float64) - reference).max()) <= limit
    return psnr, psnr >= limit


def bench_backend_rows(
    model: str | Path | None,
    backends: Sequence[str],
    providers: Sequence[str],
    sizes: Sequence[int],
    batches: Sequence[int],
    repeats: int,
    warmup: int,
) -> list[dict[str, Any]]:
    """One row per path (``backend`` or ``backend:precision``) x provider x size x batch."""
    rows: list[dict[str, Any]] = []
    flops: dict[tuple[int, int], int] = {}
    reference = _Reference(model)
    for path in backends:
        backend, precision = parse_path(path)
        for provider in providers:
            base = {"backend": backend, "precision": precision, "provider": provider}
            try:
                runner, note = open_inpaint_backend(model, backend, provider, precision)
            except GantoolError as e:
                rows.append({**base, "error": first_line(e)})
                continue
            base["provider"] = runner.provider  # what really runs
            for size in sizes:
                for batch in batches:
                    row = {**base, "size": size, "batch": batch, "note": note}
                    if size % runner.size_multiple:
                        rows.append({**row, "error": f"size must be a multiple of {runner.size_multiple}"})
                        continue
                    key = (size, batch)
                    if key not in flops:
                        flops[key] = count_generator_flops(runner.config, size, batch)
                    image, mask = _bench_inputs(size, batch)
                    gpu = "cuda" in str(runner.provider).lower()
                    if gpu and torch.cuda.is_available():
                        torch.cuda.reset_peak_memory_stats()
                    try:
                        with _PeakMemory() as memory:
                            times = _timed(lambda: runner.run(image, mask), repeats, warmup, torch.device("cpu"))
                        psnr, passed = _gate(precision, runner.run(image, mask), reference.output(image, mask), mask)
                    except (GantoolError, MemoryError, RuntimeError) as e:
                        rows.append({**row, "error": first_line(e)})
                        continue
                    median = statistics.median(times)
                    row.update(
                        {
                            "median_ms_per_batch": median * 1e3,
                            "min_ms_per_batch": min(times) * 1e3,
                            "max_ms_per_batch": max(times) * 1e3,
                            "psnr_hole_vs_fp32": psnr,
                            "passes_gate": passed,
                            "median_ms_per_image": median * 1e3 / batch,
                            "images_per_s": batch / median,
                            "gflop_per_image": flops[key] / batch / 1e9,
                            "achieved_gflop_per_s": flops[key] / median / 1e9,
                            "peak_rss_mb": memory.peak_mb,
                            "peak_rss_exact": memory.exact,
                            "peak_cuda_mb": (
                                torch.cuda.max_memory_allocated() / 2**20
                                if gpu and backend != "onnx" and torch.cuda.is_available()
                                else None
                            ),
                            "runs": repeats,
                        }
                    )
                    rows.append(row)
    return rows


class _TimedBackend:
    """Delegates to a backend and sums the seconds spent in ``run``."""

    def __init__(self, backend: Any) -> None:
        self._backend, self.run_seconds, self.calls = backend, 0.0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        try:
            return self._backend.run(image, mask)
        finally:
            self.run_seconds += time.perf_counter() - start
            self.calls += 1


def _box_mask_array(size: int, hole: int) -> np.ndarray:
    mask = np.zeros((size, size), np.uint8)
    start = (size - hole) // 2
    mask[start : start + hole, start : start + hole] = 255
    return mask


def _write_bench_folder(root: Path, images: int, size: int) -> tuple[Path, Path]:
    """``root/images/img_NNN.png`` (size x size) and ``root/mask.png`` (one centred box)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder = root / "images"
    folder.mkdir()
    # Smooth images with noise: PNG sizes like photos', not like flat colour.
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for i in range(images):
        base = np.stack([x, y, (x + y) / 2], axis=2) * 180 + rng.integers(0, 60, (size, size, 3))
        Image.fromarray(base.astype(np.uint8)).save(folder / f"img_{i:03d}.png")
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
        folder, mask_path = _write_bench_folder(Path(tmp), images, size)
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
        timings[name] = statistics.median(_timed(run, repeats, 1, torch.device("cpu")))
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
    from gantool.runtime.backends import load_backend

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

        blend_times = _timed(post_process, repeats, 1, torch.device("cpu"))
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


def _device_kind(provider: str) -> str:
    text = provider.lower()
    return "cuda" if "cuda" in text or "tensorrt" in text else "cpu"


def fastest_passing(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``"<cpu|cuda> <size>px batch <n>"``: the fastest row that passes its gate."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if "error" in row or not row["passes_gate"]:
            continue
        key = f"{_device_kind(row['provider'])} {row['size']}px batch {row['batch']}"
        if key not in best or row["median_ms_per_image"] < best[key]["median_ms_per_image"]:
            best[key] = row
    return {
        key: {
            "path": path_label(row),
            "provider": row["provider"],
            "median_ms_per_image": row["median_ms_per_image"],
            "psnr_hole_vs_fp32": row["psnr_hole_vs_fp32"],
        }
        for key, row in best.items()
    }


def path_label(row: dict[str, Any]) -> str:
    return row["backend"] if row.get("precision", "fp32") == "fp32" else f"{row['backend']}:{row['precision']}"


def speed_goals(rows: Sequence[dict[str, Any]], size: int = 512, batch: int = 1) -> dict[str, dict[str, Any]]:
    """The two speed goals at ``size`` px, ``batch``, on the CPU: ONNX Runtime fp32 vs torch eager fp32,
    and the fastest path passing its gate vs torch bf16 + channels_last eager (each only when measured)."""
    goals: dict[str, dict[str, Any]] = {}
    fp32_rows = [r for r in rows if "error" not in r and r.get("precision", "fp32") == "fp32"]
    timed = {(r["backend"], r["provider"], r["size"], r["batch"]): r for r in fp32_rows}
    eager = timed.get(("eager", "cpu", size, batch))
    ort_cpu = timed.get(("onnx", "CPUExecutionProvider", size, batch))
    if eager and ort_cpu:
        speedup = eager["median_ms_per_image"] / ort_cpu["median_ms_per_image"]
        goals[f"ort_cpu_vs_eager_{size}_b{batch}"] = {"speedup": speedup, "goal": 1.2, "met": speedup >= 1.2}
    baseline = next(
        (r for r in rows if "error" not in r and path_label(r) == GOAL_BASELINE and r["provider"] == "cpu"
         and (r["size"], r["batch"]) == (size, batch)),
        None,
    )  # fmt: skip
    best = fastest_passing(rows).get(f"cpu {size}px batch {batch}")
    if baseline and best:
        ratio = baseline["median_ms_per_image"] / best["median_ms_per_image"]
        goals[f"fastest_vs_torch_bf16_{size}_b{batch}"] = {
            "fastest": best["path"], "fastest_ms": best["median_ms_per_image"],
            "baseline": "torch bf16 autocast + channels_last eager (BN folded)",
            "baseline_ms": baseline["median_ms_per_image"], "speedup": ratio, "goal": GOAL_SPEEDUP,
            "met": ratio >= GOAL_SPEEDUP,
        }  # fmt: skip
    return goals


def bench_inpaint(
    model: str | Path | None = None,
    sizes: Sequence[int] = (256, 512),
    batches: Sequence[int] = (1, 8),
    backends: Sequence[str] = INPAINT_PATHS,
    providers: Sequence[str] = ("auto",),
    repeats: int = 5,
    warmup: int = 1,
    e2e_images: int = 32,
    e2e_size: int = 512,
    e2e_strategy: str = "auto",
    crop_check: bool = True,
    goal_provider: str = "cpu",
    blend: str = DEFAULT_BLEND,
    blend_check: bool = True,
) -> dict[str, Any]:
    """Median ms per image, images/s, achieved GFLOP/s and peak memory for each
    backend x provider x size x batch, plus the three inference goals measured
    side by side (ORT CPU vs eager at 512 px batch 1; time outside the model in
    the file loop; crop on 2048 px vs a 256 px image), and the cost of ``blend`` next to
    the model's at 512 px with a 128 px hole (goal <= 15 %). Never used for timed tests."""
    check_blend(blend)
    for path in backends:
        parse_path(path)
    if not sizes or not batches or min(sizes) < 4 or min(batches) < 1:
        raise InputError("--sizes and --batch need positive values (sizes at least 4)")
    if repeats < 1 or warmup < 0 or e2e_images < 0:
        raise InputError("--repeats must be at least 1; --warmup and --e2e-images at least 0")
    resolved = _resolve_providers(providers)
    rows = bench_backend_rows(model, backends, resolved, sizes, batches, repeats, warmup)
    result: dict[str, Any] = {
        "benchmark": "inpaint",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "model": str(model) if model is not None else "(shipped model)",
        "rows": rows,
        "peak_memory": "peak resident memory above the process's level before each measurement "
        "(Linux VmHWM, reset per measurement; else ru_maxrss growth, a lower bound)",
        "goals": {},
    }
    result["fastest_passing"] = fastest_passing(rows)
    goals = result["goals"]
    goals.update(speed_goals(rows))
    if e2e_images:
        e2e = bench_end_to_end(model, e2e_images, e2e_size, goal_provider, e2e_strategy, blend=blend)
        e2e.update(goal=0.15, met=e2e["outside_model_fraction"] is not None and e2e["outside_model_fraction"] <= 0.15)
        goals["end_to_end_outside_model"] = e2e
    if crop_check:
        crop = bench_crop(model, goal_provider)
        crop.update(goal=2.0, met=crop["ratio"] <= 2.0)
        goals["crop_2048_vs_256"] = crop
    if blend_check and blend != "none":
        rows_blend = bench_blend(model, goal_provider, blend=blend)
        result["blend_rows"] = rows_blend
        full = next(r for r in rows_blend if r["strategy"] == "full")
        goals["blend_vs_model_512"] = {**full, "goal": 0.15, "met": full["blend_vs_model"] <= 0.15}
    return result


def bench_ray_inpaint(
    model: str | Path | None = None,
    images: int = 200,
    size: int = 512,
    provider: str = "cpu",
    strategy: str = "auto",
    batch_size: int = 4,
    actors: int | None = None,
    address: str | None = None,
) -> dict[str, Any]:
    """``gantool inpaint --ray`` against ``gantool inpaint`` on the same folder.

    The local pipeline's rate is images / wall time with the model already open.
    The Ray path's per-image rate is measured on the driver between the first and
    the last batch of results (they stream back one batch at a time); its fixed
    start-up (ray.init, starting the actors and opening the model in each, the
    first batch) is the rest of its wall time, reported apart.
    """
    import tempfile

    from gantool.inference.ray import import_ray, ray_inpaint

    if images < 4 * batch_size:
        raise InputError(f"--e2e-images must be at least {4 * batch_size} to measure the Ray path's rate")
    ray = import_ray()
    with tempfile.TemporaryDirectory(prefix="gantool-bench-ray-") as tmp:
        root = Path(tmp)
        folder, mask_path = _write_bench_folder(root, images, size)
        start = time.perf_counter()
        backend = load_backend(model, provider, "onnx")
        local_load = time.perf_counter() - start
        start = time.perf_counter()
        local = run_inpaint([folder], backend, mask=mask_path, output=root / "local", strategy=strategy,
                            batch_size=batch_size)  # fmt: skip
        local_wall = time.perf_counter() - start

        started_here = not ray.is_initialized()
        start = time.perf_counter()
        if started_here:
            ray.init(address=address, include_dashboard=False, logging_level="WARNING")
        init_s = time.perf_counter() - start
        try:
            summary = ray_inpaint([folder], model=model, provider=provider, backend_name="onnx", mask=mask_path,
                                  output=root / "ray", strategy=strategy, batch_size=batch_size,
                                  actors=actors)  # fmt: skip
        finally:
            if started_here:
                ray.shutdown()
    done = sorted(summary.finished_at)
    if len(done) != images:
        raise GantoolError(f"the Ray run reported {len(done)} of {images} images")
    steady_s = done[-1] - done[batch_size - 1]  # from the end of the first batch to the last result
    rate = (images - batch_size) / steady_s if steady_s > 0 else float("inf")
    local_rate = images / local_wall
    ray_wall = init_s + summary.seconds
    return {
        "benchmark": "inpaint --ray",
        "images": images, "size": size, "strategy": strategy, "batch_size": batch_size,
        "provider": summary.provider, "where": summary.where, "cpu_count": os.cpu_count(),
        "local": {"model_load_s": local_load, "wall_s": local_wall, "images_per_s": local_rate,
                  "failed": local.failed},
        "ray": {"ray_init_s": init_s, "wall_s": ray_wall, "images_per_s": rate,
                "startup_s": ray_wall - images / rate, "first_batch_s": summary.startup_seconds,
                "failed": summary.failed},
        "ratio": rate / local_rate,
        "goal": 0.8,
        "met": rate / local_rate >= 0.8,
        "measures": "images/s of the local pipeline (model open) vs the Ray path between its first and last "
                    "batch of results; Ray's fixed start-up = its wall time (with ray.init) minus images / that rate",
    }  # fmt: skip


# -------------------------------------------------------------------------- bench serve

SERVE_GOAL_RATIO = 0.85
SERVE_GOAL_RSS_GROWTH = 0.10


def _process_rss_mb(pid: int) -> float | None:
    """Resident memory of another process (Linux /proc), None elsewhere."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _serve_inputs(size: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` distinct smooth-plus-noise RGB images with a centred square hole (size / 4)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    hole = np.zeros((size, size), np.uint8)
    lo, hi = size * 3 // 8, size * 5 // 8
    hole[lo:hi, lo:hi] = 255
    items = []
    for seed in range(count):
        rng = np.random.default_rng(seed)
        base = np.stack([x, y, 0.5 + 0.4 * np.sin(x * 20 + y * 13 + seed)], axis=2)
        rgb = np.clip(base * 200 + rng.integers(0, 50, (size, size, 3)), 0, 255).astype(np.uint8)
        items.append((rgb, hole))
    return items


def _png(array: np.ndarray) -> bytes:
    from io import BytesIO

    from PIL import Image

    buffer = BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _multipart(image: bytes, mask: bytes, boundary: str) -> bytes:
    parts = []
    for name, data in (("image", image), ("mask", mask)):
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.png"\r\n'
            "Content-Type: image/png\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


class _ServerProcess:
    """``gantool serve --port 0`` in a subprocess; its output is drained on a thread."""

    def __init__(self, args: list[str], timeout_s: float) -> None:
        import subprocess
        import threading

        import gantool

        env = dict(os.environ)
        package_root = str(Path(gantool.__file__).resolve().parents[1])  # so `-m gantool` finds this gantool
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gantool", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.url: str | None = None
        found = threading.Event()

        def drain() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))
                if self.url is None and line.startswith("serving on "):
                    self.url = line.split()[2].rstrip("/")
                    found.set()
            found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(timeout_s) or self.url is None:
            self.stop()
            from gantool.core.errors import GantoolError

            tail = " | ".join(self.lines[-3:]) or "no output"
            raise GantoolError(f"gantool serve did not start: {tail}")

    def stop(self) -> None:
        import subprocess

        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _wait_ready(url: str, deadline: float) -> None:
    import urllib.error
    import urllib.request

    from gantool.core.errors import GantoolError

    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise GantoolError(f"{url} was not ready in time")


def bench_serve(
    model: str | Path | None = None,
    requests: int = 200,
    concurrency: int = 8,
    size: int = 512,
    provider: str = "auto",
    backend: str = "auto",
    precision: str = "auto",
    max_batch: int | None = None,
    batch_wait_ms: float | None = None,
    baseline_images: int = 16,
    distinct_images: int = 8,
    timeout_s: float = 1800.0,
    rounds: int = 1,
) -> dict[str, Any]:
    """``gantool serve`` under load against the in-process :class:`gantool.Inpainter`.

    One server starts on a free loopback port; ``rounds`` times, ``concurrency``
    client threads (keep-alive connections) send ``requests`` POST /v1/inpaint
    of the same images (PNG, a centred size/4 hole). The in-process throughput
    (``baseline_images`` images, one ``Inpainter.inpaint`` call each) is measured
    before the first round, between rounds and after the last; each round is
    compared with the mean of the measurements on either side of it, so a change
    in machine load does not favour one side. Medians and ranges over the rounds
    are reported. The first answer for each image is checked (size, known
    pixels). Every loop is bounded by count and by ``timeout_s``.
    """
    import http.client
    import threading
    from io import BytesIO
    from urllib.parse import urlsplit

    from PIL import Image

    from gantool import Inpainter
    from gantool.core.constants import DEFAULT_SERVE_BATCH_WAIT_MS, DEFAULT_SERVE_MAX_BATCH
    from gantool.core.errors import InputError

    if min(requests, concurrency, baseline_images, distinct_images, rounds) < 1:
        raise InputError("--requests, --concurrency, --baseline-images, --images and --rounds must be at least 1")
    if size < 8:
        raise InputError("--size must be at least 8")
    max_batch = max_batch or DEFAULT_SERVE_MAX_BATCH
    batch_wait_ms = DEFAULT_SERVE_BATCH_WAIT_MS if batch_wait_ms is None else batch_wait_ms
    deadline = time.monotonic() + timeout_s
    inputs = _serve_inputs(size, distinct_images)

    inpainter = Inpainter(model, provider, backend, precision=precision, batch_size=max_batch)
    masks = [(mask > 127).astype(np.float32) for _, mask in inputs]
    inpainter.inpaint(inputs[0][0], masks[0])  # warm-up

    def in_process_ips() -> float:
        start = time.perf_counter()
        for index in range(baseline_images):
            inpainter.inpaint(inputs[index % len(inputs)][0], masks[index % len(inputs)])
        return baseline_images / (time.perf_counter() - start)

    def with_codec_seconds() -> float:
        """The same, from PNG bytes to PNG bytes with the server's own decode/encode."""
        from gantool.serving.app import decode_request, encode_image  # the serve extra (FastAPI)

        start = time.perf_counter()
        for index in range(baseline_images):
            image_png, mask_png = pngs[index % len(pngs)]
            image, holes = decode_request(BytesIO(image_png), BytesIO(mask_png), [], size * size)
            encode_image(inpainter.inpaint(image, holes), "png")
        return time.perf_counter() - start

    pngs = [(_png(rgb), _png(mask)) for rgb, mask in inputs]
    codec_s = [with_codec_seconds()]
    model_name, backend_name, provider_name = str(inpainter.backend.path), inpainter.backend.name, inpainter.provider

    boundary = "gantoolbench"
    bodies = [_multipart(image_png, mask_png, boundary) for image_png, mask_png in pngs]
    args = [
        "--provider",
        provider,
        "--backend",
        backend,
        "--precision",
        precision,
        "--max-batch",
        str(max_batch),
        "--batch-wait-ms",
        str(batch_wait_ms),
        "--max-queue",
        str(max(16, 2 * concurrency)),
    ]
    if model is not None:
        args += ["--model", str(model)]
    baselines = [in_process_ips()]
    latencies: list[float] = []
    errors: list[str] = []
    checked: set[int] = set()
    lock = threading.Lock()
    state: dict[str, Any] = {"done": 0, "rss_at_50": None}
    round_rows: list[dict[str, Any]] = []
    server = _ServerProcess(args, max(1.0, deadline - time.monotonic()))
    try:
        assert server.url is not None
        _wait_ready(server.url, deadline)
        pid = server.process.pid
        rss_ready = _process_rss_mb(pid)
        parts = urlsplit(server.url)

        def check(index: int, data: bytes) -> str | None:
            rgb, mask = inputs[index]
            with Image.open(BytesIO(data)) as img:
                result = np.asarray(img.convert("RGB"))
            if result.shape != rgb.shape:
                return f"answer is {result.shape[1]}x{result.shape[0]}, not {size}x{size}"
            if not np.array_equal(result[mask <= 127], rgb[mask <= 127]):
                return "known pixels changed"
            return None

        def new_connection() -> http.client.HTTPConnection:
            return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=300)

        def one_round() -> dict[str, Any]:
            issued = {"next": 0}
            ok_before, errors_before = len(latencies), len(errors)

            def client() -> None:
                connection = new_connection()
                while True:
                    with lock:
                        number = issued["next"]
                        if number >= requests or time.monotonic() > deadline:
                            break
                        issued["next"] += 1
                    index = number % len(bodies)
                    began = time.perf_counter()
                    problem = None
                    try:
                        connection.request(
                            "POST",
                            "/v1/inpaint",
                            body=bodies[index],
                            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
                        )
                        response = connection.getresponse()
                        data = response.read()
                        if response.status != 200:
                            problem = f"HTTP {response.status}: {data[:200]!r}"
                    except (OSError, http.client.HTTPException) as e:
                        problem = f"{type(e).__name__}: {e}"
                        connection.close()
                        connection = new_connection()
                    elapsed = time.perf_counter() - began
                    with lock:
                        first_answer = problem is None and index not in checked
                        checked.add(index)
                    if first_answer:
                        problem = check(index, data)
                    with lock:
                        state["done"] += 1
                        if problem is None:
                            latencies.append(elapsed)
                        else:
                            errors.append(problem)
                        if state["done"] == min(50, requests):
                            state["rss_at_50"] = _process_rss_mb(pid)
                connection.close()

            threads = [threading.Thread(target=client, name=f"bench-client-{i}") for i in range(concurrency)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(max(1.0, deadline - time.monotonic() + 310))
            wall_s = time.perf_counter() - start
            ok = len(latencies) - ok_before
            return {
                "sent": issued["next"],
                "ok": ok,
                "errors": len(errors) - errors_before,
                "wall_s": wall_s,
                "images_per_s": ok / wall_s,
            }

        for _ in range(rounds):
            if time.monotonic() > deadline:
                break
            round_rows.append(one_round())
            baselines.append(in_process_ips())  # after this round, before the next
        rss_end = _process_rss_mb(pid)
    finally:
        server.stop()
    codec_s.append(with_codec_seconds())

    for number, row in enumerate(round_rows):
        row["in_process_images_per_s"] = statistics.mean(baselines[number : number + 2])
        row["ratio"] = row["images_per_s"] / row["in_process_images_per_s"]
    served = len(latencies)
    ms = np.asarray(latencies) * 1e3 if latencies else np.asarray([np.nan])

    def median_and_range(key: str) -> tuple[float, list[float]]:
        values = [row[key] for row in round_rows] or [0.0]
        return statistics.median(values), [min(values), max(values)]

    server_ips, server_range = median_and_range("images_per_s")
    in_process, in_process_range = median_and_range("in_process_images_per_s")
    ratio, ratio_range = median_and_range("ratio")
    codec_ips = baseline_images / statistics.mean(codec_s)
    rss_at_50 = state["rss_at_50"]
    rss_growth = (rss_end - rss_at_50) / rss_at_50 if rss_end is not None and rss_at_50 else None
    return {
        "benchmark": "serve",
        "model": model_name,
        "backend": backend_name,
        "provider": provider_name,
        "cpu_count": os.cpu_count(),
        "size": size,
        "requests": requests,
        "rounds": rounds,
        "sent": sum(row["sent"] for row in round_rows),
        "concurrency": concurrency,
        "max_batch": max_batch,
        "batch_wait_ms": batch_wait_ms,
        "ok": served,
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)),
            "p95": float(np.percentile(ms, 95)),
            "p99": float(np.percentile(ms, 99)),
        },
        "per_round": round_rows,
        # Medians over the rounds, and their min-max.
        "server_images_per_s": server_ips,
        "server_images_per_s_range": server_range,
        "in_process_images_per_s": in_process,
        "in_process_images_per_s_range": in_process_range,
        "in_process_images": baseline_images,
        "in_process_measurements": baselines,
        "ratio": ratio,
        "ratio_range": ratio_range,
        # PNG bytes in and out, as the server does: what HTTP and batching alone cost.
        "in_process_png_images_per_s": codec_ips,
        "ratio_to_png_in_process": server_ips / codec_ips if codec_ips > 0 else 0.0,
        "rss_mb": {"ready": rss_ready, "after_50": rss_at_50, "after_all": rss_end},
        "goals": {
            "throughput": {
                "goal": SERVE_GOAL_RATIO,
                "ratio": ratio,
                "errors": len(errors),
                "met": ratio >= SERVE_GOAL_RATIO and not errors and served == requests * rounds,
            },
            "rss_stable": {
                "goal": SERVE_GOAL_RSS_GROWTH,
                "growth": rss_growth,
                "met": rss_growth is not None and rss_growth <= SERVE_GOAL_RSS_GROWTH,
            },
        },
    }

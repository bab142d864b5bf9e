"""`gantool bench inpaint`: inference paths (a backend, or ``backend:precision``) timed per provider,
size and batch, each with its hole PSNR against eager fp32 and its gate (:data:`PRECISION_GATES`); also
the end-to-end file pipeline, the crop strategy and the blend (:mod:`gantool.tools.bench_pipeline`).
Never used by tests for timing."""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gantool.core.constants import (
    BACKENDS,
    BENCH_INPAINT_PATHS,
    DEFAULT_BLEND,
    DEFAULT_INT8_MIN_PSNR,
    PRECISION_BACKENDS,
    PROVIDERS,
)
from gantool.core.errors import GantoolError, InputError, ModelError, check_choice, choice_error, first_line
from gantool.core.processing import check_blend
from gantool.export.exporter import MIN_BF16_PSNR, MIN_FP16_PSNR
from gantool.export.parity import psnr_hole_uint8
from gantool.nn.networks import CompletionNetwork, fold_batchnorm
from gantool.runtime.backends import load_backend
from gantool.runtime.providers import cuda_device_visible
from gantool.tools.bench_pipeline import bench_blend, bench_crop, bench_end_to_end
from gantool.tools.interleave import PeakMemory, cpu_peak, interleaved, paired_ratio

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
GOAL_SPEEDUP = 1.8
# The default path (`gantool inpaint` with default options) against ONNX Runtime fp32 on the CPU.
GOAL_DEFAULT_SPEEDUP = 2.5


def parse_path(path: str) -> tuple[str, str]:
    """``"onnx:int8"`` -> ("onnx", "int8"); ``"pt2"`` -> ("pt2", "fp32")."""
    backend, _, precision = path.partition(":")
    precision = precision or "fp32"
    check_choice("backend", backend, INPAINT_BACKENDS)
    if precision not in PRECISION_GATES or (precision != "fp32" and backend not in PRECISION_BACKENDS[precision]):
        choices = [p for p in INPAINT_PATHS if p.startswith(backend)]
        raise choice_error("path", path, choices)
    return backend, precision


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

    def run(self, image: np.ndarray, mask: np.ndarray, release_memory_pixels: int = 0) -> np.ndarray:
        # release_memory_pixels: ignored (torch's CPU allocator keeps no arena to give back)
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
        check_choice("provider", p, PROVIDERS)  # a typo ("gpu") fails here, not as a table of error rows
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

    def _open(self) -> Any:
        """Eager fp32; for a model file, from its folder's weights, else ONNX Runtime fp32 on the file."""
        tries = [(self.model, "eager")]
        if self.model is not None and not Path(self.model).is_dir():
            tries += [(Path(self.model).parent, "eager"), (self.model, "onnx")]
        for model, backend in tries[:-1]:
            with contextlib.suppress(ModelError):
                return load_backend(model, "cpu", backend, "fp32")
        return load_backend(tries[-1][0], "cpu", tries[-1][1], "fp32")

    def output(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        key = image.shape
        if key not in self.outputs:
            if self.backend is None:
                self.backend = self._open()
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


# long: the rows of one size and batch timed round by round; the loop over paths and its error rows read as one table
def bench_backend_rows(
    model: str | Path | None,
    backends: Sequence[str],
    providers: Sequence[str],
    sizes: Sequence[int],
    batches: Sequence[int],
    repeats: int,
    warmup: int,
) -> list[dict[str, Any]]:
    """One row per path (``backend`` or ``backend:precision``) x provider x size x batch.

    At each size and batch every path runs once per round, round by round (A, B, ..., B, A), so
    a noisy neighbour hits every row alike; ``times_ms`` keeps each round for paired ratios."""
    rows: list[dict[str, Any]] = []
    flops: dict[tuple[int, int], int] = {}
    reference = _Reference(model)
    opened: list[tuple[dict[str, Any], Any, str]] = []
    for path in backends:
        backend, precision = parse_path(path)
        for provider in providers:
            base = {"backend": backend, "precision": precision, "provider": provider, "_order": (len(opened),)}
            try:
                runner, note = open_inpaint_backend(model, backend, provider, precision)
            except GantoolError as e:
                rows.append({**base, "error": first_line(e)})
                runner, note = None, ""
            opened.append(({**base, "provider": getattr(runner, "provider", provider)}, runner, note))
    opened = [entry for entry in opened if entry[1] is not None]
    peaks = cpu_peak()
    for size_index, size in enumerate(sizes):
        for batch_index, batch in enumerate(batches):
            image, mask = _bench_inputs(size, batch)
            live: list[tuple[dict[str, Any], Any]] = []
            for base, runner, note in opened:
                order = (*base["_order"], size_index, batch_index)
                row = {**base, "_order": order, "size": size, "batch": batch, "note": note}
                if size % runner.size_multiple:
                    rows.append({**row, "error": f"size must be a multiple of {runner.size_multiple}"})
                    continue
                if (size, batch) not in flops:
                    flops[size, batch] = count_generator_flops(runner.config, size, batch)
                gpu = "cuda" in str(runner.provider).lower()
                if gpu and torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                try:
                    with PeakMemory() as memory:  # the first run allocates what the others reuse
                        out = runner.run(image, mask)
                    psnr, passed = _gate(str(base["precision"]), out, reference.output(image, mask), mask)
                except (GantoolError, MemoryError, RuntimeError) as e:
                    rows.append({**row, "error": first_line(e)})
                    continue
                torch_gpu = gpu and row["backend"] != "onnx" and torch.cuda.is_available()
                row.update(
                    psnr_hole_vs_fp32=psnr, passes_gate=passed, peak_rss_mb=memory.peak_mb,
                    peak_rss_exact=memory.exact,
                    peak_cuda_mb=torch.cuda.max_memory_allocated() / 2**20 if torch_gpu else None,
                )  # fmt: skip
                live.append((row, runner))
            steps = [functools.partial(runner.run, image, mask) for _, runner in live]
            try:
                all_times = interleaved(steps, repeats, max(0, warmup - 1), torch.device("cpu"))
            except (GantoolError, MemoryError, RuntimeError) as e:
                rows += [{**row, "error": first_line(e)} for row, _ in live]
                continue
            for (row, _), times in zip(live, all_times):
                median = statistics.median(times)
                achieved = flops[size, batch] / median / 1e9
                on_cpu = "cuda" not in str(row["provider"]).lower() and "tensorrt" not in str(row["provider"]).lower()
                peak = peaks["gops"].get(row["precision"]) if on_cpu else None
                row.update(
                    {
                        "median_ms_per_batch": median * 1e3,
                        "min_ms_per_batch": min(times) * 1e3,
                        "max_ms_per_batch": max(times) * 1e3,
                        "times_ms": [t * 1e3 for t in times],
                        "median_ms_per_image": median * 1e3 / batch,
                        "images_per_s": batch / median,
                        "gflop_per_image": flops[size, batch] / batch / 1e9,
                        "achieved_gflop_per_s": achieved,
                        "fraction_of_peak": achieved / peak if peak else None,
                        "runs": repeats,
                    }
                )
                rows.append(row)
    rows.sort(key=lambda r: r["_order"])  # the table reads path by path, as given
    return [{k: v for k, v in r.items() if k != "_order"} for r in rows]


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


def _row(rows: Sequence[dict[str, Any]], label: str, provider: str, size: int, batch: int) -> dict[str, Any] | None:
    return next(
        (r for r in rows if "error" not in r and path_label(r) == label and r["provider"] == provider
         and (r["size"], r["batch"]) == (size, batch)),
        None,
    )  # fmt: skip


def _paired_goal(slow: dict[str, Any], fast: dict[str, Any], goal: float) -> dict[str, Any]:
    """``slow`` / ``fast`` per paired round (both timed in the same rounds), with its spread."""
    ratio = paired_ratio(slow["times_ms"], fast["times_ms"])
    return {"speedup": ratio["median"], "spread": ratio, "goal": goal, "met": (ratio["median"] or 0) >= goal}


def speed_goals(
    rows: Sequence[dict[str, Any]], size: int = 512, batch: int = 1, default_path: str | None = None
) -> dict[str, dict[str, Any]]:
    """The speed goals at ``size`` px, ``batch``, on the CPU, each only when measured, as medians of
    paired rounds: ONNX Runtime fp32 vs torch eager fp32; the fastest path passing its gate vs torch
    bf16 + channels_last eager; ``default_path`` (what default options run) vs ONNX Runtime fp32."""
    goals: dict[str, dict[str, Any]] = {}
    eager = _row(rows, "eager", "cpu", size, batch)
    ort_cpu = _row(rows, "onnx", "CPUExecutionProvider", size, batch)
    if eager and ort_cpu:
        goals[f"ort_cpu_vs_eager_{size}_b{batch}"] = _paired_goal(eager, ort_cpu, 1.2)
    baseline = _row(rows, GOAL_BASELINE, "cpu", size, batch)
    best = fastest_passing(rows).get(f"cpu {size}px batch {batch}")
    if baseline and best:
        fast = next(r for r in rows if "error" not in r and r["passes_gate"] and path_label(r) == best["path"]
                    and r["provider"] == best["provider"] and (r["size"], r["batch"]) == (size, batch))  # fmt: skip
        goals[f"fastest_vs_torch_bf16_{size}_b{batch}"] = {
            "fastest": best["path"], "fastest_ms": best["median_ms_per_image"],
            "baseline": "torch bf16 autocast + channels_last eager (BN folded)",
            "baseline_ms": baseline["median_ms_per_image"], **_paired_goal(baseline, fast, GOAL_SPEEDUP),
        }  # fmt: skip
    default = next(
        (
            r
            for r in rows
            if "error" not in r and path_label(r) == default_path and (r["size"], r["batch"]) == (size, batch)
        ),
        None,
    )
    if default and ort_cpu:
        goals[f"default_vs_ort_fp32_{size}_b{batch}"] = {
            "default": default_path, "default_ms": default["median_ms_per_image"],
            "ort_fp32_ms": ort_cpu["median_ms_per_image"], **_paired_goal(ort_cpu, default, GOAL_DEFAULT_SPEEDUP),
        }  # fmt: skip
    return goals


def default_path(model: str | Path | None, provider: str = "cpu") -> str:
    """The path ``gantool inpaint`` runs with default options (backend and precision auto)."""
    runner = load_backend(model, provider)
    return runner.name if runner.precision == "fp32" else f"{runner.name}:{runner.precision}"


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
    if e2e_images and e2e_size < 4:
        raise InputError(f"--e2e-size must be at least 4 px, got {e2e_size} (or --e2e-images 0 to skip it)")
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
    result["measured_rows"] = sum("error" not in row for row in rows)  # 0: nothing could be measured
    if not result["measured_rows"]:
        return result  # the goals compare measured rows: none to compare (the CLI exits 1)
    result["fastest_passing"] = fastest_passing(rows)
    goals = result["goals"]
    result["cpu_peak"] = cpu_peak()
    result["default_path"] = default_path(model, goal_provider)
    goals.update(speed_goals(rows, default_path=result["default_path"]))
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

"""Parity of exported generators against eager PyTorch over a sweep of shapes and masks.

A backend is any callable ``(image, mask) -> inpainted`` on NCHW float32 numpy
arrays. :func:`parity_sweep` runs the reference and every backend on the same
inputs and reports, per backend and case: the max abs error on the whole image
and inside the hole, the PSNR after uint8 quantization (of the whole image and
of the hole alone), and whether known pixels are bitwise equal to the input.
fp32 backends pass within ``atol``; fp16 backends pass at ``min_psnr`` dB or
more; a backend with its own gate (``BackendSpec.min_psnr``: bf16, int8) passes
at that hole PSNR or more. Known pixels must always be exact.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gantool.core.config import ModelConfig
from gantool.core.constants import DEFAULT_FP32_ATOL, FP32_ERROR_MULTIPLE, PREFER_CHOICES
from gantool.core.errors import InputError, check_choice, first_line
from gantool.core.processing import to_uint8
from gantool.nn.masks import generate_mask
from gantool.runtime.providers import cuda_device_visible, open_session

Backend = Callable[[np.ndarray, np.ndarray], np.ndarray]
CASE_MASKS = ("box", "free", "empty", "full")


def fp32_tolerance(atol: float, expected: np.ndarray, exact: np.ndarray | None) -> float:
    """The fp32 tolerance of one case: ``atol``, or FP32_ERROR_MULTIPLE times how far the eager
    float32 reference ``expected`` lies from the float64 evaluation ``exact``, if that is larger."""
    if exact is None or not np.isfinite(exact).all():
        return atol
    own_error = float(np.abs(expected.astype(np.float64) - exact).max()) if exact.size else 0.0
    return max(atol, FP32_ERROR_MULTIPLE * own_error)


@dataclass(frozen=True)
class ParityCase:
    batch: int
    height: int
    width: int
    mask: str  # one of CASE_MASKS

    @property
    def label(self) -> str:
        return f"{self.batch}x3x{self.height}x{self.width} {self.mask}"


@dataclass(frozen=True)
class BackendSpec:
    name: str
    run: Backend
    precision: str = "fp32"  # "fp32": judged by atol; "fp16": judged by PSNR
    max_pixels: int | None = None  # skip cases with more N*H*W pixels (slow backends)
    min_psnr: float | None = None  # its own gate: hole PSNR (uint8) in dB (bf16, int8)


def default_cases(config: ModelConfig) -> list[ParityCase]:
    """Batch 1 and 3; square and non-square; the training size, others and tiny ones."""
    s = config.size
    return [
        ParityCase(1, s, s, "box"),
        ParityCase(3, s, s, "free"),
        ParityCase(1, s + 8, s - 4, "box"),
        ParityCase(3, s - 4, s + 8, "free"),
        ParityCase(1, s, s + 4, "empty"),
        ParityCase(3, s + 8, s - 4, "full"),
        ParityCase(1, 12, 20, "box"),
        ParityCase(2, 8, 16, "free"),
        ParityCase(1, 4, 4, "full"),
    ]


def case_inputs(case: ParityCase, local_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic random images and masks for one case (NCHW float32)."""
    rng = np.random.default_rng([seed, case.batch, case.height, case.width, CASE_MASKS.index(case.mask)])
    image = rng.random((case.batch, 3, case.height, case.width), dtype=np.float32)
    shape = (case.batch, 1, case.height, case.width)
    if case.mask == "empty":
        return image, np.zeros(shape, np.float32)
    if case.mask == "full":
        return image, np.ones(shape, np.float32)
    window = min(local_size, case.height, case.width)
    masks = [generate_mask(case.mask, rng, (case.height, case.width), window)[0] for _ in range(case.batch)]
    return image, np.stack(masks)[:, None].astype(np.float32)


def psnr_uint8(output: np.ndarray, reference: np.ndarray) -> float:
    """PSNR in dB between the uint8-quantized images; inf when they are identical."""
    if not np.isfinite(output).all():
        return 0.0
    diff = to_uint8(output).astype(np.float64) - to_uint8(reference).astype(np.float64)
    mse = float(np.mean(diff * diff))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def psnr_hole_uint8(output: np.ndarray, reference: np.ndarray, mask: np.ndarray) -> float:
    """PSNR in dB between the uint8-quantized images inside the hole only; inf without a hole."""
    hole = np.broadcast_to(mask > 0.5, output.shape)
    if not hole.any():
        return math.inf
    return psnr_uint8(output[hole], reference[hole])


def compare(output: np.ndarray, reference: np.ndarray, image: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """Error figures for one backend output against the reference output."""
    if output.shape != reference.shape or output.dtype != np.float32:
        return {"error": f"returned {output.dtype} {output.shape}, expected float32 {reference.shape}"}
    hole = np.broadcast_to(mask > 0.5, output.shape)
    diff = np.abs(output.astype(np.float64) - reference.astype(np.float64))
    finite = bool(np.isfinite(diff).all())
    # Bitwise, so -0.0 or a NaN in a known pixel counts as a change.
    known_out, known_in = output[~hole], image[~hole]
    return {
        "max_abs": float(diff.max()) if finite else math.inf,
        "max_abs_hole": (float(diff[hole].max()) if hole.any() else 0.0) if finite else math.inf,
        "psnr_uint8": psnr_uint8(output, reference),
        "psnr_hole_uint8": psnr_hole_uint8(output, reference, mask),
        "known_exact": bool(np.array_equal(known_out.view(np.uint32), known_in.view(np.uint32))),
    }


def _case_passes(result: dict[str, Any], spec: BackendSpec, atol: float, min_psnr: float) -> bool:
    precision = spec.precision
    if "error" in result or not result["known_exact"]:
        return False
    if spec.min_psnr is not None:
        return result["psnr_hole_uint8"] >= spec.min_psnr
    if precision == "fp32":
        return result["max_abs"] <= result.get("tolerance", atol)
    return result["psnr_uint8"] >= min_psnr


def parity_sweep(
    reference: Backend,
    backends: Sequence[BackendSpec],
    cases: Sequence[ParityCase],
    local_size: int,
    atol: float = DEFAULT_FP32_ATOL,
    min_psnr: float = 40.0,
    seed: int = 0,
    exact: Backend | None = None,
) -> dict[str, Any]:
    """Run every backend on every case and compare it with ``reference``.

    ``exact``: the reference's model in float64 (:func:`float64_backend`); with it each case's fp32
    tolerance is :func:`fp32_tolerance` (never below ``atol``), without it ``atol``.

    Returns a JSON-ready report (``inf`` PSNR is kept as a float here; see
    :func:`report_to_json`). A backend that raises fails that case with the
    error's first line; it never hides the other backends' results.
    """
    results: dict[str, list[dict[str, Any]]] = {spec.name: [] for spec in backends}
    seconds = dict.fromkeys(results, 0.0)
    tolerances = []
    for case in cases:
        image, mask = case_inputs(case, local_size, seed)
        expected = reference(image, mask)
        tolerance = fp32_tolerance(atol, expected, exact(image, mask) if exact is not None else None)
        tolerances.append(tolerance)
        for spec in backends:
            if spec.max_pixels is not None and case.batch * case.height * case.width > spec.max_pixels:
                continue
            start = time.perf_counter()
            try:
                row = compare(spec.run(image, mask), expected, image, mask)
            except Exception as e:  # report any backend failure as a failed case
                row = {"error": f"{type(e).__name__}: {first_line(e)}"}
            seconds[spec.name] += time.perf_counter() - start
            row = {"case": case.label, **row}
            if spec.precision == "fp32":
                row["tolerance"] = tolerance
            row["passed"] = _case_passes(row, spec, atol, min_psnr)
            results[spec.name].append(row)

    summary = {}
    for spec in backends:
        rows = results[spec.name]
        ok_rows = [r for r in rows if "error" not in r]
        summary[spec.name] = {
            "precision": spec.precision,
            "passed": all(r["passed"] for r in rows),
            "max_abs": max((r["max_abs"] for r in ok_rows), default=math.inf),
            "max_abs_hole": max((r["max_abs_hole"] for r in ok_rows), default=math.inf),
            "min_psnr_uint8": min((r["psnr_uint8"] for r in ok_rows), default=0.0),
            "min_psnr_hole_uint8": min((r["psnr_hole_uint8"] for r in ok_rows), default=0.0),
            "gate_psnr_hole": spec.min_psnr,
            "known_exact": all(r.get("known_exact", False) for r in rows),
            "errors": sorted({r["error"] for r in rows if "error" in r}),
            "seconds": round(seconds[spec.name], 3),  # informative only, never a gate
            "skipped_cases": len(cases) - len(rows),
            "cases": rows,
        }
    return {
        "passed": all(s["passed"] for s in summary.values()),
        "atol": atol,
        "fp32_tolerance_max": max(tolerances, default=atol),  # atol, or wider where the model amplifies rounding
        "min_psnr_fp16": min_psnr,
        "cases": [c.label for c in cases],
        "backends": summary,
    }


def mark_advisory(report: dict[str, Any], precisions: Sequence[str]) -> list[str]:
    """Let backends of ``precisions`` that missed only their own PSNR gate (every case ran and kept
    the known pixels exact) no longer fail the report: they are marked ``advisory`` and the report's
    ``passed`` is recomputed. Returns one note per such backend.

    The export checks bf16 wherever the CPU has it natively, but writes no bf16 file: a bf16 row
    below its gate says what ``--precision bf16`` would lose on this model, not that a file is bad
    (``--prefer bf16`` keeps it binding, since ``--precision auto`` would then run bf16)."""
    notes = []
    for name, backend in report["backends"].items():
        only_the_gate = backend.get("gate_psnr_hole") is not None and all(
            "error" not in r and r["known_exact"] for r in backend["cases"]
        )
        if backend["passed"] or backend["precision"] not in precisions or not only_the_gate:
            continue
        backend["advisory"] = True
        notes.append(
            f"{name} below its gate (hole PSNR {backend['min_psnr_hole_uint8']:.1f} dB < "
            f"{backend['gate_psnr_hole']:g} dB): --precision {backend['precision']} loses accuracy on this model; "
            "no exported file is affected"
        )
    report["passed"] = all(b["passed"] or b.get("advisory", False) for b in report["backends"].values())
    return notes


def failures(report: dict[str, Any]) -> list[str]:
    """One line per failed backend (advisory ones aside): what failed and where it was worst."""
    lines = []
    for name, backend in report["backends"].items():
        if backend["passed"] or backend.get("advisory", False):
            continue
        bad = [r for r in backend["cases"] if not r["passed"]]
        first = bad[0]
        if "error" in first:
            why = first["error"]
        elif not first["known_exact"]:
            why = "known pixels changed"
        elif backend.get("gate_psnr_hole") is not None:
            why = f"hole PSNR {first['psnr_hole_uint8']:.1f} dB < {backend['gate_psnr_hole']:g} dB"
        elif backend["precision"] == "fp32":
            tolerance = first.get("tolerance", report["atol"])
            widened = f" (atol {report['atol']:g} widened to {FP32_ERROR_MULTIPLE:g}x eager fp32's own error)"
            why = f"max abs error {first['max_abs']:.3g} > {tolerance:.3g}" + (
                widened if tolerance > report["atol"] else " (atol)"
            )
        else:
            why = f"PSNR {first['psnr_uint8']:.1f} dB < {report['min_psnr_fp16']:g} dB"
        lines.append(f"{name}: {why} ({first['case']}; {len(bad)} of {len(backend['cases'])} cases failed)")
    return lines


def summary_lines(report: dict[str, Any]) -> list[str]:
    """A small table: one row per backend with its worst figures over the sweep."""
    lines = [
        f"{'backend':<24} {'cases':>5} {'max abs':>9} {'in hole':>9} {'PSNR u8':>9} {'hole PSNR':>9}  known   result"
    ]
    for name, b in report["backends"].items():
        psnr = "inf" if math.isinf(b["min_psnr_uint8"]) else f"{b['min_psnr_uint8']:.1f}"
        hole_value = b.get("min_psnr_hole_uint8", math.inf)
        hole = "inf" if math.isinf(hole_value) else f"{hole_value:.1f}"
        cases = f"{len(b['cases'])}/{len(b['cases']) + b['skipped_cases']}"
        lines.append(
            f"{name:<24} {cases:>5} {b['max_abs']:>9.2e} {b['max_abs_hole']:>9.2e} {psnr:>9} {hole:>9}  "
            f"{'exact' if b['known_exact'] else 'CHANGED':<7} "
            f"{'ok' if b['passed'] else 'low' if b.get('advisory', False) else 'FAIL'}"
        )
    return lines


def report_to_json(value: Any) -> Any:
    """Replace inf (identical uint8 images, or failed runs) by strings JSON can hold."""
    if isinstance(value, dict):
        return {k: report_to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [report_to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


# ------------------------------------------------------------------------ backends


def torch_backend(module: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Backend:
    """A torch module (or an AOTInductor package: any tensor callable) as a numpy backend."""

    def run(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(image), torch.from_numpy(mask)).numpy()

    return run


def float64_backend(module: torch.nn.Module) -> Backend:
    """A float64 copy of ``module`` as a numpy backend (float64 output): the exact answer that
    :func:`fp32_tolerance` measures eager float32 against."""
    exact = copy.deepcopy(module).double()

    def run(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return exact(torch.from_numpy(image).double(), torch.from_numpy(mask).double()).numpy()

    return run


def onnxruntime_backend(session: Any) -> Backend:
    def run(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return session.run(["inpainted"], {"image": image, "mask": mask})[0]

    return run


def check_prefer(prefer: str, int8: bool, verify: bool) -> str:
    """Refuse a ``gantool export --prefer`` whose precision's gate will not run (its gate must pass
    for the preference to be written: ``--precision auto`` trusts it)."""
    from gantool.training.loop import cpu_has_native_bf16  # delayed: the training stack

    check_choice("--prefer", prefer, PREFER_CHOICES)
    if prefer == "fp32":
        return prefer
    if not verify:
        raise InputError(f"--prefer {prefer} needs the parity check that gates it: drop --no-verify")
    if prefer == "int8" and not int8:
        raise InputError("--prefer int8 needs --int8 (the int8 file and its quality gate)")
    if prefer == "bf16" and not cpu_has_native_bf16():
        raise InputError("--prefer bf16 needs its gate, which runs only on a CPU with native bf16; this CPU has none")
    return prefer


def openvino_specs(
    files: dict[str, Path], int8_min_psnr: float, bf16_min_psnr: float, notes: list[str]
) -> list[BackendSpec]:
    """OpenVINO's CPU plugin on the exported ONNX files, at every precision it runs here:
    fp32 (``f32`` hint, judged by atol), bf16 where the CPU has it (hole PSNR gate), and the
    int8 file (its gate). Appends to ``notes`` what was not checked and why."""
    from gantool.runtime import openvino  # delayed: imports openvino

    if "onnx" not in files:
        return []
    if not openvino.openvino_available():
        notes.append("openvino not checked: the openvino package is not installed")
        return []
    wanted: list[tuple[str, Path, str, float | None]] = [("openvino", files["onnx"], "fp32", None)]
    if openvino.bf16_native():
        wanted.append(("openvino-bf16", files["onnx"], "bf16", bf16_min_psnr))
    else:
        notes.append("openvino-bf16 not checked: this CPU has no native bf16 (AVX512-BF16/AMX)")
    if "onnx_int8" in files:
        wanted.append(("openvino-int8", files["onnx_int8"], "int8", int8_min_psnr))
    return [BackendSpec(name, openvino_backend(path, p), p, None, gate) for name, path, p, gate in wanted]


def openvino_backend(path: str | Path, precision: str = "fp32") -> Backend:
    """An exported ONNX file on OpenVINO's CPU plugin at ``precision`` (fp32, bf16 or int8)."""
    from gantool.runtime.openvino import compile_onnx, infer  # delayed: imports openvino

    compiled = compile_onnx(path, precision)
    request = compiled.create_infer_request()
    return lambda image, mask: infer(compiled, request, image, mask, precision)


def cuda_worth_trying() -> bool:
    """True when a CUDA device is plausibly there (no CUDA library is loaded to find out)."""
    return torch.cuda.is_available() or cuda_device_visible()


def onnx_session(path: str | Path, cuda: bool = False) -> Any:
    """An ORT session on the CPU, or with ``cuda`` on CUDA with TF32 off (else ProviderError)."""
    return open_session(path, "cuda" if cuda else "cpu", exact=True).session

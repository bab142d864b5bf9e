"""The parity sweep of an export's files, as written, against the eager generator."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from gantool.core.constants import DEFAULT_INT8_MIN_PSNR
from gantool.core.errors import ProviderError, first_line
from gantool.export.formats import HalfPrecisionGenerator, quiet_exporter
from gantool.export.parity import (
    Backend,
    BackendSpec,
    ParityCase,
    cuda_worth_trying,
    default_cases,
    onnx_session,
    onnxruntime_backend,
    openvino_specs,
    parity_sweep,
    torch_backend,
)
from gantool.nn.networks import CompletionNetwork
from gantool.runtime.torch_backends import strip_dtype_asserts

logger = logging.getLogger(__name__)

MIN_FP16_PSNR = 40.0
# bf16 autocast keeps about 3 significant digits: gate its hole PSNR like int8's default.
MIN_BF16_PSNR = 35.0


def _device_backend(module: nn.Module, cuda: bool) -> Backend:
    if not cuda:
        return torch_backend(module)

    def run(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(image).cuda(), torch.from_numpy(mask).cuda()).cpu().numpy()

    return run


def _bf16_backend(module: Any) -> Backend:
    """``module`` under bf16 autocast with channels_last inputs on the CPU (as --precision bf16 runs it)."""

    def run(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            to_cl = torch.channels_last
            return module(torch.from_numpy(image).to(memory_format=to_cl), torch.from_numpy(mask)).float().numpy()

    return run


# long: one flat list of the backends the sweep runs, one block per exported format; split, it would hide which formats are checked
def verify_exports(
    generator: CompletionNetwork,
    folded: nn.Module,
    files: dict[str, Path],
    atol: float,
    cuda: bool | None = None,
    cases: Sequence[ParityCase] | None = None,
    int8_min_psnr: float = DEFAULT_INT8_MIN_PSNR,
    aoti_device: str = "cpu",
    exact: Backend | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Parity sweep of the exported files (as written) against the eager generator.

    ``exact``: the generator in float64 (:func:`~gantool.export.parity.float64_backend`); with it
    each case's fp32 bound is ``atol`` or FP32_ERROR_MULTIPLE times eager fp32's own error against
    float64, whichever is larger (:func:`~gantool.export.parity.fp32_tolerance`); without, ``atol``.

    ``aoti_device``: what ``files["aoti"]`` was compiled for (a CUDA package is not run here).
    """
    from gantool.training.loop import cpu_has_native_bf16  # delayed: the training stack

    backends = [BackendSpec("eager-folded", torch_backend(folded))]
    notes: list[str] = []
    if "pt2" in files:
        with open(files["pt2"], "rb") as f:
            program = torch.export.load(f)
        backends.append(BackendSpec("pt2", torch_backend(program.module())))
    if "aoti" in files:
        if aoti_device == "cpu":
            from torch._inductor import aoti_load_package  # delayed: heavy import

            with open(files["aoti"], "rb") as f:  # a file object: the temp file's name does not end in .pt2
                package = aoti_load_package(f)
            backends.append(BackendSpec("aoti-cpu", torch_backend(package)))
        else:
            notes.append("aoti (compiled for cuda) checked on the GPU only by examples/gpu_check.sh")
    if cpu_has_native_bf16():
        # Module.to(memory_format=...) works at run time, but torch 2.13's stubs lack that overload
        # and later ones have it: through Any, mypy passes on both (an ignore would be unused on one).
        bf16_cl = cast(Any, copy.deepcopy(folded)).to(memory_format=torch.channels_last)
        backends.append(BackendSpec("eager-bf16", _bf16_backend(bf16_cl), "bf16", None, MIN_BF16_PSNR))
        if "pt2" in files:
            with open(files["pt2"], "rb") as f:
                module = strip_dtype_asserts(torch.export.load(f).module())
            backends.append(BackendSpec("pt2-bf16", _bf16_backend(module), "bf16", None, MIN_BF16_PSNR))
    else:
        notes.append("bf16 not checked: this CPU has no native bf16 (AVX512-BF16/AMX)")
    if "onnx_int8" in files:
        session = onnx_session(files["onnx_int8"])
        backends.append(BackendSpec("onnxruntime-cpu-int8", onnxruntime_backend(session), "int8", None, int8_min_psnr))
    backends += openvino_specs(files, int8_min_psnr, MIN_BF16_PSNR, notes)
    if "torchscript" in files:
        with quiet_exporter():  # torch.jit.load warns that TorchScript is deprecated
            scripted = torch.jit.load(str(files["torchscript"]))
        backends.append(BackendSpec("torchscript", torch_backend(scripted)))
    onnx_files = {name: files[name] for name in ("onnx", "onnx_fp16") if name in files}
    for name, path in onnx_files.items():
        suffix, precision = ("-fp16", "fp16") if name == "onnx_fp16" else ("", "fp32")
        backends.append(BackendSpec(f"onnxruntime-cpu{suffix}", onnxruntime_backend(onnx_session(path)), precision))
    if "onnx_fp16" in files:
        # torch's fp16 CPU convolutions are slow: on the CPU check the cases up to one training-size image.
        on_gpu = torch.cuda.is_available()
        half = HalfPrecisionGenerator(folded).eval().to("cuda" if on_gpu else "cpu")  # type: ignore[arg-type]
        max_pixels = None if on_gpu else generator.config.size**2
        backends.append(BackendSpec("eager-fp16", _device_backend(half, on_gpu), "fp16", max_pixels))
        notes.append(
            "ONNX Runtime's CPU provider lacks most fp16 kernels and runs the fp16 model's body in "
            "float32 (weights upcast), so onnxruntime-cpu-fp16 measures fp16 weight rounding only; "
            "eager-fp16 runs torch's fp16 kernels (on the CPU only over cases up to one training-size image); "
            "only onnxruntime-cuda-fp16 measures the exported fp16 model's GPU path."
        )
    want_cuda = cuda_worth_trying() if cuda is None else cuda
    if onnx_files and not want_cuda:
        why = "not requested (--no-cuda)" if cuda is False else "no CUDA device found"
        notes.append(f"onnxruntime-cuda not checked: {why}")
    elif onnx_files:
        for name, path in onnx_files.items():
            suffix, precision = ("-fp16", "fp16") if name == "onnx_fp16" else ("", "fp32")
            try:
                session = onnx_session(path, cuda=True)
            except Exception as e:  # a CUDA problem must never break the CPU result, unless asked for
                if cuda is True:  # --cuda: a check that was asked for and cannot run is a failure
                    raise ProviderError(f"--cuda: onnxruntime-cuda{suffix} cannot run: {first_line(e)}") from None
                notes.append(f"onnxruntime-cuda{suffix} not checked: {first_line(e)}")
                continue
            backends.append(BackendSpec(f"onnxruntime-cuda{suffix}", onnxruntime_backend(session), precision))
    cases = list(cases) if cases is not None else default_cases(generator.config)
    logger.info("parity check: %d cases x %d backends against eager PyTorch", len(cases), len(backends))
    reference = torch_backend(generator)
    report = parity_sweep(reference, backends, cases, generator.config.local_size, atol, MIN_FP16_PSNR, exact=exact)
    report["reference"] = "eager PyTorch, unfolded generator, eval mode, float32, CPU"
    report["notes"] = notes
    return report, notes

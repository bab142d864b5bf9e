"""What default options run: the runtime of an ONNX file on this machine, and the precision
``--precision auto`` picks from the model's ``gantool.prefer``.

:func:`gantool.runtime.backends.load_backend` asks these; ``gantool info`` shows their answer
(:func:`auto_choice`) without opening the model.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gantool.core.artifacts import ARTIFACT, META_PRECISION, META_PREFER, read_model_metadata, resolve_model
from gantool.core.constants import AUTO_OPENVINO_PRECISIONS, DEFAULT_PREFER, PRECISION_BACKENDS, PREFER_CHOICES
from gantool.core.errors import ModelError
from gantool.runtime import openvino
from gantool.runtime.providers import cuda_device_visible, torch_device

log = logging.getLogger("gantool.runtime.backends")  # one logger for what load_backend decides


def _gpu_likely(provider: str) -> bool:
    return provider in ("cuda", "tensorrt") or (provider == "auto" and cuda_device_visible())


def auto_openvino(provider: str, precision: str) -> bool:
    """Whether ``--backend auto`` runs an ONNX file at ``precision`` on OpenVINO rather than ONNX Runtime.

    At :data:`~gantool.core.constants.AUTO_OPENVINO_PRECISIONS` (int8, bf16: measured faster there)
    where :func:`openvino_can_run`; fp32 stays on ONNX Runtime, which OpenVINO was not measured to
    beat. ``precision="auto"``: the caller resolves it first (:func:`auto_runtime`). Its backend
    refuses non-finite weights and outputs as ONNX Runtime's does; ``--backend openvino`` runs it always.
    """
    return precision in AUTO_OPENVINO_PRECISIONS and openvino_can_run(provider, precision)


def auto_runtime(prefer: str, provider: str) -> str:
    """The runtime ``--backend auto --precision auto`` tries for an ONNX file whose publisher
    prefers ``prefer`` (:func:`model_prefer`): OpenVINO where it would run that precision
    (:func:`auto_openvino`), else ONNX Runtime."""
    return "openvino" if auto_openvino(provider, prefer) else "onnx"


def openvino_can_run(provider: str, precision: str) -> bool:
    """On the CPU, with openvino installed, at a precision it can run here."""
    if _gpu_likely(provider) or not openvino.openvino_available() or precision == "fp16":
        return False
    return precision != "bf16" or openvino.bf16_native()


def _file_metadata(path: Path) -> dict[str, str]:
    try:
        return read_model_metadata(path)
    except ModelError:  # a training checkpoint, or a file without gantool metadata: no preference
        return {}


def model_prefer(path: Path) -> str:
    """The model file's ``gantool.prefer`` (``fp32`` when it has none)."""
    return _file_metadata(path).get(META_PREFER, DEFAULT_PREFER)


def preferred_precision(path: Path, name: str, provider: str, prefer: str | None = None) -> tuple[str, str]:
    """What ``--precision auto`` runs for ``path`` on backend ``name``, and why.

    The model's ``gantool.prefer`` (written by ``gantool export --prefer`` only when that
    precision's gate passed; ``prefer`` when the caller has read it already) where this backend
    and machine run it; else "auto" (fp32, or fp16 ONNX on a GPU), with a warning line naming the
    reason (an info line for int8 on a GPU).
    """
    prefer = model_prefer(path) if prefer is None else prefer
    if prefer not in PREFER_CHOICES or prefer == "fp32":
        return "auto", "the model's default"
    why_not, level = "", logging.WARNING
    if name not in PRECISION_BACKENDS[prefer]:
        why_not = f"the {name} backend cannot run {prefer}"
    elif prefer == "int8":
        if _gpu_likely(provider):
            # On a GPU, fp32 (or fp16) is the fast path, not a fallback: an info line, not a warning.
            why_not, level = "int8 runs on the CPU only", logging.INFO
        elif not (
            path.name == ARTIFACT["onnx_int8"].filename or path.with_name(ARTIFACT["onnx_int8"].filename).is_file()
        ):
            why_not = f"no {ARTIFACT['onnx_int8'].filename} beside {path.name}"
    elif name == "openvino":
        why_not = "" if openvino.bf16_native() else "this CPU has no native bf16"
    else:
        from gantool.training.loop import amp_supported  # delayed: the training stack imports torch

        device, _ = torch_device(provider)
        why_not = "" if amp_supported(device) else f"bf16 is not native on {device}"
    if why_not:
        log.log(level, "the model prefers %s, but %s: running fp32", prefer, why_not)
        return "auto", f"the model prefers {prefer}, but {why_not}"
    return prefer, f"the model prefers {prefer} (gantool export --prefer {prefer}; its gate passed at export)"


def auto_choice(model: str | Path, provider: str = "auto") -> dict[str, str]:
    """What default options (backend and precision ``auto``) would run for ``model`` here, and why,
    without opening it (for ``gantool info``)."""
    path, name = resolve_model(model, "auto")
    meta = _file_metadata(path)  # read once: parsing an ONNX file's metadata loads its whole graph
    prefer = meta.get(META_PREFER, DEFAULT_PREFER)
    runs_on = auto_runtime(prefer, provider) if name == "onnx" else name
    precision, why = preferred_precision(path, runs_on, provider, prefer)
    if precision == "auto":
        fp16 = path.with_name(ARTIFACT["onnx_fp16"].filename)
        on_gpu_fp16 = runs_on == "onnx" and _gpu_likely(provider) and fp16.is_file()
        precision = "fp16" if on_gpu_fp16 else meta.get(META_PRECISION, "fp32")
    if runs_on == "openvino" and precision != "bf16" and not auto_openvino(provider, precision):
        runs_on = "onnx"
    return {"backend": runs_on, "precision": precision, "why": why}

"""Non-finite weights: export refuses them, every backend refuses them, ``gantool info`` warns.

A NaN or Inf weight (say, an Inf in a BatchNorm running mean after a diverged run) makes
holes filled with garbage, or NaN everywhere; better one line before the model runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.artifacts import KIND_ONNX, KIND_SAFETENSORS
from gantool.core.errors import ModelError


def non_finite_weights(state_dict: dict[str, Any]) -> str:
    """'' when every floating tensor (torch or numpy) is finite, else which hold NaN/Inf (one line)."""
    bad = []
    for name, tensor in state_dict.items():
        if hasattr(tensor, "is_floating_point"):  # a torch tensor (bf16 included)
            if not tensor.is_floating_point():
                continue
            array = tensor.detach().float().cpu().numpy()
        else:
            array = np.asarray(tensor)
            if not np.issubdtype(array.dtype, np.floating):
                continue
        finite = np.isfinite(array)
        if not finite.all():
            bad.append(f"{name}: {int(finite.size - finite.sum())} of {finite.size}")
    if not bad:
        return ""
    return "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more tensors" if len(bad) > 3 else "")


def onnx_initializers(path: Path) -> dict[str, np.ndarray]:
    """The weights (initializers and constant nodes' tensors) of an ONNX file."""
    import onnx  # delayed: heavy import
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                tensors[f"{node.name or node.op_type}.{attribute.name}"] = numpy_helper.to_array(attribute.t)
    return tensors


def file_non_finite_weights(path: Path, kind: str) -> str:
    """Non-finite weights in an ONNX or safetensors file ('' when none, or for other kinds)."""
    if kind == KIND_SAFETENSORS:
        import safetensors  # delayed: numpy framework, no torch needed

        with safetensors.safe_open(str(path), framework="numpy") as f:
            return non_finite_weights({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 (not a dict)
    if kind == KIND_ONNX:
        return non_finite_weights(onnx_initializers(path))
    return ""


def refuse_non_finite(path: Path, tensors: dict[str, Any]) -> None:
    """Raise a one-line ModelError when ``tensors`` (a model's weights) hold NaN or Inf."""
    bad = non_finite_weights(tensors)
    if bad:
        raise ModelError(
            f"{path} has non-finite weights ({bad}); it would fill holes with NaN/Inf, so it is not run "
            "(use an earlier checkpoint)"
        )

"""Which convolutions to leave in float when an int8 model misses its gate.

Each convolution's own quantization error, measured with ONNX Runtime's
``onnxruntime.quantization.qdq_loss_debug`` on the calibration images: the
signal-to-quantization-noise ratio (SQNR, dB) of its input activation before and
after its QuantizeLinear/DequantizeLinear pair, and of its int8 weights against the
float ones. The two noises add (as powers), giving one SQNR per convolution; the
lowest is the most sensitive. :func:`float_sets` then grows the set left in float
along that ranking (1, 2, 4, ... convolutions) up to a cap on the share of the
network's multiply-adds that would run in float: beyond it int8 buys little, and
the export refuses as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ConvInfo:
    name: str
    activation: str  # the tensor the convolution reads (its quantized input)
    weight: str  # its weight initializer
    output: str  # the tensor it writes
    macs: int  # multiply-adds per image at the size the shapes were inferred for


def conv_infos(path: Path, op_types: Sequence[str], size: int) -> list[ConvInfo]:
    """The convolutions of ``path`` in graph order, with their multiply-adds on one ``size`` x ``size`` image."""
    import onnx  # delayed: heavy import

    model = onnx.load(str(path))
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        for i, value in enumerate([1, None, size, size]):
            if value is not None and i < len(dims):
                dims[i].ClearField("dim_param")
                dims[i].dim_value = value
    del model.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int]] = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        shapes[value.name] = [d.dim_value for d in value.type.tensor_type.shape.dim]
    weights = {init.name: list(init.dims) for init in model.graph.initializer}
    infos = []
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        kernel = weights.get(node.input[1], [])
        out = shapes.get(node.output[0], [])
        # a Conv: cout x (cin x k x k) terms per output pixel; a ConvTranspose (weight in, out, k, k):
        # every input pixel meets every weight
        spatial = out if node.op_type == "Conv" else shapes.get(node.input[0], [])
        macs = math.prod(kernel) * spatial[2] * spatial[3] if len(spatial) == 4 and all(spatial) and kernel else 0
        infos.append(ConvInfo(node.name, node.input[0], node.input[1], node.output[0], macs))
    return infos


def conv_sqnr(
    float_path: Path,
    qdq_path: Path,
    convs: Sequence[ConvInfo],
    feeds: Sequence[dict[str, np.ndarray]],
    scratch: Path,
) -> dict[str, float]:
    """Each convolution's own int8 error on ``feeds``, as an SQNR in dB (lower: more sensitive).

    The int8 model's output of the convolution against the float model's has the noise of
    everything before it plus its own (its quantized input and weights); its input, before its
    own QuantizeLinear, has only the first. Relative noise powers subtract: what is left is the
    convolution's own share. (The SQNR of a convolution's quantized input or weights alone misses
    a weight tensor whose large taps set the int8 step so that its small ones round to zero.)
    """
    from onnxruntime.quantization import CalibrationDataReader  # delayed: heavy import
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        compute_signal_to_quantization_noice_ratio,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds: Iterator[dict[str, np.ndarray]] = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    collected = []
    for path in (qdq_path, float_path):
        augmented = scratch / f"{path.stem}_debug.onnx"
        modify_model_output_intermediate_tensors(str(path), str(augmented))
        collected.append(collect_activations(str(augmented), Reader()))
    qdq, reference = collected
    matched: dict[str, Any] = create_activation_matching(qdq, reference)

    def noise(tensor: str, ours: Any) -> float:
        if tensor not in reference or ours is None:
            return 0.0
        return 10 ** (-compute_signal_to_quantization_noice_ratio(reference[tensor], ours) / 10)

    result = {}
    for conv in convs:
        before = matched.get(conv.activation, {}).get("pre_qdq", qdq.get(conv.activation))
        own = noise(conv.output, qdq.get(conv.output)) - noise(conv.activation, before)
        result[conv.name] = -10 * math.log10(own) if own > 0 else math.inf
    return result


def float_sets(
    ranked: Sequence[ConvInfo], convs: Sequence[ConvInfo], max_float_fraction: float
) -> tuple[list[list[ConvInfo]], ConvInfo | None]:
    """The sets to try in float: the 1, 2, 4, ... first of ``ranked`` (the last set all of
    those within the cap), each within ``max_float_fraction`` of the multiply-adds of all
    ``convs``; and the first of ``ranked`` that did not fit (None when all fitted)."""
    total = sum(c.macs for c in convs) or 1
    fitting: list[ConvInfo] = []
    blocked: ConvInfo | None = None
    for conv in ranked:
        if (sum(c.macs for c in fitting) + conv.macs) / total > max_float_fraction:
            blocked = conv
            break
        fitting.append(conv)
    sets: list[list[ConvInfo]] = []
    n = 1
    while n < len(fitting):
        sets.append(fitting[:n])
        n *= 2
    if fitting:
        sets.append(fitting)
    return sets, blocked


def float_share(chosen: Sequence[ConvInfo], convs: Sequence[ConvInfo]) -> float:
    """The share of the multiply-adds of ``convs`` that ``chosen`` runs in float."""
    return sum(c.macs for c in chosen) / (sum(c.macs for c in convs) or 1)

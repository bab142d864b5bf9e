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
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Quantized only to be fused: ONNX Runtime's quantizer removes such an activation after a quantized
# convolution and gives the convolution's output the activation's range (for a ReLU zero point 0, so
# the QuantizeLinear clamps). Unfused, the convolution's output is rounded on a scale that spans its
# negative values too, which a BatchNorm after the ReLU (GLCIC-PyTorch's conv -> ReLU -> BN)
# magnifies on a channel that is rarely positive. Each comes with the clamping its QuantizeLinear
# then does: the export fuses these op types (gantool.export.quantize), and :func:`conv_sqnr`
# clamps the values before that QuantizeLinear (the activation's input) the same way.
FUSED_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"Relu": lambda x: np.maximum(x, 0)}


@dataclass(frozen=True)
class ConvInfo:
    name: str
    activation: str  # the tensor the convolution reads (its quantized input)
    weight: str  # its weight initializer
    output: str  # the tensor it writes
    macs: int  # multiply-adds per image at the size the shapes were inferred for
    channels_in: int
    channels_out: int
    op_type: str = "Conv"
    input_activation: str | None = None  # the fusable activation node (a Relu) that writes its input, if any


def conv_infos(path: Path, op_types: Sequence[str], size: int, activations: Collection[str] = ()) -> list[ConvInfo]:
    """The convolutions of ``path`` in graph order, with their multiply-adds on one ``size`` x ``size``
    image, and the node of ``activations`` (op types) that writes each one's input, if any."""
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
    writers = {out: node for node in model.graph.node for out in node.output}
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
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if node.op_type == "Conv":  # weight (out, in / group, k, k); ConvTranspose's (in, out / group, k, k)
            cin, cout = (kernel[1] * group, kernel[0]) if kernel else (0, 0)
        else:
            cin, cout = (kernel[0], kernel[1] * group) if kernel else (0, 0)
        writer = writers.get(node.input[0])
        activation = writer.name if writer is not None and writer.op_type in activations else None
        infos.append(
            ConvInfo(node.name, node.input[0], node.input[1], node.output[0], macs, cin, cout, node.op_type, activation)
        )
    return infos


def _channel_noise(reference: Sequence[np.ndarray], ours: Sequence[np.ndarray], channels: int, axis: int = 0) -> float:
    """The mean over channels of each channel's relative noise power (from the library's SQNR).

    A per-tensor figure would hide a small channel drowned by a large one that shares its int8
    step. A channel that is all zeros in ``reference`` has no signal to lose and is skipped."""
    from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

    def split(arrays: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(
            [np.moveaxis(a.reshape(-1) if axis < 0 else a, axis, 0).reshape(channels, -1) for a in arrays], 1
        )

    ref, got = split(reference), split(ours)
    powers = [
        10 ** (-compute_signal_to_quantization_noice_ratio(ref[c], got[c]) / 10)
        for c in range(channels)
        if np.any(ref[c])
    ]
    return float(np.mean(powers)) if powers else 0.0


def _weight_noise(weight: np.ndarray, dequantized: np.ndarray, input_power: np.ndarray, conv: ConvInfo) -> float:
    """The relative noise power int8 weights add to each output channel, averaged over channels.

    Each input channel's share is weighted by its mean square on the calibration images, so a
    large tap on an input channel that is always 0 counts as the nothing it adds in float, and
    the real taps it rounds to zero (it sets the channel's int8 step) count in full."""
    if conv.op_type == "ConvTranspose":  # (in, out, k, k) -> (out, in, k, k)
        weight, dequantized = weight.swapaxes(0, 1), dequantized.swapaxes(0, 1)
    if weight.shape[:2] != (conv.channels_out, conv.channels_in):
        return 0.0  # grouped convolutions: not measured here
    signal = np.einsum("oc,c->o", (weight**2).sum(axis=(2, 3)), input_power)
    noise = np.einsum("oc,c->o", ((weight - dequantized) ** 2).sum(axis=(2, 3)), input_power)
    kept = signal > 0
    return float(np.mean(noise[kept] / signal[kept])) if kept.any() else 0.0


def feed_reader(feeds: Sequence[dict[str, np.ndarray]]) -> Any:
    """``feeds`` as ONNX Runtime's CalibrationDataReader (one pass), for the quantizer and the debugger alike."""
    from onnxruntime.quantization import CalibrationDataReader  # delayed: heavy import

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds: Iterator[dict[str, np.ndarray]] = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    return Reader()


def conv_sqnr(
    float_path: Path,
    qdq_path: Path,
    convs: Sequence[ConvInfo],
    feeds: Sequence[dict[str, np.ndarray]],
    scratch: Path,
) -> dict[str, float]:
    """Each convolution's own int8 error on ``feeds``, as an SQNR in dB (lower: more sensitive).

    Measured where int8 rounds, on the int8 model (``onnxruntime.quantization.qdq_loss_debug``):
    the convolution's input and its output, each before and after its QuantizeLinear /
    DequantizeLinear pair (:func:`_channel_noise`), and its int8 weights against the float ones,
    weighted by the input they meet (:func:`_weight_noise`). Each is local (it does not carry the
    error of the layers before) and a mean of per-channel relative noise powers; the three add up."""
    import onnx  # delayed: heavy import
    from onnxruntime.quantization.qdq_loss_debug import (  # delayed: heavy import
        collect_activations,
        create_activation_matching,
        create_weight_matching,
        modify_model_output_intermediate_tensors,
    )

    augmented = scratch / "qdq_debug.onnx"
    modify_model_output_intermediate_tensors(str(qdq_path), str(augmented))
    matched: dict[str, Any] = create_activation_matching(collect_activations(str(augmented), feed_reader(feeds)))
    weights = create_weight_matching(str(float_path), str(qdq_path))
    # a convolution fused with its activation writes the activation's output tensor in the int8 model
    written = {node.name: node.output[0] for node in onnx.load(str(qdq_path)).graph.node}
    # there its QuantizeLinear also does the activation's clamping: the values before it are the
    # activation's input, so they are clamped here too, and only the rounding counts as error
    clamps = {
        out: FUSED_ACTIVATIONS[node.op_type]
        for node in onnx.load(str(float_path)).graph.node
        if node.op_type in FUSED_ACTIVATIONS
        for out in node.output
    }

    def clamped(tensor: str, values: Sequence[np.ndarray]) -> list[np.ndarray]:
        clamp = clamps.get(tensor)
        return [clamp(x) for x in values] if clamp is not None else list(values)

    def rounding(tensor: str, channels: int) -> float:
        pair = matched.get(tensor)
        if not pair:
            return 0.0
        return _channel_noise(clamped(tensor, pair["pre_qdq"]), pair["post_qdq"], channels)

    result = {}
    for conv in convs:
        output = written.get(conv.name, conv.output)
        own = rounding(conv.activation, conv.channels_in) + rounding(output, conv.channels_out)
        pair, seen = weights.get(conv.weight), matched.get(conv.activation)
        if pair is not None and seen is not None:
            inputs = clamped(conv.activation, seen["pre_qdq"])
            power = np.concatenate([x.reshape(conv.channels_in, -1) for x in inputs], 1)
            own += _weight_noise(pair["float"], pair["dequantized"], np.mean(power**2, axis=1), conv)
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

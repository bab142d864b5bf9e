"""The OpenVINO backend: the same ``generator.onnx`` / ``generator_int8.onnx`` on OpenVINO's CPU plugin.

No new file format: OpenVINO reads gantool's ONNX exports as they are (the QDQ
nodes of the int8 file run as int8). Precision maps to OpenVINO's
``INFERENCE_PRECISION_HINT``:

- ``fp32``: ``f32``, so the float model runs in float32 (the CPU plugin would
  otherwise pick bf16 by itself on CPUs with AVX512-BF16 or AMX);
- ``bf16``: ``bf16``, only where the CPU plugin reports native BF16
  (``OPTIMIZATION_CAPABILITIES``); refused elsewhere, where it would be emulated;
- ``int8``: ``generator_int8.onnx`` with ``f32`` for the parts left in float (its zero-padded
  average pools run as convolutions: :func:`pools_as_convolutions`).

The model is compiled once with its dynamic N, H and W (no recompile per request).
OpenVINO's CPU plugin prepares kernels for each new input shape on its first run
and keeps them in its runtime cache, so the first image of a new size pays about
one extra run (measured in ``docs/benchmarks.md``). One compiled model serves every
thread; each thread gets its own infer request.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.cpu import onednn_bf16_capped
from gantool.core.errors import ModelError, first_line
from gantool.runtime.threads import inference_threads

OV_DEVICE = "CPU"
# gantool precision -> OpenVINO's INFERENCE_PRECISION_HINT (int8 runs from the file's QDQ nodes).
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def pools_as_convolutions(model: Any) -> int:
    """Rewrite, in place, each AveragePool of ONNX ``model`` that counts its zero padding
    (``count_include_pad = 1``) as the depthwise convolution it equals (a box filter of
    ``1 / (kh * kw)``, the same strides and pads); returns how many were rewritten.

    OpenVINO's int8 pipeline (2026.4, checked) drops ``count_include_pad`` on such a pool once the
    model holds quantized nodes (whether the padding is the pool's own or a Pad before it): it
    divides by the unpadded pixels, so the push-pull fill's pyramid (a zero row and column before
    each halving) came out up to 0.75 off at its third level, 0.09 in the inpainted image. A
    convolution's zero padding has one reading; ONNX Runtime gives bitwise the same output."""
    import onnx  # delayed: heavy import
    from onnx import helper, numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model)
    channels = {
        value.name: value.type.tensor_type.shape.dim[1].dim_value
        for value in [*inferred.graph.input, *inferred.graph.value_info]
        if len(value.type.tensor_type.shape.dim) == 4
    }
    nodes, rewritten = [], 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = (
            attrs.get("count_include_pad", 0) == 1  # else the pool does not equal a convolution at the border
            and not attrs.get("ceil_mode", 0)
            and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
            and len(attrs.get("kernel_shape", [])) == 2
            and all(d == 1 for d in attrs.get("dilations", [1, 1]))
        )
        groups = channels.get(node.input[0], 0) if node.op_type == "AveragePool" and plain else 0
        if not groups:
            nodes.append(node)
            continue
        kh, kw = attrs["kernel_shape"]
        box = f"{node.name or node.output[0]}_box_filter"
        model.graph.initializer.append(
            numpy_helper.from_array(np.full((groups, 1, kh, kw), 1 / (kh * kw), np.float32), box)
        )
        nodes.append(
            helper.make_node(
                "Conv", [node.input[0], box], list(node.output), name=node.name, group=groups, kernel_shape=[kh, kw],
                strides=attrs.get("strides", [1, 1]), pads=attrs.get("pads", [0, 0, 0, 0]),
            )
        )  # fmt: skip
        rewritten += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return rewritten


def openvino_available() -> bool:
    """Whether the ``openvino`` package is installed (found without importing it)."""
    return importlib.util.find_spec("openvino") is not None


@functools.cache
def ov_core() -> Any:
    """The process's one ``openvino.Core`` (created on first use)."""
    import openvino  # delayed: heavy import

    return openvino.Core()


def openvino_version() -> str:
    import openvino  # delayed: heavy import

    return str(openvino.get_version())


def cpu_capabilities() -> list[str]:
    """What OpenVINO's CPU plugin can run natively here (e.g. FP32, BF16, INT8)."""
    return [str(c) for c in ov_core().get_property(OV_DEVICE, "OPTIMIZATION_CAPABILITIES")]


def bf16_native() -> bool:
    """Whether OpenVINO runs bf16 natively on this CPU (AVX512-BF16 or AMX) in this process: its
    capabilities still list BF16 when ``ONEDNN_MAX_CPU_ISA`` caps it below, where a bf16 compile fails."""
    return not onednn_bf16_capped() and "BF16" in cpu_capabilities()


def compile_config(precision: str) -> dict[str, str]:
    """The compile properties for ``precision`` (fp32, bf16 or int8)."""
    config = {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision], "PERFORMANCE_HINT": "LATENCY"}
    if (threads := inference_threads()) is not None:  # gantool serve --ray: replicas share the cores
        config["INFERENCE_NUM_THREADS"] = str(threads)
    return config


def read_onnx(path: str | Path, precision: str = "fp32") -> Any:
    """``path`` read as an OpenVINO model, refused (one line) unless it is a gantool generator.

    For int8, an int8 file written before gantool rewrote its padded pools is rewritten in memory
    (:func:`pools_as_convolutions`), so OpenVINO computes it right."""
    try:
        model = ov_core().read_model(str(path)) if precision != "int8" else _read_int8(path)
    except Exception as e:  # OpenVINO raises RuntimeError subclasses for corrupt or foreign files
        raise ModelError(f"OpenVINO cannot read {path}: {first_line(e)}") from None
    inputs = sorted(name for port in model.inputs for name in port.get_names())
    outputs = [name for port in model.outputs for name in port.get_names()]
    if not {"image", "mask"} <= set(inputs) or "inpainted" not in outputs:
        raise ModelError(
            f"{path} is not a gantool generator (inputs {inputs}, outputs {outputs}; expected image, mask -> inpainted)"
        )
    return model


def _read_int8(path: str | Path) -> Any:
    import onnx  # delayed: heavy import

    model = onnx.load(str(path))
    if not pools_as_convolutions(model):
        return ov_core().read_model(str(path))
    return ov_core().read_model(model.SerializeToString())


def compile_model(model: Any, path: str | Path, precision: str = "fp32") -> Any:
    """A model from :func:`read_onnx` (read from ``path``) compiled for the CPU plugin at ``precision``."""
    try:
        return ov_core().compile_model(model, OV_DEVICE, compile_config(precision))
    except Exception as e:
        raise ModelError(f"OpenVINO cannot compile {path}: {first_line(e)}") from None


def compile_onnx(path: str | Path, precision: str = "fp32") -> Any:
    """``path`` (a gantool ONNX generator) compiled for OpenVINO's CPU plugin at ``precision``.

    Its dynamic N, H and W stay dynamic: one compile serves every shape."""
    return compile_model(read_onnx(path, precision), path, precision)


def release_memory(compiled: Any) -> bool:
    """Free the intermediate buffers ``compiled`` keeps for reuse (``CompiledModel.release_memory``,
    OpenVINO 2024.5 and later); True when it did.

    The CPU plugin keeps the largest run's activations: after one 768 x 768 run of the shipped
    model the process stayed 177 MB larger, 26 MB after this (docs/serving.md). OpenVINO refuses
    while another thread's inference runs: then nothing is freed now (the next large run frees it)."""
    release = getattr(compiled, "release_memory", None)
    if release is None:
        return False
    try:
        release()
    except RuntimeError:
        return False
    return True


def infer(compiled: Any, request: Any, image: np.ndarray, mask: np.ndarray, precision: str) -> np.ndarray:
    """One run of ``compiled`` through ``request`` on NCHW float32 arrays."""
    result = request.infer({"image": image, "mask": mask})
    out = np.array(result[compiled.output("inpainted")], dtype=np.float32)  # a copy: the request reuses its buffer
    if precision == "bf16":
        # bf16 also rounds the graph's final composite; redo it in float32 so known pixels
        # pass through exactly (as in the graph: image * known + out * mask).
        out = image * (1.0 - mask) + out * mask
    return out

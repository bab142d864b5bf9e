"""Non-finite weights and outputs: export refuses them, every backend refuses them, ``gantool info`` warns.

A NaN or Inf weight (say, an Inf in a BatchNorm running mean after a diverged run) makes
holes filled with garbage, or NaN everywhere; better one line before the model runs.
This module decides both questions for every backend: :func:`refuse_non_finite` (the
weights, at load) and :func:`refuse_non_finite_output` (each run's output). The backends
only say where their weights are: a state dict, an ONNX file's initializers
(:func:`onnx_initializers`) or an AOTInductor package's constants (:func:`aoti_constants`).
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.artifacts import KIND_ONNX, KIND_SAFETENSORS, META_FILE_WEIGHTS_SHA256
from gantool.core.errors import ModelError, NonFiniteError, first_line
from gantool.core.finite import non_finite_count, non_finite_weights


def onnx_initializers(path: Path) -> dict[str, np.ndarray]:
    """The weights (initializers and constant nodes' tensors) of an ONNX file."""
    import onnx  # delayed: heavy import

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends for corrupt files
        raise ModelError(f"{path} is not a readable ONNX model ({first_line(e)})") from None
    return onnx_model_tensors(model)


def onnx_model_tensors(model: Any) -> dict[str, np.ndarray]:
    """The weights of an ONNX ModelProto: its initializers, then its nodes' tensor attributes
    (unnamed Constant nodes are numbered: one key per tensor, none hidden behind another)."""
    import onnx  # delayed: heavy import
    from onnx import numpy_helper

    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for index, node in enumerate(model.graph.node):
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                key = f"{node.name or node.op_type}.{attribute.name}"
                tensors[key if key not in tensors else f"{key}#{index}"] = numpy_helper.to_array(attribute.t)
    return tensors


@contextlib.contextmanager
def aoti_constants(path: Path, device: str) -> Iterator[dict[str, Any]]:
    """The constants (weights) an AOTInductor package carries, as torch tensors, while the block runs.

    ``gantool export --aoti`` compiles them into the package's library (``*.wrapper.so``);
    torch's container runner for that library hands them out (``extract_constants_map``).
    The package loader does not, so the library is opened once more from a temporary folder
    (milliseconds; the tensors live as long as that runner, hence a context manager).
    ``device``: what the package was compiled for ("cpu" or "cuda")."""
    import torch  # delayed: heavy import

    with zipfile.ZipFile(path) as archive, tempfile.TemporaryDirectory(prefix="gantool-aoti-") as tmp:
        libraries = [n for n in archive.namelist() if n.endswith(".so") and "/aotinductor/" in n]
        if len(libraries) != 1:
            raise ModelError(
                f"{path}: expected one compiled library in the AOTInductor package, found {len(libraries)}"
            )
        folder = libraries[0].rsplit("/", 1)[0] + "/"
        for name in archive.namelist():  # the library and what sits beside it (CUDA kernels)
            relative = name[len(folder) :]
            if name.startswith(folder) and relative and ".." not in Path(relative).parts and not name.endswith("/"):
                (Path(tmp) / relative).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / relative).write_bytes(archive.read(name))
        library = str(Path(tmp) / libraries[0][len(folder) :])
        try:  # torch's own runner API (private, and as tied to the torch version as the package is)
            if device == "cuda":
                runner: Any = torch._C._aoti.AOTIModelContainerRunnerCuda(library, 1, "cuda", tmp)
            else:
                runner = torch._C._aoti.AOTIModelContainerRunnerCpu(library, 1)
            constants = dict(runner.extract_constants_map(False))
        except Exception as e:  # AttributeError from another torch, RuntimeError from the runner
            raise ModelError(f"{path}: cannot read the AOTInductor package's weights ({first_line(e)})") from None
        try:
            yield constants
        finally:
            del constants, runner  # before its library's folder goes


def file_non_finite_weights(path: Path, kind: str) -> str:
    """Non-finite weights in an ONNX or safetensors file ('' when none, or for other kinds)."""
    if kind == KIND_SAFETENSORS:
        import safetensors  # delayed: numpy framework, no torch needed

        with safetensors.safe_open(str(path), framework="numpy") as f:
            return non_finite_weights({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 (not a dict)
    if kind == KIND_ONNX:
        return non_finite_weights(onnx_initializers(path))
    return ""


def refuse_non_finite(path: Path, tensors: Mapping[str, Any]) -> None:
    """Raise a one-line ModelError naming ``path`` and the first bad tensors when
    ``tensors`` (a model's weights) hold NaN or Inf."""
    bad = non_finite_weights(tensors)
    if bad:
        raise NonFiniteError(
            f"{path} has non-finite weights ({bad}); it would fill holes with NaN/Inf, so it is not run "
            "(use an earlier checkpoint)"
        )


def refuse_non_finite_output(output: np.ndarray, source: str) -> None:
    """Raise a one-line ModelError when a model's ``output`` holds NaN or Inf (``source``: which
    model on which backend), so holes are never written filled with garbage."""
    counted = non_finite_count(output)
    if counted and counted[0]:
        raise NonFiniteError(
            f"the model produced NaN/Inf: {counted[0]} of {counted[1]} output values are not finite ({source})"
        )


def file_weights_sha256(tensors: Mapping[str, Any]) -> str:
    """sha256 over a model file's own weights: each tensor's name, dtype, shape and bytes, by name.

    ``tensors``: torch tensors (any device and dtype, bf16 included) or numpy arrays, as the
    file's loader hands them out; other values (a program's script objects) are left out. The
    export records it in ``gantool.file_weights_sha256`` and every backend checks it at open."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name]
        if hasattr(tensor, "is_floating_point"):  # a torch tensor: its bytes without a dtype conversion
            import torch  # delayed: torch is loaded already if a tensor exists

            flat = tensor.detach().cpu().contiguous().reshape(-1)
            dtype, shape = str(tensor.dtype), tuple(tensor.shape)
            data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        elif isinstance(tensor, np.ndarray):
            dtype, shape, data = tensor.dtype.str, tensor.shape, np.ascontiguousarray(tensor).tobytes()
        else:
            continue
        digest.update(f"{name}\0{dtype}\0{shape}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def check_file_weights(path: Path, tensors: Mapping[str, Any], metadata: Mapping[str, str]) -> None:
    """Refuse a model file whose weights are not the ones its metadata records (files exported
    before the key existed record none and are not checked)."""
    recorded = metadata.get(META_FILE_WEIGHTS_SHA256)
    if recorded and file_weights_sha256(tensors) != recorded:
        raise ModelError(
            f"{path}: its weights do not match the hash it records ({META_FILE_WEIGHTS_SHA256}); "
            "the file was altered after export: re-export it"
        )

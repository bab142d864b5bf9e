"""The backends that run a generator in PyTorch (:mod:`gantool.runtime.backends` registers
them): a traced TorchScript file, the eager network from a checkpoint or safetensors, a
torch.export program and an AOTInductor package. Eager and ``.pt2`` also run under bf16
autocast with channels_last where the device has native bf16.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gantool import __version__
from gantool.core.artifacts import (
    KIND_AOTI,
    KIND_SAFETENSORS,
    META_AOTI_DEVICE,
    META_MODEL_CONFIG,
    META_PRECISION,
    META_SOURCE,
    META_TRAIN_PHASE,
    META_TRAIN_STEP,
    META_VERSION,
    PT2_METADATA_ENTRY,
    TORCHSCRIPT_METADATA_ENTRY,
    check_zip_archive,
    model_kind,
    read_model_metadata,
)
from gantool.core.constants import PRECISION_BACKENDS
from gantool.core.errors import InputError, ModelError, first_line
from gantool.runtime.backend import Backend
from gantool.runtime.providers import check_aoti_package, torch_device
from gantool.runtime.weights import aoti_constants


def bf16_refusal(device: Any) -> str:
    """Why bf16 cannot run on torch ``device`` ("" when it can)."""
    from gantool.training.loop import amp_supported  # delayed: the training stack imports torch

    if amp_supported(device):
        return ""
    if device.type == "cuda":
        return "this GPU does not support bf16"
    return "this CPU has no native bf16 (AVX512-BF16, AMX or Arm BF16); bf16 would be emulated and slow"


def strip_dtype_asserts(module: Any) -> Any:
    """Remove torch.export's dtype assertions from an unlifted program, so it runs under autocast.

    The exported graph asserts that intermediate tensors are float32; under bf16
    autocast the convolutions return bf16 (and the generator casts back itself).
    """
    import torch  # delayed: heavy import

    graph = module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default:
            graph.erase_node(node)
    module.recompile()
    return module


class _TorchBackend(Backend):
    bf16_capable = False  # eager and pt2 can run under bf16 autocast

    def __init__(
        self,
        path: Path,
        module: Any,
        device: Any,
        metadata: dict[str, str],
        note: str,
        precision: str = "auto",
        *,
        weights: Mapping[str, Any],
    ) -> None:
        super().__init__(path, metadata, str(device), note, weights=weights)
        self.device = device
        self.bf16 = precision == "bf16"
        if precision not in ("auto", "fp32", "bf16") or (self.bf16 and not self.bf16_capable):
            backends = " or ".join(PRECISION_BACKENDS.get(precision, ("onnx",)))
            raise InputError(f"precision {precision} needs the {backends} backend, not {self.name}")
        if self.bf16:
            import torch  # delayed: heavy import

            why = bf16_refusal(device)
            if why:
                raise InputError(f"precision bf16 refused on {device}: {why}")
            module = module.to(memory_format=torch.channels_last)
        self.module = module

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else self.metadata.get(META_PRECISION, "fp32")

    def _run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch  # delayed: heavy import

        image_t, mask_t = torch.from_numpy(image).to(self.device), torch.from_numpy(mask).to(self.device)
        autocast: contextlib.AbstractContextManager = contextlib.nullcontext()
        if self.bf16:
            image_t = image_t.contiguous(memory_format=torch.channels_last)
            autocast = torch.autocast(self.device.type, dtype=torch.bfloat16)
        with torch.inference_mode(), autocast:
            out = self.module(image_t, mask_t)
        return out.float().contiguous().cpu().numpy()


class TorchScriptBackend(_TorchBackend):
    """A traced generator (``generator.torchscript.pt``); metadata from its extra file."""

    name = "torchscript"

    def __init__(self, path: str | Path, provider: str = "auto", precision: str = "auto") -> None:
        import torch  # delayed: heavy import

        path = Path(path)
        if not path.is_file():
            raise ModelError(f"model not found: {path}")
        device, note = torch_device(provider)
        if precision not in ("auto", "fp32"):
            raise InputError(f"precision {precision} needs the {' or '.join(PRECISION_BACKENDS[precision])} backend")
        check_zip_archive(path)
        extra = {TORCHSCRIPT_METADATA_ENTRY: ""}
        try:
            with warnings.catch_warnings():  # local: TorchScript's deprecation notice is not the user's concern
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
        except Exception as e:  # RuntimeError / ValueError for non-TorchScript or corrupt files
            raise ModelError(f"{path} is not a readable TorchScript model ({first_line(e)})") from None
        metadata: dict[str, str] = {}
        if extra[TORCHSCRIPT_METADATA_ENTRY]:
            try:
                metadata = {str(k): str(v) for k, v in json.loads(extra[TORCHSCRIPT_METADATA_ENTRY]).items()}
            except (ValueError, AttributeError):
                raise ModelError(f"{path}: unreadable {TORCHSCRIPT_METADATA_ENTRY}") from None
        super().__init__(path, module.eval(), device, metadata, note, weights=module.state_dict())


class EagerBackend(_TorchBackend):
    """The PyTorch generator from a training checkpoint (.pt) or ``generator.safetensors``."""

    name = "eager"
    bf16_capable = True

    def __init__(self, path: str | Path, provider: str = "auto", precision: str = "auto") -> None:
        # delayed: checkpoint imports torch
        from gantool.training.checkpoint import generator_from_checkpoint, load_checkpoint, load_generator_weights

        path = Path(path)
        device, note = torch_device(provider)
        if model_kind(path) == KIND_SAFETENSORS:
            generator, metadata = load_generator_weights(path)
        else:
            state = load_checkpoint(path)
            generator = generator_from_checkpoint(state)
            metadata = {
                META_VERSION: str(state.get("gantool_version", __version__)),
                META_MODEL_CONFIG: json.dumps(generator.config.to_dict()),
                META_TRAIN_STEP: str(state["step"]),
                META_TRAIN_PHASE: str(state["phase"]),
                META_SOURCE: path.name,
            }
        metadata.setdefault(META_PRECISION, "fp32")
        if precision == "bf16":  # numerics change anyway: run the BN-folded network, as the exports do
            from gantool.nn.networks import fold_batchnorm  # delayed: imports torch

            module: Any = fold_batchnorm(generator)
        else:
            module = generator
        weights = generator.state_dict()  # the trained weights, BatchNorm's statistics included, before folding
        super().__init__(path, module.to(device).eval(), device, metadata, note, precision, weights=weights)


class Pt2Backend(_TorchBackend):
    """A torch.export program (``generator.pt2``); metadata from its extra file."""

    name = "pt2"
    bf16_capable = True

    def __init__(self, path: str | Path, provider: str = "auto", precision: str = "auto") -> None:
        import torch  # delayed: heavy import

        path = Path(path)
        if not path.is_file():
            raise ModelError(f"model not found: {path}")
        device, note = torch_device(provider)
        check_zip_archive(path)
        extra = {PT2_METADATA_ENTRY: ""}
        try:
            with open(path, "rb") as f:
                program = torch.export.load(f, extra_files=extra)
            metadata = {str(k): str(v) for k, v in json.loads(extra[PT2_METADATA_ENTRY] or "{}").items()}
        except Exception as e:  # corrupt archives raise RuntimeError, KeyError, JSON errors, ...
            raise ModelError(f"{path} is not a readable torch.export (.pt2) model ({first_line(e)})") from None
        weights = {**program.state_dict, **program.constants}
        module = program.module().to(device)
        if precision == "bf16":
            module = strip_dtype_asserts(module)
        super().__init__(path, module, device, metadata, note, precision, weights=weights)


class AotiBackend(_TorchBackend):
    """An AOTInductor package (``generator.aoti.pt2``), refused unless this machine is
    the device and torch version it was compiled for."""

    name = "aoti"

    def __init__(self, path: str | Path, provider: str = "auto", precision: str = "auto") -> None:
        import torch  # delayed: heavy import

        path = Path(path)
        if not path.is_file():
            raise ModelError(f"model not found: {path}")
        if model_kind(path) != KIND_AOTI:
            raise ModelError(f"{path} is not an AOTInductor package")
        metadata = read_model_metadata(path)
        built_for = metadata.get(META_AOTI_DEVICE, "")
        if provider == "auto" and built_for == "cpu":
            device, note = torch.device("cpu"), "the package was compiled for the CPU"
        else:
            device, note = torch_device(provider)
        check_aoti_package(path, metadata, device)
        # torch.utils.cpp_extension logs "No CUDA runtime is found" on CPU-only machines: not the user's concern.
        cpp_logger = logging.getLogger("torch.utils.cpp_extension")
        level = cpp_logger.level
        cpp_logger.setLevel(logging.ERROR)
        try:
            from torch._inductor import aoti_load_package  # delayed: heavy import

            with open(path, "rb") as f:  # a file object: any file name loads (the loader wants *.pt2 otherwise)
                module = aoti_load_package(f)
        except Exception as e:  # a package that passed the checks but still does not load
            raise ModelError(f"{path}: AOTInductor package does not load ({first_line(e)})") from None
        finally:
            cpp_logger.setLevel(level)
        with aoti_constants(path, device.type) as weights:  # compiled into the package's library
            super().__init__(path, module, device, metadata, note, precision, weights=weights)

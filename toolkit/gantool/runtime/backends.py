"""Inference backends: one signature, ``run(image, mask) -> inpainted``.

A backend runs an exported (or trained) generator on NCHW float32 numpy arrays
whose H and W are multiples of ``size_multiple``:

- :class:`OnnxBackend`: ONNX Runtime (``generator.onnx``, ``_fp16``, ``_int8``), CUDA / TensorRT / CPU;
- :class:`Pt2Backend`: the torch.export program ``generator.pt2``;
- :class:`AotiBackend`: the AOTInductor package ``generator.aoti.pt2`` (only on the device and
  torch version it was compiled for);
- :class:`TorchScriptBackend`: ``generator.torchscript.pt`` (legacy: TorchScript is deprecated upstream);
- :class:`EagerBackend`: the PyTorch network from a checkpoint or ``generator.safetensors``.

``precision="bf16"`` runs the eager and pt2 backends under bf16 autocast with
channels_last (on CUDA, or on CPUs with native bf16); ``int8`` and ``fp16`` pick
the exported ONNX files. ``auto`` never changes numerics beyond today's fp16 ONNX on a GPU.

They are registered by name in :data:`BACKEND_CLASSES`; :func:`load_backend`
finds the model file (:func:`gantool.core.artifacts.resolve_model`) and opens it.
Each exposes ``provider`` (what really runs), ``provider_note`` (why),
``size_multiple``, ``train_size``, ``config``, ``metadata`` and ``precision``.
Where a model runs is decided in :mod:`gantool.runtime.providers`; pre/post-processing
lives in :mod:`gantool.core.processing` and the strategies in :mod:`gantool.inference.inpainter`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gantool import __version__
from gantool.core.artifacts import (
    ARTIFACT,
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
    check_export_folder,
    check_zip_archive,
    config_from_metadata,
    model_kind,
    read_model_metadata,
    resolve_model,
)
from gantool.core.config import ModelConfig
from gantool.core.constants import BACKEND_CHOICES, PRECISION_BACKENDS, PRECISIONS, PROVIDERS
from gantool.core.errors import InputError, ModelError, NonFiniteError, ProviderError, check_choice, first_line
from gantool.runtime import openvino
from gantool.runtime.choice import auto_openvino, auto_runtime, model_prefer, preferred_precision
from gantool.runtime.memory import trim_heap
from gantool.runtime.model_uri import local_model
from gantool.runtime.providers import (
    OpenedSession,
    check_aoti_package,
    check_provider,
    cuda_device_visible,
    open_session,
    run_releasing_arena,
    torch_device,
)
from gantool.runtime.weights import (
    aoti_constants,
    check_file_weights,
    onnx_initializers,
    refuse_non_finite,
    refuse_non_finite_output,
)

log = logging.getLogger(__name__)


class Backend:
    """What every backend has; subclasses implement :meth:`_run`.

    Every backend hands its weights to this constructor (``weights``: name -> tensor or
    array, whatever its file holds), which refuses non-finite ones and ones that are not
    what the file's ``gantool.file_weights_sha256`` records, and every run's
    output passes :func:`gantool.runtime.weights.refuse_non_finite_output`: one rule,
    one message, whatever runs the model.
    """

    name = "backend"
    precision_note = "as requested"  # why this precision runs (set by load_backend for --precision auto)

    def __init__(
        self, path: Path, metadata: dict[str, str], provider: str, provider_note: str, *, weights: Mapping[str, Any]
    ) -> None:
        refuse_non_finite(path, weights)  # first: a NaN file gets the NaN message, whatever it records
        check_file_weights(path, weights, metadata)
        self.path = path
        self.metadata = metadata
        self.config: ModelConfig = config_from_metadata(metadata, path)
        self.provider = provider
        self.provider_note = provider_note

    @property
    def size_multiple(self) -> int:
        return self.config.stride

    @property
    def train_size(self) -> int:
        return self.config.size

    @property
    def precision(self) -> str:
        return self.metadata.get(META_PRECISION, "fp32")

    def run(self, image: np.ndarray, mask: np.ndarray, release_memory_pixels: int = 0) -> np.ndarray:
        """Inpaint NCHW float32 ``image`` (N x 3 x H x W) with ``mask`` (N x 1 x H x W, 1 = hole).

        H and W must be multiples of :attr:`size_multiple` (pad with
        :func:`gantool.core.processing.pad_to_multiple`). Returns N x 3 x H x W float32.
        A run over at least ``release_memory_pixels`` pixels (N x H x W) gives the memory it
        needed back to the system (:meth:`_run_releasing`, then glibc's heap trimmed); 0: never
        (the CLI; the server passes its ``--release-memory-pixels``).
        """
        image, mask = self._check_inputs(image, mask)
        n, _, height, width = image.shape
        release = 0 < release_memory_pixels <= n * height * width
        try:
            out = self._run_releasing(image, mask) if release else self._run(image, mask)
        except MemoryError:
            raise ModelError(f"out of memory running {image.shape[0]}x{image.shape[2]}x{image.shape[3]}") from None
        except Exception as e:  # backend libraries raise their own types; report one line
            raise ModelError(f"{self.name} backend failed: {first_line(e)}") from None
        out = np.asarray(out, dtype=np.float32)
        refuse_non_finite_output(out, f"{self.path.name}, {self.name} on {self.provider}")
        if release:
            trim_heap()
        return out

    def _check_inputs(self, image: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if image.ndim != 4 or image.shape[1] != 3:
            raise InputError(f"image must be N x 3 x H x W, got shape {image.shape}")
        n, _, height, width = image.shape
        if mask.shape != (n, 1, height, width):
            raise InputError(f"mask must be {n} x 1 x {height} x {width}, got shape {mask.shape}")
        m = self.size_multiple
        if height % m or width % m or height == 0 or width == 0:
            raise InputError(f"H and W must be positive multiples of {m}, got {height} x {width} (pad first)")
        return (
            np.ascontiguousarray(image, dtype=np.float32),
            np.ascontiguousarray(mask, dtype=np.float32),
        )

    def _run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _run_releasing(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """:meth:`_run`, then free what the runtime keeps for reuse (where it can be asked to)."""
        return self._run(image, mask)

    def describe(self) -> str:
        return f"{self.name} on {self.provider}"


class OnnxBackend(Backend):
    """ONNX Runtime. On CUDA/TensorRT: IO binding, a warm-up run, and the fp16
    model (``generator_fp16.onnx`` beside ``generator.onnx``) when one exists."""

    name = "onnx"

    def __init__(self, path: str | Path, provider: str = "auto", precision: str = "auto") -> None:
        path = Path(path)
        check_choice("precision", precision, PRECISIONS)
        if precision == "bf16":
            raise InputError(f"precision bf16 needs the {' or '.join(PRECISION_BACKENDS['bf16'])} backend, not onnx")
        if not path.is_file():
            raise ModelError(f"model not found: {path}")
        # precision "auto" takes the fp16 file on a GPU only; if CUDA does not load after all,
        # the CPU runs the fp32 file.
        gpu_likely = provider in ("cuda", "tensorrt") or (provider == "auto" and cuda_device_visible())
        model_file = self._pick_file(path, precision, gpu=gpu_likely)
        opened = open_session(model_file, provider)
        if model_file != path:  # a sibling file: it must come from the same export
            check_export_folder(path.parent)
        cpu_file = self._pick_file(path, precision, gpu=False)
        if not opened.on_gpu and cpu_file != model_file:
            model_file, opened = (
                cpu_file,
                OpenedSession(open_session(cpu_file, "cpu").session, opened.provider, opened.note),
            )
        self.session = opened.session
        metadata = dict(self.session.get_modelmeta().custom_metadata_map)
        super().__init__(model_file, metadata, opened.provider, opened.note, weights=onnx_initializers(model_file))
        self._check_signature()
        inputs = {i.name: i.type for i in self.session.get_inputs()}
        self._input_dtype = np.float16 if inputs.get("image") == "tensor(float16)" else np.float32
        self.on_gpu = opened.on_gpu
        if self.on_gpu:
            self._warm_up()

    @staticmethod
    def _pick_file(path: Path, precision: str, gpu: bool) -> Path:
        fp32_name, fp16_name = ARTIFACT["onnx"].filename, ARTIFACT["onnx_fp16"].filename
        fp16 = path.with_name(fp16_name)
        if precision in ("fp16", "int8"):
            wanted = ARTIFACT[f"onnx_{precision}"].filename
            if path.name == wanted:
                return path
            beside = path.with_name(wanted)
            if not beside.is_file():
                raise ModelError(f"no {precision} model beside {path} (expected {wanted}; export with --{precision})")
            return beside
        if precision == "auto" and gpu and path.name == fp32_name and fp16.is_file():
            return fp16
        return path

    def _check_signature(self) -> None:
        inputs = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        if sorted(inputs) != ["image", "mask"] or "inpainted" not in outputs:
            raise ModelError(
                f"{self.path} is not a gantool generator (inputs {inputs}, outputs {outputs}; "
                "expected image, mask -> inpainted)"
            )

    def _warm_up(self) -> None:
        """One run at the training size so the first real image does not pay for initialisation."""
        side = max(self.size_multiple, self.train_size - self.train_size % self.size_multiple)
        image = np.zeros((1, 3, side, side), np.float32)
        mask = np.zeros((1, 1, side, side), np.float32)
        mask[..., side // 4 : side // 2, side // 4 : side // 2] = 1.0
        self.run(image, mask)

    def _run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        dtype = self._input_dtype
        feeds = {"image": image.astype(dtype, copy=False), "mask": mask.astype(dtype, copy=False)}
        if not self.on_gpu:
            return self.session.run(["inpainted"], feeds)[0].astype(np.float32, copy=False)
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        binding.bind_output("inpainted", "cuda")  # stays on the device until the one copy back
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0].astype(np.float32, copy=False)

    def _run_releasing(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        # On CUDA the device arena is shrunk too, and the output is copied straight into host
        # memory numpy owns (no device region stays in use). Not measured: no GPU here.
        dtype = self._input_dtype
        feeds = {"image": image.astype(dtype, copy=False), "mask": mask.astype(dtype, copy=False)}
        shape = (image.shape[0], 3, *image.shape[2:])
        out = run_releasing_arena(self.session, feeds, "inpainted", shape, on_gpu=self.on_gpu)
        return out.astype(np.float32, copy=False)


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


class OpenVinoBackend(Backend):
    """OpenVINO's CPU plugin on an exported ONNX generator (see :mod:`gantool.runtime.openvino`)."""

    name = "openvino"

    def __init__(self, path: str | Path, provider: str = "auto", precision: str = "auto") -> None:
        path = Path(path)
        check_choice("precision", precision, PRECISIONS)
        check_provider(provider)
        if provider in ("cuda", "tensorrt"):
            raise ProviderError(f"the openvino backend runs on the CPU; for {provider} use --backend onnx")
        if "openvino" not in PRECISION_BACKENDS.get(precision, ("openvino",)):
            raise InputError(
                f"precision {precision} needs the {' or '.join(PRECISION_BACKENDS[precision])} backend, not openvino"
            )
        if not openvino.openvino_available():
            raise ProviderError("the openvino backend needs the openvino package (pip install openvino)")
        if not path.is_file():
            raise ModelError(f"model not found: {path}")
        self._precision = "fp32" if precision == "auto" else precision
        if self._precision == "bf16" and not openvino.bf16_native():
            raise InputError(
                "precision bf16 refused on the openvino backend: this CPU has no native bf16 "
                "(AVX512-BF16 or AMX); bf16 would be emulated and slow"
            )
        model_file = OnnxBackend._pick_file(path, self._precision, gpu=False)
        if model_file != path:  # a sibling file: it must come from the same export
            check_export_folder(path.parent)
        try:
            metadata = read_model_metadata(model_file)
        except ModelError as e:
            if "carries no gantool metadata" not in str(e):
                raise
            metadata = {}  # Backend warns and assumes the default config
        hint = openvino.PRECISION_HINTS[self._precision]
        note = f"OpenVINO {openvino.openvino_version()} CPU plugin, INFERENCE_PRECISION_HINT={hint}"
        model = openvino.read_onnx(model_file, self._precision)
        # Its weights are the ONNX file's, checked as ONNX Runtime's are, before the (slower) compile.
        super().__init__(model_file, metadata, "CPU", note, weights=onnx_initializers(model_file))
        self.compiled = openvino.compile_model(model, model_file, self._precision)
        self._local = threading.local()  # one infer request per thread, one compiled model for all

    @property
    def precision(self) -> str:
        return self._precision if self._precision != "fp32" else self.metadata.get(META_PRECISION, "fp32")

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return request

    def _run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return openvino.infer(self.compiled, self._request(), image, mask, self._precision)

    def _run_releasing(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        out = self._run(image, mask)
        # The compiled model's buffers go back (release_memory), and this thread's infer request
        # with its own tensors is dropped (the next run makes a new one): 177 -> 17 MB kept
        # after a 768 x 768 run of the shipped model, against 26 MB with release_memory alone.
        openvino.release_memory(self.compiled)
        self._local.request = None
        return out

    def describe(self) -> str:
        return f"openvino on CPU ({openvino.PRECISION_HINTS[self._precision]})"


# The backends by name (gantool.core.constants.BACKENDS lists the same names, in "auto" order).
BACKEND_CLASSES: dict[str, Callable[..., Backend]] = {
    "onnx": OnnxBackend,
    "openvino": OpenVinoBackend,
    "pt2": Pt2Backend,
    "torchscript": TorchScriptBackend,
    "eager": EagerBackend,
    "aoti": AotiBackend,
}


def load_backend(
    model: str | Path | None = None, provider: str = "auto", backend: str = "auto", precision: str = "auto"
) -> Backend:
    """Open ``model`` (file, export or run folder, or None for the shipped one) with ``backend`` on ``provider``.

    ``backend="auto"`` runs ONNX files on OpenVINO on the CPU at int8 and bf16 (:func:`auto_openvino`),
    falling back to ONNX Runtime if OpenVINO cannot open it, and on ONNX Runtime at fp32;
    ``precision="auto"`` follows the model's preference (:func:`preferred_precision`). The returned
    backend's ``precision_note`` says why it runs what it runs.
    """
    check_choice("provider", provider, PROVIDERS)
    check_choice("backend", backend, BACKEND_CHOICES)
    check_choice("precision", precision, PRECISIONS)
    model = local_model(model)  # models:/NAME/VERSION, models:/NAME@alias, runs:/ID/PATH: the cached export
    allowed = PRECISION_BACKENDS.get(precision)
    if allowed and backend == "auto" and (model is None or Path(model).is_dir()):
        # A folder: the first backend (in auto order) that runs this precision and has a file.
        # OpenVINO reads the ONNX files; it is a candidate only where `auto` would run it.
        candidates = [c for c in allowed if c != "openvino" or auto_openvino(provider, precision)]
        for candidate in candidates:
            try:
                path, name = resolve_model(model, candidate, precision if precision in ("fp16", "int8") else "fp32")
                break
            except ModelError:
                continue
        else:
            fallback = precision if precision in ("fp16", "int8") else "fp32"
            path, name = resolve_model(model, candidates[0], fallback)  # raises: names the missing file
    else:
        path, name = resolve_model(model, backend)
    picked = backend == "auto" and name in ("onnx", "openvino")  # auto chooses the runtime of an ONNX file
    if precision == "auto":
        prefer = model_prefer(path)  # read once, for the runtime and the precision
        runs_on = auto_runtime(prefer, provider) if picked else name
        precision, precision_note = preferred_precision(path, runs_on, provider, prefer)
    else:
        precision_note = "as requested"
    if picked:
        name = "openvino" if auto_openvino(provider, precision) else "onnx"
    if allowed is None:
        allowed = PRECISION_BACKENDS.get(precision)
    if allowed and name not in allowed:
        files = {p: f"an exported {ARTIFACT[f'onnx_{p}'].filename}" for p in ("fp16", "int8")}
        what = files.get(precision, "torch autocast")
        raise InputError(f"precision {precision} needs the {' or '.join(allowed)} backend ({what}), not {name}")
    try:
        opened = BACKEND_CLASSES[name](path, provider, precision)
    except (ModelError, ProviderError) as e:
        if not (picked and name == "openvino") or isinstance(e, NonFiniteError):  # NaN weights: no runtime helps
            raise
        log.warning("OpenVINO could not open %s (%s); running it on ONNX Runtime", path.name, first_line(e))
        opened = OnnxBackend(path, provider, precision)
    opened.precision_note = precision_note
    return opened

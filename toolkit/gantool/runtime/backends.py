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

Their base, :class:`Backend`, is in :mod:`gantool.runtime.backend`; the ones that run PyTorch
are in :mod:`gantool.runtime.torch_backends`; ONNX Runtime's and OpenVINO's are here. All are
registered by name in :data:`BACKEND_CLASSES`; :func:`load_backend`
finds the model file (:func:`gantool.core.artifacts.resolve_model`) and opens it.
Each exposes ``provider`` (what really runs), ``provider_note`` (why),
``size_multiple``, ``train_size``, ``config``, ``metadata`` and ``precision``.
Where a model runs is decided in :mod:`gantool.runtime.providers`; pre/post-processing
lives in :mod:`gantool.core.processing` and the strategies in :mod:`gantool.inference.inpainter`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.artifacts import (
    ARTIFACT,
    META_PRECISION,
    check_export_folder,
    read_model_metadata,
    resolve_model,
)
from gantool.core.constants import BACKEND_CHOICES, PRECISION_BACKENDS, PRECISIONS, PROVIDERS
from gantool.core.errors import InputError, ModelError, NonFiniteError, ProviderError, check_choice, first_line
from gantool.runtime import openvino
from gantool.runtime.backend import Backend
from gantool.runtime.choice import auto_openvino, auto_runtime, model_prefer, preferred_precision
from gantool.runtime.model_uri import local_model
from gantool.runtime.providers import (
    OpenedSession,
    check_provider,
    cuda_device_visible,
    open_session,
    run_releasing_arena,
)
from gantool.runtime.torch_backends import AotiBackend, EagerBackend, Pt2Backend, TorchScriptBackend
from gantool.runtime.weights import onnx_initializers

# The public surface stays here: every backend, importable from one module.
__all__ = [
    "BACKEND_CLASSES",
    "AotiBackend",
    "Backend",
    "EagerBackend",
    "OnnxBackend",
    "OpenVinoBackend",
    "Pt2Backend",
    "TorchScriptBackend",
    "load_backend",
]

log = logging.getLogger(__name__)


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

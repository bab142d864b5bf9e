"""Inference backends and :class:`Inpainter`, the Python API of ``gantool inpaint``.

Three backends run an exported (or trained) generator with one signature,
``run(image, mask) -> inpainted`` on NCHW float32 numpy arrays whose H and W are
multiples of ``size_multiple``:

- :class:`OnnxBackend`: ONNX Runtime (``generator.onnx``), CUDA / TensorRT / CPU;
- :class:`TorchScriptBackend`: ``generator.torchscript.pt``;
- :class:`EagerBackend`: the PyTorch network from a checkpoint or ``generator.safetensors``.

Each exposes ``provider`` (what really runs: the ONNX Runtime provider from
``session.get_providers()`` or the torch device), ``size_multiple``,
``train_size``, ``config`` and ``metadata``. Pre/post-processing is not here:
it lives once in :mod:`gantool.processing` and the strategies in
:mod:`gantool.inference`.

Provider policy: ``auto`` uses CUDA when a GPU is plausibly present and CUDA
really loads, else the CPU, and says why (``provider_note``). An explicit
``cuda`` or ``tensorrt`` that does not load is a :class:`ProviderError` naming
the cause; never a silent fallback.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gantool.config import NETWORK_STRIDE, ModelConfig
from gantool.constants import DEFAULT_BLEND
from gantool.errors import InputError, ModelError, ProviderError
from gantool.processing import check_blend

log = logging.getLogger(__name__)

PROVIDERS = ("auto", "cuda", "tensorrt", "cpu")
BACKENDS = ("onnx", "torchscript", "eager")
PRECISIONS = ("auto", "fp32", "fp16")

# File names inside an export folder (written by ``gantool export``), by backend.
MODEL_FILES = {
    "onnx": "generator.onnx",
    "torchscript": "generator.torchscript.pt",
    "eager": "generator.safetensors",
}
FP16_ONNX_FILE = "generator_fp16.onnx"
TORCHSCRIPT_METADATA_FILE = "gantool_metadata.json"

# Where the shipped model lives: models/ at the repository root (next to
# toolkit/), or packaged inside gantool/models/.
DEFAULT_MODEL_DIRS = (
    Path(__file__).resolve().parents[2] / "models",
    Path(__file__).resolve().parent / "models",
)
NO_MODEL_HELP = (
    "no model given and none shipped in models/: train one with `gantool train --out runs/<run> ...`, "
    "export it with `gantool export runs/<run>/checkpoints/last.pt`, then pass --model runs/<run>/export"
)

ORT_PROVIDER = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
# Shapes change from image to image: EXHAUSTIVE (the default) would re-search
# convolution algorithms for every new shape.
CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC"}


# ----------------------------------------------------------------------------- models


def default_model_dir() -> Path | None:
    """The folder of the model shipped with gantool, or None while there is none."""
    for folder in DEFAULT_MODEL_DIRS:
        if any((folder / name).is_file() for name in MODEL_FILES.values()):
            return folder
    return None


def is_torchscript_file(path: Path) -> bool:
    """TorchScript archives carry compiled code; ``torch.save`` checkpoints do not."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/code/" in name or name.endswith("constants.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def backend_for_file(path: Path) -> str:
    """The backend that runs a model file, judged by its name and content."""
    name = path.name.lower()
    if name.endswith(".onnx"):
        return "onnx"
    if name.endswith(".safetensors"):
        return "eager"
    if name.endswith(".pt") or name.endswith(".pth"):
        return "torchscript" if is_torchscript_file(path) else "eager"
    raise ModelError(f"{path}: unknown model type (expected .onnx, .pt or .safetensors)")


def _folder_candidates(folder: Path, backend: str) -> list[Path]:
    names = [folder / MODEL_FILES[backend], folder / "export" / MODEL_FILES[backend]]
    if backend == "eager":  # a run folder: the latest training checkpoint
        names.append(folder / "checkpoints" / "last.pt")
    return names


def resolve_model(model: str | Path | None, backend: str = "auto") -> tuple[Path, str]:
    """Find the model file for ``backend`` and the backend to use.

    ``model`` may be a model file, an export folder (``generator.onnx``,
    ``generator.torchscript.pt``, ``generator.safetensors``), a run folder, or
    None for the shipped model. ``backend="auto"`` picks from the file (onnx
    first for a folder).
    """
    if backend not in ("auto", *BACKENDS):
        raise InputError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    if model is None:
        folder = default_model_dir()
        if folder is None:
            raise ModelError(NO_MODEL_HELP)
        path = folder
    else:
        path = Path(model).expanduser()
        if not path.exists():
            raise ModelError(f"model not found: {path}")
    if path.is_dir():
        wanted = BACKENDS if backend == "auto" else (backend,)
        for name in wanted:
            for candidate in _folder_candidates(path, name):
                if candidate.is_file():
                    return candidate, name
        expected = " or ".join(MODEL_FILES[name] for name in wanted)
        raise ModelError(f"no model in {path}: expected {expected} (from `gantool export`)")
    detected = backend_for_file(path)
    if backend == "auto" or backend == detected:
        return path, detected
    if backend == "eager" and detected == "torchscript":
        raise ModelError(f"{path} is a TorchScript model: use --backend torchscript")
    raise ModelError(f"{path} is not a model for the {backend} backend (it is one for {detected})")


def _config_from_metadata(metadata: dict[str, str], source: Path) -> ModelConfig:
    text = metadata.get("gantool.model_config")
    if text is None:
        log.warning("%s has no gantool metadata; assuming stride %d and default sizes", source, NETWORK_STRIDE)
        return ModelConfig()
    try:
        return ModelConfig.from_dict(json.loads(text))
    except (ValueError, TypeError) as e:
        raise ModelError(f"{source}: unreadable gantool.model_config metadata ({e})") from None


# -------------------------------------------------------------------------- providers


def cuda_device_visible() -> bool:
    """A cheap guess whether an NVIDIA GPU exists, without loading any CUDA library."""
    dev = Path("/dev")
    if dev.is_dir() and (any(dev.glob("nvidia[0-9]*")) or (dev / "dxg").exists()):
        return True
    if shutil.which("nvidia-smi"):
        return True
    torch = sys.modules.get("torch")  # only if already imported: torch is slow to import
    if torch is not None:
        with contextlib.suppress(Exception):
            return bool(torch.cuda.is_available())
    return False


class _Captured:
    text = ""


@contextlib.contextmanager
def captured_native_output() -> Iterator[_Captured]:
    """Capture what ONNX Runtime writes while GPU providers load.

    ``preload_dlls()`` prints its failures to stdout and the C++ runtime logs
    provider load failures to the process's stderr (fd 2). Both are collected so
    the user sees one line naming the cause, not a screen of noise.
    """
    captured = _Captured()
    stdout = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        saved_fd: int | None = os.dup(2)
    except OSError:
        saved_fd = None
    sink = tempfile.TemporaryFile()
    try:
        if saved_fd is not None:
            os.dup2(sink.fileno(), 2)
        with contextlib.redirect_stdout(stdout):
            yield captured
    finally:
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
        sink.seek(0)
        native = sink.read().decode("utf-8", errors="replace")
        sink.close()
        captured.text = stdout.getvalue() + native
        if captured.text.strip():
            log.debug("ONNX Runtime output while loading providers:\n%s", captured.text.rstrip())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CAUSE_PATTERNS = (
    re.compile(r"with error: (.+)"),  # dlopen of the provider library failed
    re.compile(r"(CUDA failure \d+: .+?)(?: ; GPU=| ;|$)"),  # driver / device errors
    re.compile(r"(TensorRT[^\n]*(?:not found|cannot|failed|error)[^\n]*)", re.IGNORECASE),
    re.compile(r"Failed to load (\S+: .+)"),  # preload_dlls
)


def failure_cause(captured_text: str, provider: str) -> str:
    """One short sentence naming why ``provider`` ("cuda"/"tensorrt") did not load."""
    text = _ANSI.sub("", captured_text)
    cause = ""
    for pattern in _CAUSE_PATTERNS:
        match = pattern.search(text)
        if match:
            cause = match.group(1).strip()
            break
    if not cause:
        cause = f"ONNX Runtime did not enable {ORT_PROVIDER[provider]} (run with -v for its log)"
    if len(cause) > 200:
        cause = cause[:197] + "..."
    if not cuda_device_visible():
        cause += "; no NVIDIA GPU is visible (no /dev/nvidia*, no nvidia-smi)"
    return cause


def _torch_device(provider: str) -> tuple[Any, str]:
    """Map a provider name to a torch device (and a note saying why)."""
    import torch

    if provider == "tensorrt":
        raise ProviderError("provider 'tensorrt' needs the onnx backend (--backend onnx)")
    if provider == "cpu":
        return torch.device("cpu"), "as requested"
    if torch.cuda.is_available():
        return torch.device("cuda"), "CUDA device found"
    if provider == "cuda":
        why = (
            f"torch {torch.__version__} is a CPU-only build"
            if torch.version.cuda is None
            else "torch finds no CUDA device"
        )
        raise ProviderError(f"provider 'cuda' is not available: {why}")
    return torch.device("cpu"), "no CUDA device found; running on the CPU"


# --------------------------------------------------------------------------- backends


class Backend:
    """What every backend has; subclasses implement :meth:`_run`."""

    name = "backend"

    def __init__(self, path: Path, metadata: dict[str, str], provider: str, provider_note: str) -> None:
        self.path = path
        self.metadata = metadata
        self.config = _config_from_metadata(metadata, path)
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
        return self.metadata.get("gantool.precision", "fp32")

    def run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Inpaint NCHW float32 ``image`` (N x 3 x H x W) with ``mask`` (N x 1 x H x W, 1 = hole).

        H and W must be multiples of :attr:`size_multiple` (pad with
        :func:`gantool.processing.pad_to_multiple`). Returns N x 3 x H x W float32.
        """
        image, mask = self._check_inputs(image, mask)
        try:
            out = self._run(image, mask)
        except MemoryError:
            raise ModelError(f"out of memory running {image.shape[0]}x{image.shape[2]}x{image.shape[3]}") from None
        except Exception as e:  # backend libraries raise their own types; report one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelError(f"{self.name} backend failed: {first[:200]}") from None
        return np.asarray(out, dtype=np.float32)

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

    def describe(self) -> str:
        return f"{self.name} on {self.provider}"


class OnnxBackend(Backend):
    """ONNX Runtime. On CUDA/TensorRT: IO binding, a warm-up run, and the fp16
    model (``generator_fp16.onnx`` beside ``generator.onnx``) when one exists."""

    name = "onnx"

    def __init__(self, path: str | Path, provider: str = "auto", precision: str = "auto") -> None:
        path = Path(path)
        if provider not in PROVIDERS:
            raise InputError(f"unknown provider {provider!r} (choose from {', '.join(PROVIDERS)})")
        if precision not in PRECISIONS:
            raise InputError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        if not path.is_file():
            raise ModelError(f"model not found: {path}")
        import onnxruntime as ort

        self._ort = ort
        session, model_file, note = self._open(path, provider, precision)
        self.session = session
        metadata = dict(session.get_modelmeta().custom_metadata_map)
        # model_file is the file that really runs (generator.onnx or generator_fp16.onnx).
        super().__init__(model_file, metadata, session.get_providers()[0], note)
        self._check_signature()
        inputs = {i.name: i.type for i in session.get_inputs()}
        self._input_dtype = np.float16 if inputs.get("image") == "tensor(float16)" else np.float32
        self.on_gpu = self.provider in (ORT_PROVIDER["cuda"], ORT_PROVIDER["tensorrt"])
        if self.on_gpu:
            self._warm_up()

    def _open(self, path: Path, provider: str, precision: str) -> tuple[Any, Path, str]:
        if provider == "cpu":
            return (*self._cpu_session(path, precision), "as requested")
        if provider == "auto" and not cuda_device_visible():
            return (*self._cpu_session(path, precision), "no CUDA device found; running on the CPU")
        wanted = "tensorrt" if provider == "tensorrt" else "cuda"
        if ORT_PROVIDER[wanted] not in self._ort.get_available_providers():
            cause = f"this onnxruntime build has no {ORT_PROVIDER[wanted]} (install onnxruntime-gpu)"
            return self._gpu_failed(path, provider, precision, wanted, cause)
        providers: list[Any] = [(ORT_PROVIDER["cuda"], dict(CUDA_OPTIONS)), ORT_PROVIDER["cpu"]]
        if wanted == "tensorrt":  # CUDA stays in the list as TensorRT's own fallback for unsupported nodes
            providers.insert(0, (ORT_PROVIDER["tensorrt"], {}))
        model_file = self._pick_file(path, precision, gpu=True)
        with captured_native_output() as captured:
            with contextlib.suppress(Exception):  # a failed preload shows up as a missing provider below
                self._ort.preload_dlls()
            session = self._session(model_file, providers)
        if session.get_providers()[0] == ORT_PROVIDER[wanted]:
            return session, model_file, "CUDA device found" if wanted == "cuda" else "TensorRT loaded"
        return self._gpu_failed(path, provider, precision, wanted, failure_cause(captured.text, wanted))

    def _cpu_session(self, path: Path, precision: str) -> tuple[Any, Path]:
        model_file = self._pick_file(path, precision, gpu=False)
        return self._session(model_file, [ORT_PROVIDER["cpu"]]), model_file

    def _gpu_failed(
        self, path: Path, provider: str, precision: str, wanted: str, cause: str
    ) -> tuple[Any, Path, str]:
        if provider != "auto":
            raise ProviderError(f"provider '{wanted}' could not be loaded: {cause}")
        log.warning("CUDA did not load (%s); running on the CPU", cause)
        return (*self._cpu_session(path, precision), f"CUDA did not load ({cause}); running on the CPU")

    @staticmethod
    def _pick_file(path: Path, precision: str, gpu: bool) -> Path:
        fp16 = path.with_name(FP16_ONNX_FILE)
        if precision == "fp16":
            if path.name == FP16_ONNX_FILE:
                return path
            if not fp16.is_file():
                raise ModelError(f"no fp16 model beside {path} (expected {fp16.name}; export with fp16)")
            return fp16
        if precision == "auto" and gpu and path.name == MODEL_FILES["onnx"] and fp16.is_file():
            return fp16
        return path

    def _session(self, path: Path, providers: list[Any]) -> Any:
        ort = self._ort
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only; provider problems are reported by us
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as e:  # InvalidProtobuf, Fail, NoSuchFile, ...: corrupt or unsupported model
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelError(f"cannot load ONNX model {path}: {first[:200]}") from None
        return session

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


class _TorchBackend(Backend):
    def __init__(self, path: Path, module: Any, device: Any, metadata: dict[str, str], note: str) -> None:
        super().__init__(path, metadata, str(device), note)
        self.module = module
        self.device = device

    def _run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.module(
                torch.from_numpy(image).to(self.device),
                torch.from_numpy(mask).to(self.device),
            )
        return out.float().cpu().numpy()


class TorchScriptBackend(_TorchBackend):
    """A traced generator (``generator.torchscript.pt``); metadata from its extra file."""

    name = "torchscript"

    def __init__(self, path: str | Path, provider: str = "auto") -> None:
        import torch

        path = Path(path)
        if not path.is_file():
            raise ModelError(f"model not found: {path}")
        device, note = _torch_device(provider)
        extra = {TORCHSCRIPT_METADATA_FILE: ""}
        try:
            with warnings.catch_warnings():  # local: TorchScript's deprecation notice is not the user's concern
                warnings.simplefilter("ignore", DeprecationWarning)
                module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
        except Exception as e:  # RuntimeError / ValueError for non-TorchScript or corrupt files
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelError(f"{path} is not a readable TorchScript model ({first[:160]})") from None
        metadata: dict[str, str] = {}
        if extra[TORCHSCRIPT_METADATA_FILE]:
            try:
                metadata = {str(k): str(v) for k, v in json.loads(extra[TORCHSCRIPT_METADATA_FILE]).items()}
            except (ValueError, AttributeError):
                raise ModelError(f"{path}: unreadable {TORCHSCRIPT_METADATA_FILE}") from None
        super().__init__(path, module.eval(), device, metadata, note)


class EagerBackend(_TorchBackend):
    """The PyTorch generator from a training checkpoint (.pt) or ``generator.safetensors``."""

    name = "eager"

    def __init__(self, path: str | Path, provider: str = "auto") -> None:
        from gantool import __version__
        from gantool.checkpoint import generator_from_checkpoint, load_checkpoint, load_generator_weights

        path = Path(path)
        device, note = _torch_device(provider)
        if path.suffix == ".safetensors":
            generator, metadata = load_generator_weights(path)
        else:
            state = load_checkpoint(path)
            generator = generator_from_checkpoint(state)
            metadata = {
                "gantool.version": str(state.get("gantool_version", __version__)),
                "gantool.model_config": json.dumps(generator.config.to_dict()),
                "gantool.train_step": str(state["step"]),
                "gantool.train_phase": str(state["phase"]),
                "gantool.source": path.name,
            }
        metadata.setdefault("gantool.precision", "fp32")
        super().__init__(path, generator.to(device).eval(), device, metadata, note)


def load_backend(
    model: str | Path | None = None, provider: str = "auto", backend: str = "auto", precision: str = "auto"
) -> Backend:
    """Open ``model`` (file, export folder or None for the shipped one) with ``backend`` on ``provider``."""
    if provider not in PROVIDERS:
        raise InputError(f"unknown provider {provider!r} (choose from {', '.join(PROVIDERS)})")
    path, backend = resolve_model(model, backend)
    if backend == "onnx":
        return OnnxBackend(path, provider, precision)
    if precision == "fp16":
        raise InputError("precision fp16 needs the onnx backend (an exported generator_fp16.onnx)")
    if backend == "torchscript":
        return TorchScriptBackend(path, provider)
    return EagerBackend(path, provider)


# -------------------------------------------------------------------------- Inpainter


class Inpainter:
    """Inpaint images with a gantool generator.

    >>> inpainter = Inpainter("runs/<run>/export", provider="auto", backend="onnx")
    >>> result = inpainter.inpaint("photo.jpg", "mask.png")   # PIL image, same size
    >>> inpainter.provider                                     # what really runs

    ``strategy`` is the default for :meth:`inpaint`: ``auto`` (``crop`` for
    images larger than ``AUTO_CROP_FACTOR`` x the training size, else ``full``),
    ``full``, ``crop`` or ``resize`` (see :mod:`gantool.inference`). ``blend`` is
    the post-processing of the model's output: ``poisson`` (GLCIC's fast-marching
    fill + Poisson blending, :func:`gantool.processing.poisson_blend`) or ``none``.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        provider: str = "auto",
        backend: str = "onnx",
        *,
        strategy: str = "auto",
        batch_size: int = 4,
        crop_margin: int | None = None,
        precision: str = "auto",
        blend: str = DEFAULT_BLEND,
    ) -> None:
        from gantool.inference import STRATEGIES

        if strategy not in STRATEGIES:
            raise InputError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
        if batch_size < 1:
            raise InputError("batch size must be at least 1")
        self.blend = check_blend(blend)
        self.backend = load_backend(model, provider, backend, precision)
        self.strategy = strategy
        self.batch_size = batch_size
        self.crop_margin = crop_margin

    @property
    def provider(self) -> str:
        """The provider (ONNX Runtime) or torch device that really runs."""
        return self.backend.provider

    @property
    def provider_note(self) -> str:
        return self.backend.provider_note

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def metadata(self) -> dict[str, str]:
        return self.backend.metadata

    @property
    def config(self) -> ModelConfig:
        return self.backend.config

    def run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """NCHW float32 in, NCHW float32 out, any H and W (reflect-padded and cropped back)."""
        from gantool.processing import crop_padding, pad_to_multiple

        if image.ndim != 4 or mask.ndim != 4:
            raise InputError("run() takes N x 3 x H x W images and N x 1 x H x W masks")
        padded_image, padded_mask, pad = pad_to_multiple(
            np.asarray(image, np.float32), (np.asarray(mask) > 0.5).astype(np.float32), self.backend.size_multiple
        )
        return np.ascontiguousarray(crop_padding(self.backend.run(padded_image, padded_mask), pad))

    def inpaint(
        self,
        image: Image.Image | str | Path | np.ndarray,
        mask: Image.Image | str | Path | np.ndarray | None = None,
        strategy: str | None = None,
        blend: str | None = None,
    ) -> Image.Image:
        """Fill the holes of ``image`` and return a PIL image of the same size.

        ``image``: a PIL image, a path, or an H x W x 3 (or H x W) uint8/uint16 array.
        ``mask``: a PIL image, path or array; > 127 (8-bit) or 1 (0/1 arrays) = hole;
        None uses the image's alpha channel (transparent = hole). Only hole pixels
        change; the result is RGB, L or 16-bit (I;16) like the input's family.
        ``strategy`` and ``blend`` override the inpainter's defaults for this call.
        """
        from gantool.inference import inpaint_images, load_mask, to_pil_image

        pil_image = to_pil_image(image, "image")
        mask_array = load_mask(mask, pil_image)
        return inpaint_images(
            self.backend,
            [(pil_image, mask_array)],
            strategy=strategy or self.strategy,
            batch_size=self.batch_size,
            crop_margin=self.crop_margin,
            blend=blend or self.blend,
        )[0]

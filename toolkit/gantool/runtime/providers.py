"""Where a model runs: the one place that opens an ONNX Runtime session or picks a torch device.

ONNX Runtime lists the providers it was *built* with
(``get_available_providers()``), but whether one *loads* is only known from
``session.get_providers()`` after creating a session: when CUDA libraries are
missing it falls back to the CPU silently. :func:`open_session` therefore
creates the session, reads what really runs and, when CUDA or TensorRT did not
load, says why in one line (:func:`failure_cause`).

Policy, for sessions and torch devices alike: ``auto`` uses CUDA when a GPU is
plausibly present and CUDA really loads, else the CPU, and says why (the
``note``). An explicit ``cuda`` or ``tensorrt`` that does not load is a
:class:`~gantool.core.errors.ProviderError` naming the cause; never a silent fallback.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gantool.core.artifacts import META_AOTI_CPU_FLAGS, META_AOTI_CUDA_ARCH, META_AOTI_DEVICE, META_TORCH_VERSION
from gantool.core.constants import PROVIDERS
from gantool.core.errors import ModelError, ProviderError, check_choice, first_line
from gantool.runtime.threads import inference_threads

log = logging.getLogger(__name__)

ORT_PROVIDER = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
GPU_PROVIDERS = (ORT_PROVIDER["cuda"], ORT_PROVIDER["tensorrt"])
# Shapes change from image to image: EXHAUSTIVE (the default) would re-search
# convolution algorithms for every new shape.
CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC"}
# Parity measures fp32 numerics: TF32 off.
CUDA_EXACT_OPTIONS = {**CUDA_OPTIONS, "use_tf32": "0"}


# ----------------------------------------------------------------------------- is there a GPU


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


# ----------------------------------------------------------------------------- provider noise


class CapturedOutput:
    text = ""


@contextlib.contextmanager
def captured_native_output() -> Iterator[CapturedOutput]:
    """Capture what ONNX Runtime writes while GPU providers load.

    ``preload_dlls()`` prints its failures to stdout and the C++ runtime logs
    provider load failures to the process's stderr (fd 2). Both are collected so
    the user sees one line naming the cause, not a screen of noise.
    """
    captured = CapturedOutput()
    stdout = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        saved_fd: int | None = os.dup(2)
    except OSError:
        saved_fd = None
    with tempfile.TemporaryFile() as sink:
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
    """One sentence naming why ``provider`` ("cuda"/"tensorrt") did not load."""
    text = _ANSI.sub("", captured_text)
    cause = ""
    for pattern in _CAUSE_PATTERNS:
        match = pattern.search(text)
        if match:
            cause = match.group(1).strip()
            break
    if not cause:
        cause = f"ONNX Runtime did not enable {ORT_PROVIDER[provider]} (run with -v for its log)"
    if not cuda_device_visible():
        cause += "; no NVIDIA GPU is visible (no /dev/nvidia*, no nvidia-smi)"
    return cause


# ----------------------------------------------------------------------------- ONNX Runtime sessions


@dataclass
class OpenedSession:
    session: Any  # onnxruntime.InferenceSession
    provider: str  # what really runs: session.get_providers()[0]
    note: str  # why this provider (e.g. "no CUDA device found; running on the CPU")

    @property
    def on_gpu(self) -> bool:
        return self.provider in GPU_PROVIDERS


def check_provider(provider: str) -> str:
    return check_choice("provider", provider, PROVIDERS)


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# "/onnxruntime_src/.../model.cc:256 onnxruntime::Model::Model(<arguments>) " before the message itself
_ORT_SOURCE = re.compile(r"\S+\.(?:cc|cpp|h):\d+ (?:[\w:~<>]+\([^()]*\)(?: const)? )?")


def ort_error_cause(error: BaseException) -> str:
    """ONNX Runtime's error message without its source location and C++ signature."""
    cleaned = _ORT_SOURCE.sub("", _ORT_PREFIX.sub("", str(error).strip()))
    return first_line(ValueError(cleaned)) if cleaned.strip() else first_line(error)


def _new_session(ort: Any, model: str | bytes, providers: list[Any]) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only; provider problems are reported by us
    if (threads := inference_threads()) is not None:  # gantool serve --ray: replicas share the cores
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as e:  # InvalidProtobuf, Fail, NoSuchFile, ...: corrupt or unsupported model
        where = "the model" if isinstance(model, bytes) else model
        raise ModelError(f"cannot load ONNX model {where}: {ort_error_cause(e)}") from None


def open_session(
    model: str | Path | bytes, provider: str = "auto", *, exact: bool = False, tensorrt_options: dict | None = None
) -> OpenedSession:
    """An ONNX Runtime session for ``model`` (a path or serialized bytes) on ``provider``.

    ``auto``: CUDA when a GPU is plausibly there and CUDA really loads, else the
    CPU (a warning says why CUDA did not load). ``cuda``/``tensorrt``: that
    provider or ProviderError naming the cause. ``exact`` turns TF32 off (parity).
    """
    import onnxruntime as ort  # delayed: heavy import

    check_provider(provider)
    source = model if isinstance(model, bytes) else str(model)
    cpu = ORT_PROVIDER["cpu"]
    if provider == "cpu":
        return OpenedSession(_new_session(ort, source, [cpu]), cpu, "as requested")
    if provider == "auto" and not cuda_device_visible():
        return OpenedSession(_new_session(ort, source, [cpu]), cpu, "no CUDA device found; running on the CPU")
    wanted = "tensorrt" if provider == "tensorrt" else "cuda"
    if ORT_PROVIDER[wanted] not in ort.get_available_providers():
        cause = f"this onnxruntime build has no {ORT_PROVIDER[wanted]} (install onnxruntime-gpu)"
        return _gpu_failed(ort, source, provider, wanted, cause)
    cuda_options = dict(CUDA_EXACT_OPTIONS if exact else CUDA_OPTIONS)
    providers: list[Any] = [(ORT_PROVIDER["cuda"], cuda_options), cpu]
    if wanted == "tensorrt":  # CUDA stays in the list as TensorRT's own fallback for unsupported nodes
        providers.insert(0, (ORT_PROVIDER["tensorrt"], dict(tensorrt_options or {})))
    with captured_native_output() as captured:
        with contextlib.suppress(Exception):  # a failed preload shows up as a missing provider below
            ort.preload_dlls()
        session = _new_session(ort, source, providers)
    active = session.get_providers()[0]
    if active == ORT_PROVIDER[wanted]:
        return OpenedSession(session, active, "CUDA device found" if wanted == "cuda" else "TensorRT loaded")
    return _gpu_failed(ort, source, provider, wanted, failure_cause(captured.text, wanted))


def _gpu_failed(ort: Any, source: str | bytes, provider: str, wanted: str, cause: str) -> OpenedSession:
    if provider != "auto":
        raise ProviderError(f"provider '{wanted}' could not be loaded: {cause}")
    log.warning("CUDA did not load (%s); running on the CPU", cause)
    cpu = ORT_PROVIDER["cpu"]
    return OpenedSession(_new_session(ort, source, [cpu]), cpu, f"CUDA did not load ({cause}); running on the CPU")


# RunOptions config key (onnxruntime_run_options_config_keys.h): at the end of the run, free the
# listed arenas' regions that are not in use. Needs the CPU arena on (SessionOptions' default).
ARENA_SHRINKAGE_KEY = "memory.enable_memory_arena_shrinkage"
_NUMPY_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16"}


# The arenas a releasing run shrinks: the CPU's, and on CUDA the device's too (gantool opens CUDA
# sessions on device 0, ONNX Runtime's default device_id). The CUDA arena's regions go back to the
# driver; the next large run allocates them again.
SHRINK_ARENAS = {False: "cpu:0", True: "cpu:0;gpu:0"}


def run_releasing_arena(
    session: Any, feeds: dict[str, Any], output: str, shape: tuple[int, ...], on_gpu: bool = False
) -> Any:
    """Run ``session`` and then shrink its memory arenas (:data:`SHRINK_ARENAS`: the CPU's,
    with ``on_gpu`` the CUDA device's too); returns ``output`` (numpy).

    The output is written into an array of ``shape`` that numpy owns (IO binding; on CUDA
    ONNX Runtime copies it from the device into that array): an output that ONNX Runtime
    allocates lives in its arena and would keep that region in use, so the shrink at the end
    of the run could not free it.
    """
    import numpy as np
    import onnxruntime as ort  # delayed: heavy import

    kinds = {o.name: o.type for o in session.get_outputs()}
    result = np.empty(shape, dtype=_NUMPY_DTYPES.get(kinds.get(output, ""), "float32"))
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    binding.bind_ortvalue_output(output, ort.OrtValue.ortvalue_from_numpy(result))
    options = ort.RunOptions()
    options.add_run_config_entry(ARENA_SHRINKAGE_KEY, SHRINK_ARENAS[on_gpu])
    session.run_with_iobinding(binding, options)
    return result


def try_provider(model: str | Path | bytes, name: str) -> tuple[Any | None, list[str], str]:
    """Open ``model`` with the ONNX Runtime provider ``name`` (CPU as ORT's fallback behind it).

    Returns (session or None, the providers that really run, the cause when
    ``name`` did not load). For probing every provider (``gantool doctor``).
    """
    import onnxruntime as ort  # delayed: heavy import

    cpu = ORT_PROVIDER["cpu"]
    providers = [name] if name == cpu else [name, cpu]
    gpu = name in GPU_PROVIDERS
    source = model if isinstance(model, bytes) else str(model)
    with captured_native_output() as captured:
        try:
            if gpu:
                with contextlib.suppress(Exception):  # a failed preload shows as a provider that did not load
                    ort.preload_dlls()
            session = _new_session(ort, source, providers)
        except ModelError as e:
            return None, [], str(e)
    active = list(session.get_providers())
    if active and active[0] == name:
        return session, active, ""
    if gpu:
        return session, active, failure_cause(captured.text, "tensorrt" if name == ORT_PROVIDER["tensorrt"] else "cuda")
    return session, active, f"ONNX Runtime fell back to {active[0] if active else 'nothing'}"


# ----------------------------------------------------------------------------- torch devices


def torch_device(provider: str) -> tuple[Any, str]:
    """The torch device for ``provider`` and a note saying why (same policy as sessions)."""
    import torch  # delayed: heavy import

    check_provider(provider)
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


# Instruction-set extensions a compiler may use under -march=native (x86 /proc/cpuinfo "flags";
# on Arm every "Features" entry counts). AOTInductor compiles CPU packages that way.
_X86_ISA_FLAG = re.compile(
    r"(?:sse|ssse|avx|amx|fma|f16c|bmi|popcnt|abm|lzcnt|movbe|aes|vaes|pclmul|vpclmul|gfni|sha_ni|adx"
    r"|rdrand|rdseed|xsave|cx16|clflushopt|clwb|serialize|movdir|prfchw|3dnowprefetch)\w*"
)


def cpu_isa_flags(cpuinfo: str | None = None) -> list[str]:
    """This CPU's instruction-set extensions (sorted), from ``/proc/cpuinfo`` (or the text
    given); empty where that file does not exist (then nothing can be checked)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return sorted({flag for flag in value.split() if _X86_ISA_FLAG.fullmatch(flag)})
        if key.strip() == "Features":
            return sorted(set(value.split()))
    return []


def check_aoti_package(path: Path, metadata: dict[str, str], device: Any, cpu_flags: list[str] | None = None) -> None:
    """Refuse a package compiled for another device, GPU architecture, torch version or a CPU
    with instructions this one lacks (one line each; such a package would crash the process).
    ``cpu_flags``: this CPU's extensions (default: :func:`gantool.runtime.providers.cpu_isa_flags`)."""
    import torch  # delayed: heavy import

    built_for = metadata.get(META_AOTI_DEVICE, "")
    again = "re-export it with `gantool export --aoti` on this machine"
    if built_for != device.type:
        raise ModelError(f"{path.name} was compiled for {built_for or 'an unknown device'}, not {device.type}: {again}")
    built_with = metadata.get(META_TORCH_VERSION, "")
    if built_with != torch.__version__:
        raise ModelError(
            f"{path.name} was compiled with torch {built_with}, this is torch {torch.__version__}: {again}"
        )
    if device.type == "cpu":
        needed = metadata.get(META_AOTI_CPU_FLAGS, "").split()
        here = cpu_isa_flags() if cpu_flags is None else cpu_flags
        missing = sorted(set(needed) - set(here)) if here else []  # unknown here: nothing to compare
        if missing:
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            raise ModelError(f"{path.name} was compiled for a CPU with {shown}, which this CPU lacks: {again}")
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
        if metadata.get(META_AOTI_CUDA_ARCH, "") != arch:
            built_arch = metadata.get(META_AOTI_CUDA_ARCH) or "an unknown GPU"
            raise ModelError(f"{path.name} was compiled for {built_arch}, this GPU is {arch}: {again}")

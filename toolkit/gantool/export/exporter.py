"""Export a trained generator to ONNX, torch.export (.pt2), AOTInductor and TorchScript (legacy),
with parity proven at export.

What is exported: the generator in eval mode with BatchNorm folded into the
convolutions, the composite inside the graph. Inputs ``image`` (N x 3 x H x W)
and ``mask`` (N x 1 x H x W, 1 = hole), output ``inpainted``; N, H and W are
dynamic (H and W multiples of 4). Every file carries the same metadata
(:func:`build_metadata`), which :func:`read_model_metadata` reads back.

The files carry no trace of the machine that exported them (see
:mod:`gantool.export.provenance`): the ONNX exporter's per-node stack traces and other
annotations and TorchScript's ``.debug_pkl`` source records are stripped unless
``keep_debug_info=True``, and the export time lives only in the report, so the
same checkpoint exported twice gives byte-identical ONNX files.

All outputs of one export are written to temp files and renamed into place only
after every format exported and (unless ``verify=False``) passed the parity
sweep, so a failed export leaves nothing new behind.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from gantool import __version__
from gantool.core.artifacts import (
    ALWAYS_WRITTEN,
    ARTIFACT,
    CHECKPOINT_TRAIN_KEYS,
    DEFAULT_EXPORT_FORMATS,
    EXPORT_FORMATS,
    KIND_CHECKPOINT,
    KIND_ONNX,
    KIND_SAFETENSORS,
    META_AOTI_CPU_FLAGS,
    META_AOTI_CUDA_ARCH,
    META_AOTI_DEVICE,
    META_COMPILE_FLAGS,
    META_MODEL_CONFIG,
    META_PRECISION,
    META_PROCESSING,
    META_SOURCE,
    META_TORCH_VERSION,
    META_TRAIN_PHASE,
    META_TRAIN_STEP,
    META_VERSION,
    META_WEIGHTS_SHA256,
    PT2_METADATA_ENTRY,
    TORCHSCRIPT_METADATA_ENTRY,
    decode_metadata,
    export_files,
    model_kind,
    read_model_metadata,
)
from gantool.core.constants import CHECKPOINTS_DIR, DEFAULT_INT8_MIN_PSNR, RUN_EXPORT_DIR
from gantool.core.errors import CheckpointError, InputError, ModelError, first_line
from gantool.core.fileio import atomic_path, atomic_write_text, ensure_writable_dir
from gantool.core.processing import processing_contract
from gantool.export.parity import (
    Backend,
    BackendSpec,
    ParityCase,
    cuda_worth_trying,
    default_cases,
    failures,
    onnx_session,
    onnxruntime_backend,
    parity_sweep,
    report_to_json,
    torch_backend,
)
from gantool.export.provenance import (
    find_machine_traces,
    redact_paths,
    strip_onnx_debug_info,
    strip_torchscript_debug_info,
)
from gantool.export.quantize import calibration_batch, quantize_int8
from gantool.nn.networks import CompletionNetwork, fold_batchnorm
from gantool.runtime.backends import strip_dtype_asserts
from gantool.runtime.providers import cpu_isa_flags
from gantool.training.checkpoint import (
    generator_from_checkpoint,
    load_checkpoint,
    model_config_of,
    save_generator_weights,
    weights_sha256,
)

logger = logging.getLogger(__name__)

MIN_FP16_PSNR = 40.0
# bf16 autocast keeps about 3 significant digits: gate its hole PSNR like int8's default.
MIN_BF16_PSNR = 35.0
INPUT_NAMES, OUTPUT_NAMES = ["image", "mask"], ["inpainted"]


@dataclass
class ExportResult:
    checkpoint: Path
    out_dir: Path
    paths: dict[str, Path]  # onnx, onnx_fp16, onnx_int8, pt2, aoti, torchscript, safetensors, report
    sizes: dict[str, int]  # bytes per path key (the report excluded)
    metadata: dict[str, str]
    report: dict[str, Any] | None  # parity report; None with verify=False
    notes: list[str] = field(default_factory=list)


class ParityError(ModelError):
    """The exported model does not match eager PyTorch; ``report`` has the details."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


# ------------------------------------------------------------------ where things are


def find_latest_checkpoint(root: str | Path = "runs") -> Path:
    """The newest ``<root>/*/checkpoints/last.pt`` by modification time."""
    candidates = [p for p in Path(root).glob("*/checkpoints/last.pt") if p.is_file()]
    if not candidates:
        raise CheckpointError(f"no checkpoint found under {root}/*/checkpoints/last.pt; pass one explicitly")
    return max(candidates, key=lambda p: p.stat().st_mtime)


def default_output_dir(checkpoint: str | Path) -> Path:
    """``<run>/export`` for ``<run>/checkpoints/x.pt``, else ``export`` beside the file."""
    folder = Path(checkpoint).resolve().parent
    return (folder.parent if folder.name == CHECKPOINTS_DIR else folder) / RUN_EXPORT_DIR


# --------------------------------------------------------------------------- metadata


def build_metadata(state: dict[str, Any], source: str = "", precision: str = "fp32") -> dict[str, str]:
    """The metadata contract shared by every exported file (string keys and values).

    Deterministic on purpose (no export time, no paths): equal checkpoints give equal files.
    """
    config = model_config_of(state)
    return {
        META_VERSION: __version__,
        META_MODEL_CONFIG: json.dumps(config.to_dict()),
        META_PROCESSING: json.dumps(processing_contract(config)),
        META_TRAIN_STEP: str(int(state.get("step", 0))),
        META_TRAIN_PHASE: str(state.get("phase", "")),
        META_WEIGHTS_SHA256: weights_sha256(state["generator"]),
        META_PRECISION: precision,
        META_SOURCE: source,
        META_TORCH_VERSION: torch.__version__,
    }


# -------------------------------------------------------------------------- exporting


class HalfPrecisionGenerator(nn.Module):
    """The folded generator with an fp16 body and float32 inputs and outputs.

    The composite runs in float32 after the cast back, so known pixels stay exact.
    """

    def __init__(self, folded: CompletionNetwork) -> None:
        super().__init__()
        self.body = copy.deepcopy(folded.body).half()
        self.register_buffer("fill", folded.fill.detach().clone().float())

    def forward(self, image: Tensor, mask: Tensor) -> Tensor:
        known = 1.0 - mask
        fill: Tensor = self.fill  # type: ignore[assignment]  # a registered buffer
        filled = image * known + fill * mask
        out = self.body(torch.cat([filled, mask], dim=1).half()).float()
        return image * known + out * mask


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's warnings and log chatter locally, unless debugging."""
    if logger.isEnabledFor(logging.DEBUG):
        yield
        return
    # torch.onnx's exporter chatter; cpp_extension's "No CUDA runtime is found" when AOTInductor compiles.
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.utils.cpp_extension")]
    old_levels = [one.level for one in loggers]
    for one in loggers:
        one.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for category in (UserWarning, FutureWarning, DeprecationWarning):
                warnings.simplefilter("ignore", category)
            yield
    finally:
        for one, level in zip(loggers, old_levels):
            one.setLevel(level)


def _example_inputs(size: int) -> tuple[Tensor, Tensor]:
    # Batch 2 so the exporter cannot specialize N to 1; a box hole in the middle.
    image = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 1, size, size)
    mask[..., size // 4 : size // 2, size // 4 : size // 2] = 1.0
    return image, mask


def _dynamic_shapes() -> dict[str, dict[int, Any]]:
    # H and W as 4 * Dim: the two stride-2 stages need multiples of 4.
    batch = torch.export.Dim("batch", min=1)
    height, width = torch.export.Dim("height_div4", min=1), torch.export.Dim("width_div4", min=1)
    axes = {0: batch, 2: 4 * height, 3: 4 * width}
    return {"image": axes, "mask": dict(axes)}


def export_onnx(
    module: nn.Module,
    example: tuple[Tensor, Tensor],
    path: Path,
    metadata: dict[str, str],
    opset: int | None = None,
    keep_debug_info: bool = False,
) -> None:
    """torch.onnx (dynamo) export, metadata added, onnx.checker (full), one self-contained file.

    Unless ``keep_debug_info``, the exporter's annotations (per-node stack traces,
    FX node text, name scopes, graph signature, doc strings) are stripped.
    """
    import onnx

    try:
        with _quiet_exporter(), torch.no_grad():
            program = torch.onnx.export(
                module, example, dynamo=True, dynamic_shapes=_dynamic_shapes(), input_names=INPUT_NAMES,
                output_names=OUTPUT_NAMES, opset_version=opset, verbose=False,
            )  # fmt: skip
        assert program is not None  # dynamo=True always returns a program
        model = program.model_proto
    except Exception as e:  # the exporter raises many types; the user needs one line
        logger.debug("ONNX export failed", exc_info=True)
        raise ModelError(f"ONNX export failed: {first_line(e)}") from None
    got = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and got != opset:
        raise ModelError(f"ONNX export could not target opset {opset} (the exporter produced opset {got})")
    if not keep_debug_info:
        strip_onnx_debug_info(model)
    kept = [p for p in model.metadata_props if p.key not in metadata]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    model.doc_string = "gantool GLCIC generator: image + mask (1 = hole) -> inpainted, composited in-graph"
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # ValidationError or shape-inference errors
        raise ModelError(f"exported ONNX model fails onnx.checker: {first_line(e)}") from None
    # Weights inside the one file: a separate .onnx.data is easily lost when copying.
    onnx.save_model(model, str(path), save_as_external_data=False)


def export_torchscript(
    folded: nn.Module,
    example: tuple[Tensor, Tensor],
    path: Path,
    metadata: dict[str, str],
    keep_debug_info: bool = False,
    archive_name: str = "generator.torchscript",
) -> None:
    """torch.jit.trace, checked by the tracer on other shapes, metadata in _extra_files.

    Unless ``keep_debug_info``, the archive is rewritten without its ``.debug_pkl``
    source records (absolute paths of the traced Python files) and with the top
    folder ``archive_name`` (torch would name it after the temp file).
    """
    # One other batch size and a non-square size: the tracer re-traces and compares.
    check_inputs = [(torch.rand(3, 3, 12, 20), (torch.rand(3, 1, 12, 20) > 0.5).float())]
    try:
        with _quiet_exporter(), torch.no_grad():
            traced = torch.jit.trace(folded, example, check_inputs=check_inputs)
            torch.jit.save(traced, str(path), _extra_files={TORCHSCRIPT_METADATA_ENTRY: json.dumps(metadata)})
    except Exception as e:  # TracingCheckError and friends
        logger.debug("TorchScript export failed", exc_info=True)
        raise ModelError(f"TorchScript export failed: {first_line(e)}") from None
    if not keep_debug_info:
        strip_torchscript_debug_info(path, root=archive_name)


def export_program(module: nn.Module, example: tuple[Tensor, Tensor]) -> Any:
    """torch.export.export with dynamic N, H and W (H, W = 4 * Dim: the net downsamples by 4).

    Sizes are treated "size-oblivious": otherwise a dimension that is 1 (N = 1,
    or H = 4 giving 1 after two stride-2 stages) gets guards that reject it.
    """
    import torch.fx.experimental._config as fx_config  # delayed: torch.export internals

    with fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]  # installed by torch
        return torch.export.export(module, example, dynamic_shapes=_dynamic_shapes())


def strip_program_debug_info(program: Any) -> Any:
    """Drop the per-node Python stack traces (absolute source paths) from an ExportedProgram's graph."""
    for node in program.graph_module.graph.nodes:
        node.meta.pop("stack_trace", None)
    return program


def sort_range_constraints(program: Any) -> Any:
    """Order an ExportedProgram's ``range_constraints`` by symbol name, in place.

    torch fills them from a set of sympy symbols, so their order (written into the
    .pt2's model.json, and into its ``serialization_id``, which hashes the entries)
    follows PYTHONHASHSEED: two exports of one checkpoint differed in bytes.
    """
    constraints = program.range_constraints  # the program's own dict, not a copy
    ordered = sorted(constraints.items(), key=lambda item: str(item[0]))
    constraints.clear()
    constraints.update(ordered)
    return program


def export_pt2(
    module: nn.Module,
    example: tuple[Tensor, Tensor],
    path: Path,
    metadata: dict[str, str],
    keep_debug_info: bool = False,
) -> Any:
    """torch.export.export with dynamic N, H, W (H, W = 4 * Dim), saved with the metadata as an extra file.

    Unless ``keep_debug_info``, the nodes' stack traces (paths of this machine) are dropped.
    Returns the ExportedProgram (AOTInductor compiles it).
    """
    try:
        with _quiet_exporter(), torch.no_grad():
            program = export_program(module, example)
        if not keep_debug_info:
            strip_program_debug_info(program)
        sort_range_constraints(program)  # equal checkpoints, equal bytes
        with open(path, "wb") as f:  # a file object: torch.export.save wants a .pt2 name otherwise
            torch.export.save(program, f, extra_files={PT2_METADATA_ENTRY: json.dumps(metadata)})
    except Exception as e:  # torch.export raises many types (UserError, ConstraintViolationError, ...)
        logger.debug("torch.export failed", exc_info=True)
        raise ModelError(f"torch.export failed: {first_line(e)}") from None
    return program


def aoti_target() -> str:
    """Where ``--aoti`` compiles for: CUDA when torch sees a GPU, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_arch() -> str:
    """The current GPU's architecture (``sm_90``), or "" without CUDA."""
    if not torch.cuda.is_available():
        return ""
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def aoti_metadata(metadata: dict[str, str], device: str, flags: dict[str, Any]) -> dict[str, str]:
    """The export metadata plus what the package was compiled for (checked when it is loaded)."""
    return {
        **metadata,
        META_AOTI_DEVICE: device,
        META_AOTI_CUDA_ARCH: cuda_arch() if device == "cuda" else "",
        # Inductor compiles CPU code with -march=native: the package needs this CPU's extensions.
        META_AOTI_CPU_FLAGS: " ".join(cpu_isa_flags()) if device == "cpu" else "",
        META_TORCH_VERSION: torch.__version__,
        META_COMPILE_FLAGS: json.dumps(flags, sort_keys=True),
    }


# Generated C++ sources inside an AOTInductor package: for debugging only; they name the compile folder.
AOTI_SOURCE_SUFFIXES = (".cpp", ".h")


def export_aoti(
    folded: nn.Module,
    example: tuple[Tensor, Tensor],
    path: Path,
    metadata: dict[str, str],
    device: str = "cpu",
    keep_debug_info: bool = False,
) -> dict[str, str]:
    """Compile the folded generator ahead of time with AOTInductor for ``device``; returns its metadata.

    CPU packages are compiled with freezing (weights folded into the graph as
    constants), as PyTorch recommends for CPU inference. Needs a C++ compiler
    (and Triton for CUDA). Unless ``keep_debug_info``, the package's generated C++
    sources (which name the compile folder) are left out: it runs from its compiled library.
    """
    import zipfile

    import torch._inductor  # delayed: heavy import
    import torch._inductor.config as inductor_config

    flags: dict[str, Any] = {"freezing": True} if device == "cpu" else {}
    patched = inductor_config.patch(flags)
    meta = aoti_metadata(metadata, device, flags)
    module = copy.deepcopy(folded).to(device).eval()
    inputs = (example[0].to(device), example[1].to(device))
    stack = contextlib.ExitStack()
    try:
        with _quiet_exporter(), torch.no_grad(), patched, tempfile.TemporaryDirectory() as tmp:
            cache = str(Path(tmp).resolve() / "cache")
            # The compiler records these in the library: the compile folder and torch's headers.
            torch_dir = Path(torch.__file__).parent
            build_folders = {cache: "./aoti-build", str(torch_dir): "./torch", str(torch_dir.resolve()): "./torch"}
            if not keep_debug_info:
                stack.enter_context(_inductor_cache_in(Path(cache)))
            program = export_program(module, inputs)
            if not keep_debug_info:
                strip_program_debug_info(program)
            package = Path(tmp) / ARTIFACT["aoti"].filename  # AOTInductor wants a .pt2 name
            torch._inductor.aoti_compile_and_package(program, package_path=str(package), inductor_configs=flags)
            with zipfile.ZipFile(package) as source, zipfile.ZipFile(path, "w") as archive:
                root = source.namelist()[0].split("/")[0]
                for entry in source.infolist():
                    if keep_debug_info:
                        archive.writestr(entry, source.read(entry.filename))
                    elif not entry.filename.endswith(AOTI_SOURCE_SUFFIXES):
                        archive.writestr(entry, _unnamed_folders(source.read(entry.filename), build_folders))
                archive.writestr(f"{root}/extra/{PT2_METADATA_ENTRY}", json.dumps(meta))  # under its own folder
    except Exception as e:  # compiler missing, inductor errors, ...
        logger.debug("AOTInductor compile failed", exc_info=True)
        raise ModelError(f"AOTInductor compile for {device} failed: {first_line(e)}") from None
    finally:
        stack.close()
    return meta


def _unnamed_folders(data: bytes, folders: dict[str, str]) -> bytes:
    """``data`` with each absolute folder path replaced by a relative placeholder of the same
    length (a compiled library records them in its strings; a same-length edit keeps its layout)."""
    for folder, placeholder in sorted(folders.items(), key=lambda kv: -len(kv[0])):
        old = folder.encode()
        if len(old) >= len(placeholder):
            data = data.replace(old, (placeholder + "_" * len(old))[: len(old)].encode())
    return data


@contextlib.contextmanager
def _inductor_cache_in(folder: Path) -> Iterator[None]:
    """Compile in a fresh folder: the compiled library embeds its compile folder's path, and
    torch's default (``/tmp/torchinductor_<user>``) names the user. The variable is restored after."""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def check_options(
    formats: Sequence[str], opset: int | None, fp16: bool, atol: float, int8: bool = False
) -> tuple[str, ...]:
    """Validate formats and their options against the artifact table (aoti brings pt2 along)."""
    formats = tuple(dict.fromkeys(formats))
    if "aoti" in formats and "pt2" not in formats:
        formats = (*formats, "pt2")
    if not formats:
        raise InputError("no export format selected")
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown:
        raise InputError(f"unknown export format {unknown[0]!r}; choose from {', '.join(EXPORT_FORMATS)}")
    for option, used in (("opset", opset is not None), ("fp16", fp16), ("int8", int8)):
        allowed = [name for name in EXPORT_FORMATS if option in ARTIFACT[name].options]
        if used and not any(f in allowed for f in formats):
            raise InputError(f"--{option} applies only to {' or '.join(allowed)} export")
    if opset is not None and not 18 <= opset <= _max_opset():
        raise InputError(f"--opset must be between 18 and {_max_opset()}, got {opset}")
    if not atol > 0:
        raise InputError(f"--atol must be positive, got {atol}")
    return formats


def _max_opset() -> int:
    import onnx

    return onnx.defs.onnx_opset_version()


def export_generator(
    checkpoint_path: str | Path,
    out_dir: str | Path | None = None,
    formats: Sequence[str] = DEFAULT_EXPORT_FORMATS,
    opset: int | None = None,
    fp16: bool = False,
    verify: bool = True,
    atol: float = 1e-4,
    overwrite: bool = False,
    cuda: bool | None = None,
    cases: Sequence[ParityCase] | None = None,
    keep_debug_info: bool = False,
    int8: bool = False,
    calib: str | Path | None = None,
    int8_min_psnr: float = DEFAULT_INT8_MIN_PSNR,
    aoti_device: str | None = None,
) -> ExportResult:
    """Export the generator of ``checkpoint_path`` and prove parity with eager PyTorch.

    ``cuda=None`` checks ONNX Runtime's CUDA provider too when a GPU is plausibly
    there; ``cases`` overrides the parity sweep (default :func:`default_cases`).
    ``int8`` also writes the int8 ONNX model, calibrated on ``calib`` (a folder)
    or the run's validation images, if it passes ``int8_min_psnr`` (else
    QuantizationError). ``aoti_device`` ("cpu"/"cuda") defaults to :func:`aoti_target`.
    Raises ParityError (a ModelError) when a backend fails; nothing is written then.
    The files carry no absolute path or stack trace of this machine (checked with
    :func:`gantool.export.provenance.find_machine_traces`) unless ``keep_debug_info``.
    """
    formats = check_options(formats, opset, fp16, atol, int8)
    if calib is not None and not int8:
        raise InputError("--calib applies only to --int8 export")
    if not int8_min_psnr > 0:
        raise InputError(f"--int8-min-psnr must be positive, got {int8_min_psnr}")
    if aoti_device not in (None, "cpu", "cuda"):
        raise InputError(f"the AOTInductor device must be cpu or cuda, got {aoti_device!r}")
    if aoti_device == "cuda" and not torch.cuda.is_available():
        raise InputError("cannot compile AOTInductor for cuda: torch finds no CUDA device")
    checkpoint_path = Path(checkpoint_path)
    state = load_checkpoint(checkpoint_path)
    generator = generator_from_checkpoint(state)
    size = generator.config.size
    out_dir = ensure_writable_dir(Path(out_dir) if out_dir is not None else default_output_dir(checkpoint_path))
    keys = [*formats, *(["onnx_fp16"] if fp16 else []), *(["onnx_int8"] if int8 else []), *ALWAYS_WRITTEN]
    targets = {key: out_dir / ARTIFACT[key].filename for key in keys}
    bad = non_finite_weights(state["generator"])
    if bad:
        raise ModelError(f"{checkpoint_path} has non-finite weights ({bad}); nothing exported")
    # An export folder holds one model: any file of an older export is replaced or removed.
    existing = sorted({str(p) for p in [*targets.values(), *export_files(out_dir).values()] if p.exists()})
    if existing and not overwrite:
        raise InputError(f"refusing to overwrite {', '.join(existing)} (use --overwrite)")

    metadata = build_metadata(state, source=checkpoint_path.name)
    folded = fold_batchnorm(generator)
    example = _example_inputs(size)
    with torch.no_grad():
        fold_error = float((folded(*example) - generator(*example)).abs().max())
    if not fold_error <= atol:
        raise ModelError(f"folding BatchNorm changed the output by {fold_error:.3g} (> atol {atol:g})")

    seconds: dict[str, float] = {}
    format_notes: list[str] = []
    metadata_of: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        tmp = {key: stack.enter_context(atomic_path(path, overwrite)) for key, path in targets.items()}
        for key in ("onnx", "onnx_fp16", "onnx_int8", "pt2", "aoti", "torchscript"):
            if key not in tmp:
                continue
            logger.info("exporting %s", targets[key].name)
            start = time.perf_counter()
            if key == "onnx":
                export_onnx(folded, example, tmp[key], metadata, opset, keep_debug_info)
            elif key == "onnx_fp16":
                half = HalfPrecisionGenerator(folded).eval()  # type: ignore[arg-type]  # folded: a CompletionNetwork
                fp16_metadata = {**metadata, META_PRECISION: ARTIFACT[key].precision or "fp16"}
                export_onnx(half, example, tmp[key], fp16_metadata, opset, keep_debug_info)
            elif key == "onnx_int8":
                calibration = calibration_batch(state, generator.config, calib)
                logger.info("int8 calibration: %s", calibration.source)
                int8_result = quantize_int8(
                    tmp["onnx"], tmp[key], metadata, calibration, generator.config, int8_min_psnr, cases
                )
                floats = ", ".join(int8_result.float_nodes) or "none (every convolution is int8)"
                format_notes.append(
                    f"int8: calibrated on {calibration.source}; worst hole PSNR against fp32 "
                    f"{int8_result.hole_psnr:.1f} dB (gate {int8_min_psnr:g} dB); convolutions left in float: {floats}"
                )
            elif key == "pt2":
                export_pt2(folded, example, tmp[key], metadata, keep_debug_info)
            elif key == "aoti":
                device = aoti_target() if aoti_device is None else aoti_device
                metadata_of[key] = export_aoti(folded, example, tmp[key], metadata, device, keep_debug_info)
                format_notes.append(f"aoti: compiled for {device} with torch {torch.__version__}; it runs only there")
            else:
                archive_name = targets[key].name.removesuffix(".pt")
                export_torchscript(folded, example, tmp[key], metadata, keep_debug_info, archive_name)
            seconds[key] = round(time.perf_counter() - start, 2)
        save_generator_weights(tmp["safetensors"], generator, metadata)

        report: dict[str, Any] | None = None
        notes: list[str] = []
        if verify:
            built_for = metadata_of.get("aoti", {}).get(META_AOTI_DEVICE, "cpu")
            report, notes = verify_exports(generator, folded, tmp, atol, cuda, cases, int8_min_psnr, built_for)
            if not report["passed"]:
                problems = failures(report)
                raise ParityError(f"parity check failed: {problems[0]}", report)
        notes = [*format_notes, *notes]
        sizes = {key: tmp[key].stat().st_size for key in tmp if key != "report"}
        files = {key: {"file": targets[key].name, "bytes": sizes[key]} for key in sizes}
        # The report ships beside the models: no absolute paths in notes (a provider's load error, say),
        # the checkpoint by name and hash; the export time lives here, not in the model files.
        notes = [redact_paths(note) for note in notes]
        if report is not None:
            report["notes"] = notes
        document = {
            "checkpoint": {"file": checkpoint_path.name, "sha256": _file_sha256(checkpoint_path)},
            "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "keep_debug_info": keep_debug_info,
            "files": files,
            "metadata": metadata,
            "fold_batchnorm_max_abs": fold_error,
            "export_seconds": seconds,
            "verified": verify,
            "parity": report,
            "notes": notes,
        }
        atomic_write_text(tmp["report"], json.dumps(report_to_json(document), indent=2) + "\n")
        if not keep_debug_info:
            _check_no_machine_traces(tmp, targets)
    # The new files are in place; files of the older export that this one did not write go.
    for key, stale in export_files(out_dir).items():
        if key not in targets:
            stale.unlink(missing_ok=True)
            logger.info("removed %s: it belonged to the previous export in %s", stale.name, out_dir)
    return ExportResult(checkpoint_path, out_dir, targets, sizes, metadata, report, notes)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_no_machine_traces(files: dict[str, Path], targets: dict[str, Path]) -> None:
    """Fail the export (nothing renamed into place) if a written file still carries traces."""
    for key, path in files.items():
        traces = find_machine_traces(path, name=targets[key].name)
        if traces:
            raise ModelError(
                f"{targets[key].name} still carries build-machine traces after cleaning ({traces[0]}); "
                "use --keep-debug-info to export them anyway"
            )


def _file_non_finite_weights(path: Path, kind: str) -> str:
    """Non-finite weights in an ONNX or safetensors file ('' when none, or for other kinds)."""
    if kind == KIND_SAFETENSORS:
        import safetensors.torch

        return non_finite_weights(safetensors.torch.load_file(str(path)))
    if kind == KIND_ONNX:
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(path), load_external_data=False)
        tensors = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
        return non_finite_weights(tensors)
    return ""


def non_finite_weights(state_dict: dict[str, Tensor]) -> str:
    """'' when every weight is finite, else which tensors hold NaN/Inf (for one-line messages)."""
    bad = [
        f"{name}: {int((~torch.isfinite(t)).sum())} of {t.numel()}"
        for name, t in state_dict.items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if not bad:
        return ""
    return "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more tensors" if len(bad) > 3 else "")


def _device_backend(module: nn.Module, cuda: bool) -> Backend:
    if not cuda:
        return torch_backend(module)

    def run(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(image).cuda(), torch.from_numpy(mask).cuda()).cpu().numpy()

    return run


def _bf16_backend(module: Any) -> Backend:
    """``module`` under bf16 autocast with channels_last inputs on the CPU (as --precision bf16 runs it)."""

    def run(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            to_cl = torch.channels_last
            return module(torch.from_numpy(image).to(memory_format=to_cl), torch.from_numpy(mask)).float().numpy()

    return run


def verify_exports(
    generator: CompletionNetwork,
    folded: nn.Module,
    files: dict[str, Path],
    atol: float,
    cuda: bool | None = None,
    cases: Sequence[ParityCase] | None = None,
    int8_min_psnr: float = DEFAULT_INT8_MIN_PSNR,
    aoti_device: str = "cpu",
) -> tuple[dict[str, Any], list[str]]:
    """Parity sweep of the exported files (as written) against the eager generator.

    ``aoti_device``: what ``files["aoti"]`` was compiled for (a CUDA package is not run here).
    """
    from gantool.training.loop import cpu_has_native_bf16  # delayed: the training stack

    backends = [BackendSpec("eager-folded", torch_backend(folded))]
    notes: list[str] = []
    if "pt2" in files:
        with open(files["pt2"], "rb") as f:
            program = torch.export.load(f)
        backends.append(BackendSpec("pt2", torch_backend(program.module())))
    if "aoti" in files:
        if aoti_device == "cpu":
            from torch._inductor import aoti_load_package  # delayed: heavy import

            with open(files["aoti"], "rb") as f:  # a file object: the temp file's name does not end in .pt2
                package = aoti_load_package(f)
            backends.append(BackendSpec("aoti-cpu", torch_backend(package)))
        else:
            notes.append("aoti (compiled for cuda) checked on the GPU only by examples/gpu_check.sh")
    if cpu_has_native_bf16():
        # Module.to(memory_format=...) works at run time, but torch 2.13's stubs lack that overload
        # and later ones have it: through Any, mypy passes on both (an ignore would be unused on one).
        bf16_cl = cast(Any, copy.deepcopy(folded)).to(memory_format=torch.channels_last)
        backends.append(BackendSpec("eager-bf16", _bf16_backend(bf16_cl), "bf16", None, MIN_BF16_PSNR))
        if "pt2" in files:
            with open(files["pt2"], "rb") as f:
                module = strip_dtype_asserts(torch.export.load(f).module())
            backends.append(BackendSpec("pt2-bf16", _bf16_backend(module), "bf16", None, MIN_BF16_PSNR))
    else:
        notes.append("bf16 not checked: this CPU has no native bf16 (AVX512-BF16/AMX)")
    if "onnx_int8" in files:
        session = onnx_session(files["onnx_int8"])
        backends.append(BackendSpec("onnxruntime-cpu-int8", onnxruntime_backend(session), "int8", None, int8_min_psnr))
    if "torchscript" in files:
        with _quiet_exporter():  # torch.jit.load warns that TorchScript is deprecated
            scripted = torch.jit.load(str(files["torchscript"]))
        backends.append(BackendSpec("torchscript", torch_backend(scripted)))
    onnx_files = {name: files[name] for name in ("onnx", "onnx_fp16") if name in files}
    for name, path in onnx_files.items():
        suffix, precision = ("-fp16", "fp16") if name == "onnx_fp16" else ("", "fp32")
        backends.append(BackendSpec(f"onnxruntime-cpu{suffix}", onnxruntime_backend(onnx_session(path)), precision))
    if "onnx_fp16" in files:
        # torch's fp16 CPU convolutions are slow: on the CPU check the cases up to one training-size image.
        on_gpu = torch.cuda.is_available()
        half = HalfPrecisionGenerator(folded).eval().to("cuda" if on_gpu else "cpu")  # type: ignore[arg-type]
        max_pixels = None if on_gpu else generator.config.size**2
        backends.append(BackendSpec("eager-fp16", _device_backend(half, on_gpu), "fp16", max_pixels))
        notes.append(
            "ONNX Runtime's CPU provider lacks most fp16 kernels and runs the fp16 model's body in "
            "float32 (weights upcast), so onnxruntime-cpu-fp16 measures fp16 weight rounding only; "
            "eager-fp16 runs torch's fp16 kernels (on the CPU only over cases up to one training-size image); "
            "only onnxruntime-cuda-fp16 measures the exported fp16 model's GPU path."
        )
    want_cuda = cuda_worth_trying() if cuda is None else cuda
    if onnx_files and not want_cuda:
        why = "not requested (--no-cuda)" if cuda is False else "no CUDA device found"
        notes.append(f"onnxruntime-cuda not checked: {why}")
    elif onnx_files:
        for name, path in onnx_files.items():
            suffix, precision = ("-fp16", "fp16") if name == "onnx_fp16" else ("", "fp32")
            try:
                session = onnx_session(path, cuda=True)
            except Exception as e:  # a CUDA problem must never break the CPU result
                notes.append(f"onnxruntime-cuda{suffix} not checked: {first_line(e)}")
                continue
            backends.append(BackendSpec(f"onnxruntime-cuda{suffix}", onnxruntime_backend(session), precision))
    cases = list(cases) if cases is not None else default_cases(generator.config)
    logger.info("parity check: %d cases x %d backends against eager PyTorch", len(cases), len(backends))
    reference = torch_backend(generator)
    report = parity_sweep(reference, backends, cases, generator.config.local_size, atol, MIN_FP16_PSNR)
    report["reference"] = "eager PyTorch, unfolded generator, eval mode, float32, CPU"
    report["notes"] = notes
    return report, notes


# ----------------------------------------------------------------------------- gantool info


def describe_file(path: str | Path) -> dict[str, Any]:
    """What ``gantool info`` shows: a model file's metadata, or a checkpoint's summary."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"file not found: {path}")
    if not path.is_file():
        raise InputError(f"not a regular file: {path}")
    kind = model_kind(path)
    if kind != KIND_CHECKPOINT:
        meta = read_model_metadata(path)
        bad = _file_non_finite_weights(path, kind)
        traces = find_machine_traces(path)  # absolute paths or stack traces it would leak
        return {
            "file": str(path),
            "kind": kind,
            "bytes": path.stat().st_size,
            "precision": meta.get(META_PRECISION, "fp32"),  # what runs by default (--precision bf16 aside)
            "metadata": decode_metadata(meta),
            "machine_traces": traces,
            "warnings": ([f"non-finite weights: {bad}"] if bad else []) + traces,
        }
    state = load_checkpoint(path)
    train = state.get("train_config") or {}
    bad = non_finite_weights(state["generator"])
    return {
        "file": str(path),
        "kind": kind,
        "bytes": path.stat().st_size,
        "gantool_version": state.get("gantool_version"),
        "step": int(state["step"]),
        "phase": state["phase"],
        "model_config": state["model_config"],
        "train_config": {k: train[k] for k in CHECKPOINT_TRAIN_KEYS if k in train},
        "metrics": state.get("metrics") or {},
        "weights_sha256": weights_sha256(state["generator"]),
        "warnings": [f"non-finite generator weights: {bad}"] if bad else [],
    }

"""The format family: ONNX (fp32 and fp16), TorchScript (legacy), torch.export (.pt2) and
AOTInductor, each written from the BN-folded generator into a path with its metadata.

:mod:`gantool.export.exporter` calls these into a staging folder and puts the files in place
together. Each serializes to memory and writes with Python, so a full disk is an OSError naming
the file (torch's C++ writers abort the process on a short write).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gantool.core.artifacts import (
    ARTIFACT,
    META_AOTI_CPU_FLAGS,
    META_AOTI_CUDA_ARCH,
    META_AOTI_DEVICE,
    META_COMPILE_FLAGS,
    META_FILE_WEIGHTS_SHA256,
    META_TORCH_VERSION,
    PT2_METADATA_ENTRY,
    TORCHSCRIPT_METADATA_ENTRY,
)
from gantool.core.errors import InputError, ModelError, first_line
from gantool.core.signals import signals_deferred
from gantool.export.provenance import strip_onnx_debug_info, strip_torchscript_debug_info
from gantool.nn.networks import CompletionNetwork, complete
from gantool.runtime.providers import cpu_isa_flags
from gantool.runtime.weights import aoti_constants, file_weights_sha256, onnx_model_tensors

logger = logging.getLogger(__name__)

INPUT_NAMES, OUTPUT_NAMES = ["image", "mask"], ["inpainted"]


class HalfPrecisionGenerator(nn.Module):
    """The folded generator with an fp16 body and float32 inputs and outputs.

    The composite runs in float32 after the cast back, so known pixels stay exact.
    """

    def __init__(self, folded: CompletionNetwork) -> None:
        super().__init__()
        self.body = copy.deepcopy(folded.body).half()
        self.register_buffer("fill", folded.fill.detach().clone().float())
        self.hole_fill = folded.config.hole_fill

    def forward(self, image: Tensor, mask: Tensor) -> Tensor:
        fill: Tensor = self.fill  # type: ignore[assignment]  # a registered buffer
        return complete(image, mask, fill, self.hole_fill, lambda x: self.body(x.half()).float())


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
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


def example_inputs(size: int) -> tuple[Tensor, Tensor]:
    # Batch 2 so the exporter cannot specialize N to 1; a box hole in the middle.
    image = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 1, size, size)
    mask[..., size // 4 : size // 2, size // 4 : size // 2] = 1.0
    return image, mask


def dynamic_shapes() -> dict[str, dict[int, Any]]:
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
        with quiet_exporter(), torch.no_grad(), signals_deferred():  # see export_program
            program = torch.onnx.export(
                module, example, dynamo=True, dynamic_shapes=dynamic_shapes(), input_names=INPUT_NAMES,
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
    kept = [p for p in model.metadata_props if p.key not in metadata and p.key != META_FILE_WEIGHTS_SHA256]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    own = {**metadata, META_FILE_WEIGHTS_SHA256: file_weights_sha256(onnx_model_tensors(model))}  # checked at open
    for key, value in own.items():
        model.metadata_props.add(key=key, value=value)
    model.doc_string = "gantool GLCIC generator: image + mask (1 = hole) -> inpainted, composited in-graph"
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # ValidationError or shape-inference errors
        raise ModelError(f"exported ONNX model fails onnx.checker: {first_line(e)}") from None
    # Weights inside the one file: a separate .onnx.data is easily lost when copying. Serialized
    # here and written by Python: a full disk is an OSError naming the file.
    path.write_bytes(model.SerializeToString())


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
        with quiet_exporter(), torch.no_grad():
            traced = torch.jit.trace(folded, example, check_inputs=check_inputs)
            buffer = io.BytesIO()  # in memory: torch's C++ writer aborts the process on a full disk
            own = {**metadata, META_FILE_WEIGHTS_SHA256: file_weights_sha256(traced.state_dict())}  # checked at open
            torch.jit.save(traced, buffer, _extra_files={TORCHSCRIPT_METADATA_ENTRY: json.dumps(own)})
    except Exception as e:  # TracingCheckError and friends
        logger.debug("TorchScript export failed", exc_info=True)
        raise ModelError(f"TorchScript export failed: {first_line(e)}") from None
    path.write_bytes(buffer.getvalue())
    if not keep_debug_info:
        strip_torchscript_debug_info(path, root=archive_name)


def export_program(module: nn.Module, example: tuple[Tensor, Tensor]) -> Any:
    """torch.export.export with dynamic N, H and W (H, W = 4 * Dim: the net downsamples by 4).

    Sizes are treated "size-oblivious": otherwise a dimension that is 1 (N = 1,
    or H = 4 giving 1 after two stride-2 stages) gets guards that reject it.
    """
    import torch.fx.experimental._config as fx_config  # delayed: torch.export internals

    # A stop signal waits for the trace's end: its handler's exception raised inside torch.export's
    # tracing has crashed the process (SIGSEGV) instead of ending the export with its line.
    with fx_config.patch(backed_size_oblivious=True), signals_deferred():  # type: ignore[attr-defined]  # installed by torch
        return torch.export.export(module, example, dynamic_shapes=dynamic_shapes())


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
        with quiet_exporter(), torch.no_grad():
            program = export_program(module, example)
        if not keep_debug_info:
            strip_program_debug_info(program)
        sort_range_constraints(program)  # equal checkpoints, equal bytes
        buffer = io.BytesIO()  # in memory: torch's C++ writer aborts the process on a full disk
        weights = {**program.state_dict, **program.constants}  # what the pt2 backend hands out at open
        own = {**metadata, META_FILE_WEIGHTS_SHA256: file_weights_sha256(weights)}
        torch.export.save(program, buffer, extra_files={PT2_METADATA_ENTRY: json.dumps(own)})
    except Exception as e:  # torch.export raises many types (UserError, ConstraintViolationError, ...)
        logger.debug("torch.export failed", exc_info=True)
        raise ModelError(f"torch.export failed: {first_line(e)}") from None
    path.write_bytes(buffer.getvalue())
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
        # The compile folder inside the export's staging folder: removed with it, however the export ends.
        scratch = tempfile.TemporaryDirectory(dir=_compile_home(path.parent), prefix=".aoti-")
        with quiet_exporter(), torch.no_grad(), patched, scratch as tmp:
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
            with aoti_constants(package, device) as constants:  # as the aoti backend reads them at open
                meta[META_FILE_WEIGHTS_SHA256] = file_weights_sha256(constants)
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
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # a full disk: the caller names the file
        if "No space left on device" in str(e):
            raise InputError(f"cannot write {path.name}: No space left on device (compiling it)") from None
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


def _has_space(path: Path) -> bool:
    return any(c.isspace() for c in str(path.resolve()))


def _compile_home(stage: Path) -> Path:
    """Where AOTInductor compiles: in the staging folder, else (its path holds whitespace) in the
    scratch space :func:`scratch_space_in` chose, which then has none."""
    home = stage if not _has_space(stage) else Path(tempfile.gettempdir())
    if _has_space(home):
        raise InputError(
            f"AOTInductor cannot compile under {home}: torch's compiler command breaks on paths with "
            "spaces; export --aoti into a folder whose path has none, or set TMPDIR to one"
        )
    return home


@contextlib.contextmanager
def scratch_space_in(folder: Path) -> Iterator[Path]:
    """Point temporary files (Python's tempfile, a compiler's via TMPDIR) into ``folder/.tmp``
    for the duration: the quantizer's and AOTInductor's scratch files go with the staging
    folder, even when the export is killed. Restored after."""
    # Absolute: a compiler runs in other working directories. torch's C++ build command is split on
    # whitespace (g++: "input file '/tmp/wö' is the same as output file" for "/tmp/wö d"), so under
    # such a folder the scratch space is a fresh folder in the system's temp folder, removed after.
    scratch = folder.absolute() / ".tmp"
    if _has_space(folder):
        scratch = Path(tempfile.mkdtemp(prefix="gantool-export-"))
    scratch.mkdir(exist_ok=True)
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(scratch), str(scratch)
    try:
        yield scratch
    finally:
        if scratch.parent != folder.absolute():
            shutil.rmtree(scratch, ignore_errors=True)
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


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

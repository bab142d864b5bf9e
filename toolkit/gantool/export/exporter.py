"""Export a trained generator to ONNX, torch.export (.pt2), AOTInductor and TorchScript (legacy),
with parity proven at export: the orchestration and the metadata.

What is exported: the generator in eval mode with BatchNorm folded into the
convolutions, the composite inside the graph. Inputs ``image`` (N x 3 x H x W)
and ``mask`` (N x 1 x H x W, 1 = hole), output ``inpainted``; N, H and W are
dynamic (H and W multiples of 4). Every file carries the same metadata
(:func:`build_metadata`), among it the export id, which
:func:`gantool.core.artifacts.check_export_folder` compares. The formats are written by
:mod:`gantool.export.formats` and checked by :mod:`gantool.export.verify`.

The files carry no trace of the machine that exported them (see
:mod:`gantool.export.provenance`): the ONNX exporter's per-node stack traces and other
annotations and TorchScript's ``.debug_pkl`` source records are stripped unless
``keep_debug_info=True``, and the export time lives only in the report, so the
same checkpoint exported twice gives byte-identical ONNX files.

One export, one folder: the files are written into a hidden sibling staging folder
(compiler scratch space included) and put in place together only after every format
exported and (unless ``verify=False``) passed the parity sweep
(:func:`gantool.core.fileio.commit_staged_folder`). A failed or interrupted export
leaves the old export and nothing new; a killed one leaves the old export or the new
one, whole. ``overwrite`` replaces only files that gantool wrote.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gantool import __version__
from gantool.core.artifacts import (
    ALWAYS_WRITTEN,
    ARTIFACT,
    CHECKPOINT_TRAIN_KEYS,
    DEFAULT_EXPORT_FORMATS,
    EXPORT_FORMATS,
    KIND_CHECKPOINT,
    META_AOTI_DEVICE,
    META_EXPORT_ID,
    META_MODEL_CONFIG,
    META_PRECISION,
    META_PREFER,
    META_PROCESSING,
    META_SOURCE,
    META_TORCH_VERSION,
    META_TRAIN_PHASE,
    META_TRAIN_STEP,
    META_VERSION,
    META_WEIGHTS_SHA256,
    config_from_metadata,
    decode_metadata,
    export_files,
    gantool_metadata,
    model_kind,
    read_model_metadata,
)
from gantool.core.config import ModelConfig
from gantool.core.constants import (
    CHECKPOINTS_DIR,
    DEFAULT_FP32_ATOL,
    DEFAULT_INT8_MIN_PSNR,
    DEFAULT_PREFER,
    IMPORTED_PHASE,
    RUN_EXPORT_DIR,
)
from gantool.core.errors import CheckpointError, GantoolError, InputError, ModelError, StopRequested
from gantool.core.fileio import (
    atomic_write_text,
    commit_staged_folder,
    finish_interrupted_commit,
    staged_folder,
)
from gantool.core.finite import non_finite_weights
from gantool.core.processing import processing_contract
from gantool.core.run_checkpoints import newest_checkpoint
from gantool.export.formats import (
    HalfPrecisionGenerator,
    aoti_target,
    example_inputs,
    export_aoti,
    export_onnx,
    export_pt2,
    export_torchscript,
    scratch_space_in,
)
from gantool.export.parity import (
    ParityCase,
    check_prefer,
    cuda_worth_trying,
    failures,
    float64_backend,
    fp32_tolerance,
    mark_advisory,
    report_to_json,
)
from gantool.export.provenance import find_machine_traces, redact_paths
from gantool.export.quantize import calibration_batch, check_calib_folder, quantize_int8
from gantool.export.verify import MIN_BF16_PSNR as MIN_BF16_PSNR  # re-exported for the benchmarks
from gantool.export.verify import MIN_FP16_PSNR as MIN_FP16_PSNR
from gantool.export.verify import verify_exports
from gantool.nn.networks import fold_batchnorm
from gantool.runtime.weights import file_non_finite_weights
from gantool.training.checkpoint import (
    generator_from_checkpoint,
    load_checkpoint,
    load_weights_state,
    model_config_of,
    save_generator_weights,
    weights_file,
    weights_sha256,
)

logger = logging.getLogger(__name__)


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
    """The newest of the runs' newest checkpoints (``<root>/*/checkpoints/last.pt``, else a run's
    highest ``step_N.pt``) by modification time."""
    found = (newest_checkpoint(folder / CHECKPOINTS_DIR)[0] for folder in Path(root).glob("*"))
    candidates = [p for p in found if p is not None]
    if not candidates:
        raise CheckpointError(
            f"no checkpoint found under {root}/*/checkpoints (last.pt or step_N.pt); pass one explicitly"
        )
    return max(candidates, key=lambda p: p.stat().st_mtime)


def default_output_dir(checkpoint: str | Path) -> Path:
    """``<run>/export`` for ``<run>/checkpoints/x.pt``, else ``export`` beside the file."""
    folder = Path(checkpoint).resolve().parent
    return (folder.parent if folder.name == CHECKPOINTS_DIR else folder) / RUN_EXPORT_DIR


# --------------------------------------------------------------------------- metadata


def export_id(weights_digest: str, options: dict[str, Any]) -> str:
    """The id every file of one export carries: a hash of the weights, the export's options
    and the versions. Deterministic, so exporting the same checkpoint the same way twice gives
    the same id (and byte-identical files); any other export, another id."""
    text = json.dumps({"weights": weights_digest, "options": options, "gantool": __version__,
                       "torch": torch.__version__}, sort_keys=True)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def build_metadata(
    state: dict[str, Any], source: str = "", precision: str = "fp32", options: dict[str, Any] | None = None
) -> dict[str, str]:
    """The metadata contract shared by every exported file (string keys and values).

    Deterministic on purpose (no export time, no paths): equal checkpoints give equal files.
    ``options``: what the export was asked for (formats, opset, ...), part of the export id.
    """
    config = model_config_of(state)
    digest = weights_sha256(state["generator"])
    return {
        META_VERSION: __version__,
        META_MODEL_CONFIG: json.dumps(config.to_dict()),
        META_PROCESSING: json.dumps(processing_contract(config)),
        META_TRAIN_STEP: str(int(state.get("step", 0))),
        META_TRAIN_PHASE: str(state.get("phase", "")),
        META_WEIGHTS_SHA256: digest,
        META_EXPORT_ID: export_id(digest, options or {}),
        META_PRECISION: precision,
        META_SOURCE: source,
        META_TORCH_VERSION: torch.__version__,
    }


def check_options(
    formats: Sequence[str], opset: int | None, fp16: bool, atol: float | None, int8: bool = False
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
    if atol is not None and not atol > 0:
        raise InputError(f"--atol must be positive, got {atol}")
    return formats


def _max_opset() -> int:
    import onnx

    return onnx.defs.onnx_opset_version()


# long: the export's steps in order (check, stage, write each format, verify, commit); each step is a call, and their order is the contract
def export_generator(
    checkpoint_path: str | Path,
    out_dir: str | Path | None = None,
    formats: Sequence[str] = DEFAULT_EXPORT_FORMATS,
    opset: int | None = None,
    fp16: bool = False,
    verify: bool = True,
    atol: float | None = None,
    overwrite: bool = False,
    cuda: bool | None = None,
    cases: Sequence[ParityCase] | None = None,
    keep_debug_info: bool = False,
    int8: bool = False,
    calib: str | Path | None = None,
    int8_min_psnr: float = DEFAULT_INT8_MIN_PSNR,
    aoti_device: str | None = None,
    prefer: str = DEFAULT_PREFER,
    stop_requested: Callable[[], bool] | None = None,
) -> ExportResult:
    """Export the generator of ``checkpoint_path`` and prove parity with eager PyTorch.

    ``checkpoint_path`` is a checkpoint, exported ``generator.safetensors``, or a folder
    holding one (a run, an import or an export: :data:`~gantool.training.checkpoint.WEIGHTS_IN_FOLDER`).

    ``cuda=None`` checks ONNX Runtime's CUDA provider too when a GPU is plausibly
    there; ``cases`` overrides the parity sweep (default :func:`default_cases`).
    ``int8`` also writes the int8 ONNX model, calibrated on ``calib`` (a folder)
    or the run's validation images, if it passes ``int8_min_psnr`` (else
    QuantizationError). ``aoti_device`` ("cpu"/"cuda") defaults to :func:`aoti_target`.
    Raises ParityError (a ModelError) when a backend fails; nothing is written then.
    The files carry no absolute path or stack trace of this machine (checked with
    :func:`gantool.export.provenance.find_machine_traces`) unless ``keep_debug_info``.
    ``stop_requested`` (the CLI's "a stop signal arrived") is asked after writing and before the
    commit: if true, StopRequested is raised and the earlier export stays.
    """
    formats = check_options(formats, opset, fp16, atol, int8)
    # No --atol: DEFAULT_FP32_ATOL, widened where the model's own fp32 error calls for it; a given one is fixed.
    widen, bound = atol is None, DEFAULT_FP32_ATOL if atol is None else atol
    prefer = check_prefer(prefer, int8, verify)  # what --precision auto runs (written only if its gate passes)
    if calib is not None and not int8:
        raise InputError("--calib applies only to --int8 export")
    if calib is not None:
        check_calib_folder(calib)  # before minutes of export, not after them
    if not int8_min_psnr > 0:
        raise InputError(f"--int8-min-psnr must be positive, got {int8_min_psnr}")
    if aoti_device not in (None, "cpu", "cuda"):
        raise InputError(f"the AOTInductor device must be cpu or cuda, got {aoti_device!r}")
    if aoti_device == "cuda" and not torch.cuda.is_available():
        raise InputError("cannot compile AOTInductor for cuda: torch finds no CUDA device")
    if cuda is True and verify and not cuda_worth_trying():  # before the export, not after it
        raise InputError("--cuda: no CUDA device found, so the CUDA parity check cannot run (drop --cuda)")
    checkpoint_path = Path(checkpoint_path)
    if checkpoint_path.is_dir():  # a run, import or export folder: its weights file
        checkpoint_path = weights_file(checkpoint_path, "export")
    state = load_weights_state(checkpoint_path)  # a checkpoint, or exported weights (the generator alone)
    generator = generator_from_checkpoint(state)
    bad = non_finite_weights(state["generator"])
    if bad:
        raise ModelError(f"{checkpoint_path} has non-finite weights ({bad}); nothing exported")
    out_dir = Path(out_dir) if out_dir is not None else default_output_dir(checkpoint_path)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"output path exists and is not a folder: {out_dir}")
    keys = [*formats, *(["onnx_fp16"] if fp16 else []), *(["onnx_int8"] if int8 else []), *ALWAYS_WRITTEN]
    targets = {key: out_dir / ARTIFACT[key].filename for key in keys}
    if checkpoint_path.resolve() in {target.resolve() for target in targets.values()}:
        raise InputError(f"refusing to export into {out_dir}: it would replace the input {checkpoint_path}")
    if out_dir.is_dir():
        finish_interrupted_commit(out_dir)  # an export killed mid-commit: complete it first
    replaced = check_replaceable(out_dir, overwrite)

    options = {"formats": sorted(keys), "opset": opset, "keep_debug_info": keep_debug_info,
               "calib": Path(calib).name if calib is not None else None, "aoti_device": aoti_device}  # fmt: skip
    metadata = {**build_metadata(state, source=checkpoint_path.name, options=options), META_PREFER: prefer}
    folded = fold_batchnorm(generator)
    example = example_inputs(generator.config.size)
    with torch.no_grad():
        expected = generator(*example).numpy()
        fold_error = float(abs(folded(*example).numpy() - expected).max())
    exact = float64_backend(generator) if widen else None
    tolerance = fp32_tolerance(bound, expected, exact(*(t.numpy() for t in example)) if exact else None)
    if not fold_error <= tolerance:
        raise ModelError(f"folding BatchNorm changed the output by {fold_error:.3g} (> {tolerance:.3g})")

    with staged_folder(out_dir) as stage:
        written = _write_formats(
            stage, out_dir, keys, state, generator, folded, example, metadata,
            opset=opset, keep_debug_info=keep_debug_info, calib=calib, int8_min_psnr=int8_min_psnr,
            cases=cases, aoti_device=aoti_device, stop_requested=stop_requested,
        )  # fmt: skip
        _check_stop(stop_requested)
        tmp = {key: stage / ARTIFACT[key].filename for key in keys}
        report: dict[str, Any] | None = None
        notes: list[str] = []
        if verify:
            built_for = written.metadata_of.get("aoti", {}).get(META_AOTI_DEVICE, "cpu")
            report, notes = verify_exports(
                generator, folded, tmp, bound, cuda, cases, int8_min_psnr, built_for, exact=exact
            )
            notes += mark_advisory(report, () if prefer == "bf16" else ("bf16",))  # no bf16 file is written
            if not report["passed"]:
                problems = failures(report)
                raise ParityError(f"parity check failed: {problems[0]}", report)
        notes = [*written.notes, *notes]
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
            "export_seconds": written.seconds,
            "verified": verify,
            "parity": report,
            "notes": notes,
        }
        with _naming_target(stage, out_dir, ARTIFACT["report"].filename):
            atomic_write_text(tmp["report"], json.dumps(report_to_json(document), indent=2) + "\n")
        if not keep_debug_info:
            _check_no_machine_traces(tmp, targets)
        _check_stop(stop_requested)
        # The new files go in together; files of the older export that this one does not write go.
        commit_staged_folder(stage, out_dir, remove=[p.name for p in replaced])
    for stale in replaced:
        if stale.name not in {p.name for p in targets.values()}:
            logger.info("removed %s: it belonged to the previous export in %s", stale.name, out_dir)
    return ExportResult(checkpoint_path, out_dir, targets, sizes, metadata, report, notes)


def _check_stop(stop_requested: Callable[[], bool] | None) -> None:
    # A signal's KeyboardInterrupt can be swallowed inside the exporters; what the handler noted is not.
    if stop_requested is not None and stop_requested():
        raise StopRequested("a stop signal arrived during the export; nothing was committed")


def check_replaceable(out_dir: Path, overwrite: bool) -> list[Path]:
    """The files of an earlier export in ``out_dir`` that a new export replaces or removes.

    Refuses (one line) without ``overwrite``, and always for a file of the export table
    that gantool did not write (no gantool metadata) or that cannot be read: only files
    gantool wrote are ever deleted.
    """
    existing = sorted(export_files(out_dir).values()) if out_dir.is_dir() else []
    if existing and not overwrite:
        raise InputError(f"refusing to overwrite {', '.join(map(str, existing))} (use --overwrite)")
    for path in existing:
        try:
            meta = gantool_metadata(path)
        except GantoolError as e:
            raise InputError(
                f"refusing to replace {path}: it cannot be read, so nothing shows that gantool wrote it ({e}); "
                "move it away or export into another folder"
            ) from None
        if meta is None or META_VERSION not in meta:
            raise InputError(
                f"refusing to replace {path}: it carries no gantool metadata, so gantool did not write it; "
                "move it away or export into another folder"
            )
    return existing


@dataclass
class _Written:
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    metadata_of: dict[str, dict[str, str]] = field(default_factory=dict)


@contextlib.contextmanager
def _naming_target(stage: Path, out_dir: Path, name: str) -> Iterator[None]:
    """Errors while writing ``name`` name the file in ``out_dir`` (the one the user asked for),
    not its staged copy; an OSError (a full disk) is one line naming that file."""
    try:
        yield
    except OSError as e:
        raise InputError(f"cannot write {out_dir / name}: {e.strerror or e}") from None
    except GantoolError as e:
        e.args = (str(e).replace(str(stage), str(out_dir)),)
        raise


def _write_formats(
    stage: Path, out_dir: Path, keys: list[str], state: dict[str, Any], generator: Any, folded: Any,
    example: tuple[torch.Tensor, torch.Tensor], metadata: dict[str, str], *, opset: int | None,
    keep_debug_info: bool, calib: str | Path | None, int8_min_psnr: float, cases: Sequence[ParityCase] | None,
    aoti_device: str | None, stop_requested: Callable[[], bool] | None = None,
) -> _Written:  # fmt: skip
    """Write every format of ``keys`` into ``stage`` (the report aside), asking ``stop_requested``
    before each one."""
    done = _Written()
    tmp = {key: stage / ARTIFACT[key].filename for key in keys}
    if "aoti" in keys:
        # Imported before the scratch space: inductor fixes its precompiled-header folder from the temp
        # folder at import, and that must not point into this (soon removed) staging folder.
        import torch._inductor.codecache  # noqa: F401
    with scratch_space_in(stage):
        _write_each(done, tmp, stage, out_dir, state, generator, folded, example, metadata, opset,
                    keep_debug_info, calib, int8_min_psnr, cases, aoti_device, stop_requested)  # fmt: skip
    return done


def _write_each(
    done: _Written, tmp: dict[str, Path], stage: Path, out_dir: Path, state: dict[str, Any], generator: Any,
    folded: Any, example: tuple[torch.Tensor, torch.Tensor], metadata: dict[str, str], opset: int | None,
    keep_debug_info: bool, calib: str | Path | None, int8_min_psnr: float, cases: Sequence[ParityCase] | None,
    aoti_device: str | None, stop_requested: Callable[[], bool] | None,
) -> None:  # fmt: skip
    for key in ("onnx", "onnx_fp16", "onnx_int8", "pt2", "aoti", "torchscript", "safetensors"):
        if key not in tmp:
            continue
        _check_stop(stop_requested)  # a stop whose interrupt was swallowed: not the next minute of compiling
        logger.info("exporting %s", ARTIFACT[key].filename)
        start = time.perf_counter()
        with _naming_target(stage, out_dir, ARTIFACT[key].filename):
            if key == "onnx":
                export_onnx(folded, example, tmp[key], metadata, opset, keep_debug_info)
            elif key == "onnx_fp16":
                half = HalfPrecisionGenerator(folded).eval()
                fp16_metadata = {**metadata, META_PRECISION: ARTIFACT[key].precision or "fp16"}
                export_onnx(half, example, tmp[key], fp16_metadata, opset, keep_debug_info)
            elif key == "onnx_int8":
                calibration = calibration_batch(state, generator.config, calib)
                logger.info("int8 calibration: %s", calibration.source)
                int8_result = quantize_int8(
                    tmp["onnx"], tmp[key], metadata, calibration, generator.config, int8_min_psnr, cases
                )
                floats = (
                    f"{', '.join(int8_result.float_nodes)} ({int8_result.float_macs:.0%} of the multiply-adds)"
                    if int8_result.float_nodes
                    else "none (every convolution is int8)"
                )
                done.notes.append(
                    f"int8: calibrated on {calibration.kept}; worst hole PSNR against fp32 "
                    f"{int8_result.hole_psnr:.1f} dB (gate {int8_min_psnr:g} dB); convolutions left in float: {floats}"
                )
            elif key == "pt2":
                export_pt2(folded, example, tmp[key], metadata, keep_debug_info)
            elif key == "aoti":
                device = aoti_target() if aoti_device is None else aoti_device
                done.metadata_of[key] = export_aoti(folded, example, tmp[key], metadata, device, keep_debug_info)
                done.notes.append(f"aoti: compiled for {device} with torch {torch.__version__}; it runs only there")
            elif key == "torchscript":
                archive_name = ARTIFACT[key].filename.removesuffix(".pt")
                export_torchscript(folded, example, tmp[key], metadata, keep_debug_info, archive_name)
            else:
                save_generator_weights(tmp[key], generator, metadata)
        done.seconds[key] = round(time.perf_counter() - start, 2)


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
        bad = file_non_finite_weights(path, kind)
        traces = find_machine_traces(path)  # absolute paths or stack traces it would leak
        imported = meta.get(META_TRAIN_PHASE) == IMPORTED_PHASE
        return {
            "file": str(path),
            "kind": kind,
            "bytes": path.stat().st_size,
            "precision": meta.get(META_PRECISION, "fp32"),  # what runs by default (--precision bf16 aside)
            "architecture": config_from_metadata(meta, path).architecture(imported)
            if META_MODEL_CONFIG in meta
            else None,
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
        "architecture": ModelConfig.from_dict(state["model_config"]).architecture(state["phase"] == IMPORTED_PHASE),
        "imported_from": state.get("imported_from"),
        "train_config": {k: train[k] for k in CHECKPOINT_TRAIN_KEYS if k in train},
        "metrics": state.get("metrics") or {},
        "weights_sha256": weights_sha256(state["generator"]),
        "warnings": [f"non-finite generator weights: {bad}"] if bad else [],
    }

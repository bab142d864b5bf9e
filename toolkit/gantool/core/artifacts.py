"""What an export folder holds, what each file is, and the metadata every file carries.

This module owns three facts that the exporter, the loader and ``gantool info``
all read:

- :data:`ARTIFACTS`: one row per file ``gantool export`` can write (file name,
  kind, precision, which backend opens it). The exporter writes from this
  table and :func:`resolve_model` finds a model in a folder from it; a new
  format is a new row, not a new branch.
- the ``gantool.*`` metadata keys (``META_*``), and :func:`read_model_metadata`;
- :func:`model_kind`: the one test of what a file is (ONNX, TorchScript,
  safetensors weights or a training checkpoint).
"""

from __future__ import annotations

import json
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gantool.core.config import ModelConfig
from gantool.core.constants import BACKEND_CHOICES, BACKENDS, CHECKPOINTS_DIR, LAST_CHECKPOINT, RUN_EXPORT_DIR
from gantool.core.errors import InputError, ModelError, check_choice, first_line
from gantool.core.fileio import finish_interrupted_commit
from gantool.core.run_checkpoints import newest_checkpoint

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- metadata keys

META_PREFIX = "gantool."
META_VERSION = "gantool.version"
META_MODEL_CONFIG = "gantool.model_config"  # JSON of ModelConfig
META_PROCESSING = "gantool.processing"  # JSON of the processing contract
META_TRAIN_STEP = "gantool.train_step"
META_TRAIN_PHASE = "gantool.train_phase"
META_WEIGHTS_SHA256 = "gantool.weights_sha256"  # of the unfolded generator weights
# A model file's own weights as that file holds them (ONNX initializers, int8 ones included; a
# .pt2's or TorchScript's folded tensors; an AOTInductor library's constants), checked when it
# opens: a file whose recorded ids were edited to match a folder cannot pass off other weights.
META_FILE_WEIGHTS_SHA256 = "gantool.file_weights_sha256"
# The same in every file of one export (and only there): a hash of the weights and the export's
# options, so files of two exports never pass as one model, and a re-export is byte-identical.
META_EXPORT_ID = "gantool.export_id"
META_PRECISION = "gantool.precision"
META_SOURCE = "gantool.source"  # the checkpoint's file name
META_TORCH_VERSION = "gantool.torch_version"
# TorchScript keeps metadata as an extra file inside its archive.
TORCHSCRIPT_METADATA_ENTRY = "gantool_metadata.json"
# torch.export (.pt2) archives and AOTInductor packages carry the same JSON entry
# (``<archive>/extra/gantool_metadata.json``), readable without loading the model.
PT2_METADATA_ENTRY = TORCHSCRIPT_METADATA_ENTRY
# What an AOTInductor package was compiled for: a package only runs there.
META_AOTI_DEVICE = "gantool.aoti_device"  # "cpu" or "cuda"
META_AOTI_CUDA_ARCH = "gantool.aoti_cuda_arch"  # e.g. "sm_90" (CUDA packages only)
META_AOTI_CPU_FLAGS = "gantool.aoti_cpu_flags"  # the compiling CPU's ISA extensions (CPU packages)
META_COMPILE_FLAGS = "gantool.compile_flags"  # JSON of the inductor configs used
# int8 ONNX: the nodes left in float and what calibrated the quantization.
META_FLOAT_NODES = "gantool.float_nodes"  # JSON list of node names
META_CALIBRATION = "gantool.calibration"
# The precision `--precision auto` runs (gantool export --prefer; its gate passed at export).
META_PREFER = "gantool.prefer"

# ----------------------------------------------------------------------------- the table

# What a file is (model_kind): the loader's first question.
KIND_ONNX, KIND_TORCHSCRIPT, KIND_SAFETENSORS, KIND_CHECKPOINT, KIND_REPORT = (
    "onnx",
    "torchscript",
    "safetensors",
    "checkpoint",
    "report",
)
KIND_PT2, KIND_AOTI = "pt2", "aoti"  # a torch.export ExportedProgram; an AOTInductor package


@dataclass(frozen=True)
class Artifact:
    """One file an export can hold."""

    key: str  # the name used in reports and ExportResult.paths
    filename: str
    kind: str  # a KIND_* value
    precision: str | None  # fp32 / fp16 / int8; None for non-model files
    backend: str | None  # the backend that opens it; None for non-model files
    options: frozenset[str] = frozenset()  # `gantool export` options that apply to this format


ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("onnx", "generator.onnx", KIND_ONNX, "fp32", "onnx", frozenset({"opset", "fp16", "int8"})),
    Artifact("onnx_fp16", "generator_fp16.onnx", KIND_ONNX, "fp16", "onnx", frozenset({"opset"})),
    Artifact("onnx_int8", "generator_int8.onnx", KIND_ONNX, "int8", "onnx", frozenset({"opset"})),
    Artifact("pt2", "generator.pt2", KIND_PT2, "fp32", "pt2"),
    Artifact("aoti", "generator.aoti.pt2", KIND_AOTI, "fp32", "aoti"),
    Artifact("torchscript", "generator.torchscript.pt", KIND_TORCHSCRIPT, "fp32", "torchscript"),
    Artifact("safetensors", "generator.safetensors", KIND_SAFETENSORS, "fp32", "eager"),
    Artifact("report", "export_report.json", KIND_REPORT, None, None),
)
ARTIFACT = {a.key: a for a in ARTIFACTS}
TABLE_NAMES = frozenset(a.filename for a in ARTIFACTS)
# Formats a user picks with `gantool export --onnx/--torchscript/--pt2/--aoti` (aoti implies pt2);
# the others follow from options (fp16 with --fp16, int8 with --int8) or are always written (the
# safetensors weights and the report). Without a choice, DEFAULT_EXPORT_FORMATS.
EXPORT_FORMATS = ("onnx", "torchscript", "pt2", "aoti")
DEFAULT_EXPORT_FORMATS = ("onnx", "torchscript")
ALWAYS_WRITTEN = ("safetensors", "report")
# Inside a run folder, the newest checkpoint is the eager model.
RUN_CHECKPOINT = Path(CHECKPOINTS_DIR) / LAST_CHECKPOINT


# Backends that open another backend's files: OpenVINO reads the ONNX exports as they are.
FILES_OF_BACKEND = {"openvino": "onnx"}


def model_artifacts(backend: str, precision: str = "fp32") -> list[Artifact]:
    """The files ``backend`` can open at ``precision``, in the table's order."""
    backend = FILES_OF_BACKEND.get(backend, backend)
    return [a for a in ARTIFACTS if a.backend == backend and a.precision == precision]


def export_files(folder: str | Path) -> dict[str, Path]:
    """The table's files present in ``folder``: key -> path."""
    folder = Path(folder)
    return {a.key: folder / a.filename for a in ARTIFACTS if (folder / a.filename).is_file()}


def gantool_metadata(path: str | Path) -> dict[str, str] | None:
    """The gantool metadata of a table file (a report's is its ``metadata`` entry); None when
    the file carries none. Raises ModelError when the file cannot be read."""
    path = Path(path)
    if model_kind(path) == KIND_REPORT:
        try:
            meta = json.loads(path.read_text(encoding="utf-8")).get("metadata")
        except (OSError, ValueError, AttributeError) as e:
            raise ModelError(f"{path} is not a readable export report ({first_line(e)})") from None
        ok = isinstance(meta, dict) and any(str(k).startswith(META_PREFIX) for k in meta)
        return {str(k): str(v) for k, v in meta.items()} if ok else None
    try:
        return read_model_metadata(path)
    except ModelError as e:
        if "carries no gantool metadata" in str(e):
            return None
        raise


def check_export_folder(folder: str | Path) -> None:
    """Refuse a folder that does not hold exactly one export.

    A commit that a killed export left half done is completed first. Every file a
    gantool export writes carries its ``gantool.export_id`` (older exports: the same
    ``gantool.weights_sha256``); in a folder of an export (a report, or more than one
    model file), a model file without gantool metadata or with another export's id is
    refused by name. An unreadable file is reported when it is opened.
    """
    folder = Path(folder)
    finish_interrupted_commit(folder)
    files = export_files(folder)
    exported = "report" in files or sum(ARTIFACT[key].backend is not None for key in files) > 1
    ids: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for key, path in files.items():
        try:
            meta = gantool_metadata(path)
        except ModelError:
            continue
        recorded, role = (meta or {}).get(META_PRECISION), ARTIFACT[key].precision
        if recorded and role and recorded != role:  # a renamed file: the name would run it as another precision
            holder = next(
                (a.filename for a in ARTIFACTS if a.kind == ARTIFACT[key].kind and a.precision == recorded), None
            )
            back = f"; its own name is {holder}" if holder else ""
            raise ModelError(f"{path} records precision {recorded}, but {path.name} is the {role} model's name{back}")
        if meta is None:
            if exported:
                raise ModelError(
                    f"{path} carries no gantool metadata, so it is not part of the export in {folder}; "
                    "move it away, or re-export into the folder with --overwrite"
                )
            continue
        if meta.get(META_EXPORT_ID):
            ids[path.name] = meta[META_EXPORT_ID]
        if meta.get(META_WEIGHTS_SHA256):
            hashes[path.name] = meta[META_WEIGHTS_SHA256]
    for what, found in (("export ids", ids), ("weights hashes", hashes)):
        if len(set(found.values())) > 1:
            listing = ", ".join(f"{name} ({digest[:12]})" for name, digest in sorted(found.items()))
            raise ModelError(
                f"{folder} mixes files of different exports ({what} differ: {listing}); "
                "re-export into it with --overwrite or into an empty folder"
            )


# ----------------------------------------------------------------------------- what a file is


ZIP_MAGIC = b"PK\x03\x04"


def _zip_names(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return []


def check_zip_archive(path: str | Path) -> None:
    """Refuse a zip archive (TorchScript, .pt2, checkpoint) that lost its end, in plain words."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return  # the loader reports it
    if head == ZIP_MAGIC and not _zip_names(path):
        raise ModelError(
            f"{path} is truncated or damaged (its zip archive has no end record: an interrupted copy, "
            "download or write?); copy or export it again"
        )


def model_kind(path: str | Path) -> str:
    """What ``path`` is: a KIND_* value, judged by its name and, for ``.pt``/``.pt2``, its content.

    TorchScript archives carry compiled code (``*/code/`` entries); ``torch.save``
    checkpoints do not. AOTInductor packages carry ``*/data/aotinductor/`` entries;
    torch.export archives do not. Raises ModelError for anything else.
    """
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".pt2"):
        return KIND_AOTI if any("/aotinductor/" in n for n in _zip_names(path)) else KIND_PT2
    if name.endswith(".onnx"):
        return KIND_ONNX
    if name.endswith(".safetensors"):
        return KIND_SAFETENSORS
    if name.endswith(".json"):
        return KIND_REPORT
    if name.endswith((".pt", ".pth")):
        check_zip_archive(path)
        names = _zip_names(path)
        if any("/code/" in n or n.endswith(f"/extra/{TORCHSCRIPT_METADATA_ENTRY}") for n in names):
            return KIND_TORCHSCRIPT
        return KIND_CHECKPOINT
    raise ModelError(f"{path}: unknown model type (expected .onnx, .pt, .pt2 or .safetensors)")


BACKEND_OF_KIND = {
    KIND_ONNX: "onnx",
    KIND_TORCHSCRIPT: "torchscript",
    KIND_SAFETENSORS: "eager",
    KIND_CHECKPOINT: "eager",
    KIND_PT2: "pt2",
    KIND_AOTI: "aoti",
}


# ----------------------------------------------------------------------------- finding a model

# Where the shipped model lives: models/ at the repository root (next to
# toolkit/), or packaged inside gantool/models/.
DEFAULT_MODEL_DIRS = (
    Path(__file__).resolve().parents[3] / "models",
    Path(__file__).resolve().parents[1] / "models",
)
NO_MODEL_HELP = (
    "no model given and none shipped in models/: train one with `gantool train --out runs/<run> ...`, "
    "export it with `gantool export runs/<run>/checkpoints/last.pt`, then pass --model runs/<run>/export"
)


def default_model_dir() -> Path | None:
    """The folder of the model shipped with gantool, or None while there is none."""
    for folder in DEFAULT_MODEL_DIRS:
        if any((folder / a.filename).is_file() for a in ARTIFACTS if a.backend is not None):
            return folder
    return None


def _folder_candidates(folder: Path, backend: str, precision: str = "fp32") -> list[Path]:
    # A precision of its own (the int8 or fp16 ONNX model) is looked for first, then the fp32 file.
    wanted = [*(model_artifacts(backend, precision) if precision != "fp32" else []), *model_artifacts(backend)]
    names = [sub / a.filename for sub in (folder, folder / RUN_EXPORT_DIR) for a in wanted]
    if backend == "eager":  # a run folder: the latest training checkpoint
        names.append(run_checkpoint(folder))
    return names


def run_checkpoint(run: Path) -> Path:
    """A run folder's newest checkpoint: ``checkpoints/last.pt``, else its highest ``step_N.pt``
    (``checkpoints/last.pt`` when it has neither)."""
    newest, _ = newest_checkpoint(run / CHECKPOINTS_DIR)
    return newest if newest is not None else run / RUN_CHECKPOINT


def resolve_model(model: str | Path | None, backend: str = "auto", precision: str = "fp32") -> tuple[Path, str]:
    """Find the model file for ``backend`` and the backend to use.

    ``model`` may be a model file, an export folder, a run folder (its export,
    else its newest checkpoint), or None for the shipped model. ``backend="auto"``
    picks from the file, and in a folder takes the first of :data:`BACKENDS`
    that has a file (for ``precision`` fp16 or int8, that precision's file first).
    A model file of an export folder is opened only if the folder holds one export
    (:func:`check_export_folder`).
    """
    check_choice("backend", backend, BACKEND_CHOICES)
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
            for candidate in _folder_candidates(path, name, precision):
                if candidate.is_file():
                    check_export_folder(candidate.parent)
                    if candidate.parent.name == RUN_EXPORT_DIR:
                        warn_if_older_than_checkpoint(candidate, run_checkpoint(candidate.parent.parent))
                    return candidate, name
        expected = " or ".join(
            dict.fromkeys(
                c.name
                for name in wanted
                for c in _folder_candidates(path, name, precision)
                if c.parent.name != CHECKPOINTS_DIR  # a run's checkpoint is not what an export writes
            )
        )
        others = sorted(
            {c.name for name in BACKENDS for c in _folder_candidates(path, name, "int8") + _folder_candidates(path, name, "fp16")
             if c.is_file() and c.parent.name != CHECKPOINTS_DIR}
        )  # fmt: skip
        held = f"; it holds {', '.join(others)} (ask for it with --precision or --backend)" if others else ""
        raise ModelError(f"no model in {path}: expected {expected} (from `gantool export`){held}")
    if not path.is_file():
        raise InputError(f"not a regular file: {path}")
    if path.name in TABLE_NAMES:
        check_export_folder(path.parent)
    detected = BACKEND_OF_KIND.get(model_kind(path))
    if detected is None:
        raise ModelError(f"{path} is not a model file")
    if backend == "auto" or backend == detected:
        return path, detected
    if FILES_OF_BACKEND.get(backend) == detected:
        return path, backend
    if backend == "eager" and detected == "torchscript":
        raise ModelError(f"{path} is a TorchScript model: use --backend torchscript")
    raise ModelError(f"{path} is not a model for the {backend} backend (it is one for {detected})")


_warned_older: set[tuple[str, str]] = set()


def warn_if_older_than_checkpoint(model: Path, checkpoint: Path) -> None:
    """Warn (once per export folder and checkpoint, whichever of its files is opened) when a run's
    export comes from an earlier step than its newest checkpoint."""
    key = (str(model.parent.resolve()), str(checkpoint.resolve()))
    if key in _warned_older or not checkpoint.is_file():
        return
    try:
        if checkpoint.stat().st_mtime <= model.stat().st_mtime:
            return  # the fast path: the checkpoint was not written after the export
        exported = int(read_model_metadata(model).get(META_TRAIN_STEP, ""))
        import torch  # delayed: only when the checkpoint is newer; mmap reads just the step

        step = int(torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:  # unreadable either way: opening the model reports what matters
        return
    _warned_older.add(key)
    if step != exported:
        log.warning(
            "%s is from training step %d, but %s is at step %d: re-export it "
            "(`gantool export %s --overwrite`) or pass --model %s",
            model.parent, exported, checkpoint, step, checkpoint, checkpoint,
        )  # fmt: skip


# ----------------------------------------------------------------------------- reading metadata


def read_model_metadata(path: str | Path) -> dict[str, str]:
    """The gantool metadata of a .onnx, TorchScript (.pt), .pt2 (torch.export or AOTInductor) or .safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    kind = model_kind(path)
    if kind == KIND_ONNX:
        meta = _onnx_metadata(path)
    elif kind == KIND_SAFETENSORS:
        meta = _safetensors_metadata(path)
    elif kind == KIND_TORCHSCRIPT:
        meta = _torchscript_metadata(path)
    elif kind in (KIND_PT2, KIND_AOTI):
        meta = _zip_entry_metadata(path, PT2_METADATA_ENTRY, "gantool .pt2 export")
    else:
        raise ModelError(f"{path} is not an ONNX, TorchScript, .pt2 or safetensors model")
    if not any(key.startswith(META_PREFIX) for key in meta):
        raise ModelError(f"{path} carries no gantool metadata (not exported by gantool)")
    return meta


def _onnx_metadata(path: Path) -> dict[str, str]:
    import onnx  # delayed: heavy import

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises its own DecodeError for corrupt files
        raise ModelError(f"{path} is not a readable ONNX model ({first_line(e)})") from None
    return {prop.key: prop.value for prop in model.metadata_props}


def _safetensors_metadata(path: Path) -> dict[str, str]:
    import safetensors  # delayed: optional speed (numpy framework: no torch import for a header)

    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise ModelError(f"{path} is not a readable safetensors file ({first_line(e)})") from None


def _torchscript_metadata(path: Path) -> dict[str, str]:
    return _zip_entry_metadata(path, TORCHSCRIPT_METADATA_ENTRY, "gantool TorchScript export")


def _zip_entry_metadata(path: Path, entry: str, what: str) -> dict[str, str]:
    # Read the zip entry directly: no need to load (and run the code of) the model.
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(f"/extra/{entry}")]
            if not names:
                raise ModelError(f"{path} carries no gantool metadata (not a {what})")
            return {str(k): str(v) for k, v in json.loads(archive.read(names[0])).items()}
    except (zipfile.BadZipFile, json.JSONDecodeError, TypeError, ValueError, AttributeError, OSError) as e:
        kind = "TorchScript" if entry == TORCHSCRIPT_METADATA_ENTRY and path.suffix != ".pt2" else ".pt2"
        raise ModelError(f"{path} is not a readable {kind} file ({first_line(e)})") from None


def decode_metadata(meta: dict[str, str]) -> dict[str, Any]:
    """Metadata with its JSON values (model config, processing contract) decoded."""
    decoded: dict[str, Any] = {}
    for key, value in meta.items():
        try:
            decoded[key] = json.loads(value) if value[:1] in "{[" else value
        except json.JSONDecodeError:
            decoded[key] = value
    return decoded


def config_from_metadata(meta: dict[str, str], source: str | Path) -> ModelConfig:
    """The :class:`~gantool.core.config.ModelConfig` a model file carries (defaults, with a warning, when none)."""
    text = meta.get(META_MODEL_CONFIG)
    if text is None:
        log.warning("%s has no gantool metadata; assuming the default model config", source)
        return ModelConfig()
    try:
        return ModelConfig.from_dict(json.loads(text))
    except (ValueError, TypeError, AttributeError) as e:
        raise ModelError(f"{source}: unreadable {META_MODEL_CONFIG} metadata ({first_line(e)})") from None


# What `gantool info` shows of a checkpoint's training config.
CHECKPOINT_TRAIN_KEYS = ("data", "size", "batch_size", "steps_g", "steps_d", "steps_joint", "lr", "mask", "seed")

"""What ``gantool info`` shows: an exported model's metadata or a checkpoint's summary."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from gantool.checkpoint import load_checkpoint, weights_sha256
from gantool.errors import InputError
from gantool.export import read_model_metadata
from gantool.provenance import find_machine_traces

CHECKPOINT_TRAIN_KEYS = ("data", "size", "batch_size", "steps_g", "steps_d", "steps_joint", "lr", "mask", "seed")


def describe_file(path: str | Path) -> dict[str, Any]:
    """What ``gantool info`` shows: metadata of a model, or a checkpoint's summary."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"file not found: {path}")
    kind = "checkpoint"  # anything else goes to load_checkpoint, which explains what is wrong
    if path.suffix in (".onnx", ".safetensors"):
        kind = path.suffix[1:]
    elif path.is_file() and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if any("/code/" in name or "/extra/" in name for name in archive.namelist()):
                kind = "torchscript"
    if kind != "checkpoint":
        meta = read_model_metadata(path)
        return {
            "file": str(path),
            "kind": kind,
            "bytes": path.stat().st_size,
            "metadata": _decode_json_values(meta),
            "warnings": find_machine_traces(path),  # absolute paths or stack traces it would leak
        }
    state = load_checkpoint(path)
    train = state.get("train_config") or {}
    return {
        "file": str(path),
        "kind": "checkpoint",
        "bytes": path.stat().st_size,
        "gantool_version": state.get("gantool_version"),
        "step": int(state["step"]),
        "phase": state["phase"],
        "model_config": state["model_config"],
        "train_config": {k: train[k] for k in CHECKPOINT_TRAIN_KEYS if k in train},
        "metrics": state.get("metrics") or {},
        "weights_sha256": weights_sha256(state["generator"]),
    }


def _decode_json_values(meta: dict[str, str]) -> dict[str, Any]:
    decoded: dict[str, Any] = {}
    for key, value in meta.items():
        try:
            decoded[key] = json.loads(value) if value[:1] in "{[" else value
        except json.JSONDecodeError:
            decoded[key] = value
    return decoded

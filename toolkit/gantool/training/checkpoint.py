"""Training checkpoints: one file with everything a later command needs.

Contents: the model config, the training config, generator and discriminator
weights, both optimizers, step, phase, RNG states and the last metrics. Plain
containers and tensors only, so it loads with ``torch.load(weights_only=True)``.
Writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from gantool import __version__
from gantool.core.artifacts import (
    ARTIFACT,
    KIND_SAFETENSORS,
    META_MODEL_CONFIG,
    META_TRAIN_PHASE,
    META_TRAIN_STEP,
    META_WEIGHTS_SHA256,
    model_kind,
)
from gantool.core.config import ModelConfig
from gantool.core.constants import CHECKPOINTS_DIR, IMPORT_CHECKPOINT, LAST_CHECKPOINT
from gantool.core.errors import CheckpointError, InputError, first_line
from gantool.core.fileio import atomic_save, atomic_write_bytes
from gantool.core.finite import non_finite_weights
from gantool.core.run_checkpoints import newest_checkpoint
from gantool.nn.networks import CompletionNetwork

CHECKPOINT_FORMAT = "gantool-checkpoint"
CHECKPOINT_VERSION = 1
REQUIRED_KEYS = ("format", "version", "model_config", "generator", "step", "phase")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (plus format tags) to ``path`` atomically."""
    payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "gantool_version": __version__}
    payload.update(state)

    def write(tmp: Path) -> None:
        # Through a Python file so a full disk raises OSError(ENOSPC) (atomic_save
        # turns it into one line). torch's writer calls f.write from C++ and turns
        # whatever it raises (ENOSPC, the KeyboardInterrupt of a second Ctrl-C) into
        # an unreadable RuntimeError ("unexpected pos ..."): the first such error is
        # kept and raised instead.
        with tmp.open("wb") as f:
            recorder = _RecordingFile(f)
            try:
                torch.save(payload, recorder)  # type: ignore[arg-type]
            except RuntimeError:
                if recorder.error is not None:
                    raise recorder.error from None
                raise

    try:
        return atomic_save(path, write)
    except RuntimeError as e:
        raise CheckpointError(f"cannot write checkpoint {path}: {first_line(e)}") from None


class _RecordingFile:
    """A binary file whose first write error is kept (torch's C++ writer swallows it)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except BaseException as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and validate a gantool checkpoint. Raises CheckpointError with one line."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.is_dir():
        raise CheckpointError(f"expected a checkpoint file, got a folder: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch.load raises many types on foreign bytes (even KeyError)
        raise CheckpointError(f"{path} is not a readable gantool checkpoint ({load_error_cause(e)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a gantool checkpoint (it holds a {type(state).__name__}, not a dict)")
    if state.get("format") != CHECKPOINT_FORMAT:
        found = f"format {state['format']!r}" if "format" in state else f"keys: {', '.join(map(str, list(state)[:5]))}"
        raise CheckpointError(f"{path} is not a gantool checkpoint ({found})")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path} is an incomplete gantool checkpoint (missing {', '.join(missing)})")
    if state["version"] > CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} was written by a newer gantool (format {state['version']}); upgrade gantool")
    return state


def load_error_cause(error: BaseException) -> str:
    """The reason in a torch.load error, in one line.

    A weights-only refusal starts with several lines of advice; the cause
    (which global was refused) is on the "WeightsUnpickler error:" line.
    """
    marker = "WeightsUnpickler error:"
    text = str(error)
    for line in text.splitlines():
        if marker in line:
            reason = line.split(marker, 1)[1].split(". Please", 1)[0].strip()
            return f"a weights-only load refuses it: {first_line(Exception(reason))}"
    if text.startswith("Weights only load failed"):
        # Newer torch: the advice paragraph (rerun with weights_only=False, which would run the
        # file's code) comes first, the cause in a later one. Give the cause, never the advice.
        paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
        causes = [p for p in paragraphs[1:] if "weights_only" not in p and not p.startswith("Check the documentation")]
        if causes:
            return f"a weights-only load refuses it: {first_line(Exception(causes[0]))}"
        return "a weights-only load refuses it (it holds Python objects other than tensors and containers)"
    return first_line(error)


def model_config_of(state: dict[str, Any]) -> ModelConfig:
    return ModelConfig.from_dict(state["model_config"])


def generator_from_checkpoint(state: dict[str, Any]) -> CompletionNetwork:
    """Rebuild the generator (eval mode, CPU) from a loaded checkpoint."""
    generator = CompletionNetwork(model_config_of(state))
    try:
        generator.load_state_dict(state["generator"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint weights do not match its model config: {first_line(e)}") from None
    return generator.eval()


# ------------------------------------------------------------- standalone generator weights


def weights_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' raw bytes, in key order: identifies the weights."""
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        tensor = state_dict[key].detach().cpu().contiguous().reshape(-1)
        digest.update(key.encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def save_generator_weights(path: str | Path, generator: CompletionNetwork, metadata: dict[str, str]) -> Path:
    """The generator alone as safetensors, with ``metadata`` (which must carry the model config) in the header."""
    if META_MODEL_CONFIG not in metadata:
        raise ValueError(f"save_generator_weights needs {META_MODEL_CONFIG} in the metadata")
    meta = dict(metadata)
    tensors = {k: v.detach().cpu().contiguous() for k, v in generator.state_dict().items()}
    data = _sorted_header(safetensors.torch.save(tensors, metadata=meta))
    return atomic_write_bytes(path, data)


def _sorted_header(data: bytes) -> bytes:
    """The safetensors bytes with the header's keys sorted: safetensors writes the metadata
    in hash order, which differs between runs; sorted, equal weights give equal files."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes with spaces
    return len(text).to_bytes(8, "little") + text + data[8 + length :]


def load_generator_weights(path: str | Path) -> tuple[CompletionNetwork, dict[str, str]]:
    """Rebuild a generator (eval mode) from :func:`save_generator_weights` output."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        config = ModelConfig.from_dict(json.loads(meta[META_MODEL_CONFIG]))
    except (KeyError, json.JSONDecodeError, TypeError, ValueError):
        raise CheckpointError(f"{path} has no gantool model config in its metadata") from None
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{path} is not a readable safetensors file ({first_line(e)})") from None
    recorded = meta.get(META_WEIGHTS_SHA256)
    if recorded and weights_sha256(tensors) != recorded:  # a few MB hashed: cheap against the model's start
        raise CheckpointError(
            f"{path}: its weights do not match the hash it records ({META_WEIGHTS_SHA256}); "
            "the file was altered after export: re-export it"
        )
    generator = CompletionNetwork(config)
    try:
        generator.load_state_dict(tensors)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not match the model config ({first_line(e)})") from None
    return generator.eval(), meta


# What a folder given as weights resolves to, first found: an import's checkpoint, a run's
# newest checkpoint, an export's generator weights.
WEIGHTS_IN_FOLDER = (IMPORT_CHECKPOINT, f"{CHECKPOINTS_DIR}/{LAST_CHECKPOINT}", ARTIFACT["safetensors"].filename)


def weights_file(path: str | Path, label: str) -> Path:
    """The file behind a weights argument (``gantool export``'s CHECKPOINT, ``--init-from``): a
    file as given, or a folder's first of :data:`WEIGHTS_IN_FOLDER`, where a run with no
    ``last.pt`` gives its highest ``step_N.pt`` (as ``--resume RUN`` does). ``label`` names the
    argument in the one-line errors."""
    path = Path(path).expanduser()
    if path.is_dir():
        for name in WEIGHTS_IN_FOLDER:
            if name.startswith(f"{CHECKPOINTS_DIR}/"):
                newest, _ = newest_checkpoint(path / CHECKPOINTS_DIR)
                if newest is not None:
                    return newest
            elif (path / name).is_file():
                return path / name
        *others, last = WEIGHTS_IN_FOLDER
        raise InputError(f"{label} {path}: no {', '.join(others)} (or step_N.pt) or {last} in this folder")
    if not path.exists():
        raise InputError(f"{label}: not found: {path}")
    return path


def load_weights_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's state (:func:`load_checkpoint`), or for exported ``generator.safetensors``
    the generator-only state of :func:`state_from_generator_weights`: what ``gantool export``
    and ``--init-from`` read."""
    path = Path(path)
    if model_kind(path) == KIND_SAFETENSORS and path.is_file():
        return state_from_generator_weights(path)
    return load_checkpoint(path)


def state_from_generator_weights(path: str | Path) -> dict[str, Any]:
    """A generator-only checkpoint state (no discriminator, optimizers or training config) from
    :func:`save_generator_weights` output; the step and phase come from its metadata."""
    generator, meta = load_generator_weights(path)
    try:
        step = int(meta.get(META_TRAIN_STEP) or 0)
    except ValueError:
        raise CheckpointError(f"{path}: its {META_TRAIN_STEP} metadata is not a step number") from None
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "model_config": generator.config.to_dict(),
        "generator": generator.state_dict(),
        "step": step,
        "phase": meta.get(META_TRAIN_PHASE, ""),
    }


# ------------------------------------------------------------------- training state

TRAINING_KEYS = ("train_config", "discriminator", "opt_g", "opt_d", "rng")


def check_training_state(state: dict[str, Any], path: str | Path) -> None:
    """What a resume needs is present and of the right kind (one-line CheckpointError otherwise).

    A hand-edited or foreign file must be refused before a run folder exists,
    not half-way through loading it.
    """
    if "train_config" not in state or "opt_g" not in state:
        raise CheckpointError(f"{path} has no training state (was it exported weights?)")
    missing = [k for k in TRAINING_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path} cannot be resumed: it has no {', '.join(missing)}")
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{path} cannot be resumed: its step is {step!r}, not a whole number >= 0")
    for key in ("train_config", "model_config", "generator", "discriminator", "opt_g", "opt_d", "rng"):
        if not isinstance(state[key], dict):
            raise CheckpointError(f"{path} cannot be resumed: {key} is a {type(state[key]).__name__}, not a mapping")
    refuse_non_finite_networks(state, f"{path} cannot be resumed")
    rng = state["rng"]
    if not {"torch", "python", "numpy"} <= set(rng):
        raise CheckpointError(
            f"{path} cannot be resumed: its rng state lacks {', '.join(sorted({'torch', 'python', 'numpy'} - set(rng)))}"
        )


def refuse_non_finite_networks(state: dict[str, Any], what: str) -> None:
    """A one-line CheckpointError (``what``: its start) when the generator's or discriminator's
    weights in ``state`` hold NaN or Inf: training from them gives a non-finite loss at once."""
    for key in ("generator", "discriminator"):
        bad = non_finite_weights(state.get(key) or {})
        if bad:
            raise CheckpointError(
                f"{what}: its {key} has non-finite weights ({bad}); training from it would give NaN at once "
                "(use an earlier checkpoint)"
            )


def load_training_state(
    state: dict[str, Any], nets: Any, opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer
) -> None:
    """Weights and optimizer states into the built networks; a mismatch is one line."""
    parts = (
        ("generator", nets.generator),
        ("discriminator", nets.discriminator),
        ("opt_g", opt_g),
        ("opt_d", opt_d),
    )
    for key, target in parts:
        try:
            target.load_state_dict(state[key])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            raise CheckpointError(
                f"cannot resume: the checkpoint's {key} does not fit the model ({first_line(e)})"
            ) from None
    for key, opt in (("opt_g", opt_g), ("opt_d", opt_d)):
        # load_state_dict does not compare shapes: a foreign Adam state would fail at the first step.
        for group in opt.param_groups:
            for param in group["params"]:
                for name, value in opt.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                        raise CheckpointError(
                            f"cannot resume: the checkpoint's {key} does not fit the model "
                            f"({name} of shape {tuple(value.shape)} for a parameter of shape {tuple(param.shape)})"
                        )

"""Training checkpoints: one file with everything a later command needs.

Contents: the model config, the training config, generator and discriminator
weights, both optimizers, step, phase, RNG states and the last metrics. Plain
containers and tensors only, so it loads with ``torch.load(weights_only=True)``.
Writes are atomic.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from gantool import __version__
from gantool.config import ModelConfig
from gantool.errors import CheckpointError
from gantool.fileio import atomic_save
from gantool.networks import CompletionNetwork, ContextDiscriminator

CHECKPOINT_FORMAT = "gantool-checkpoint"
CHECKPOINT_VERSION = 1
REQUIRED_KEYS = ("format", "version", "model_config", "generator", "step", "phase")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (plus format tags) to ``path`` atomically."""
    payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "gantool_version": __version__}
    payload.update(state)
    return atomic_save(path, lambda tmp: torch.save(payload, tmp))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and validate a gantool checkpoint. Raises CheckpointError with one line."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.is_dir():
        raise CheckpointError(f"expected a checkpoint file, got a folder: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is not a readable gantool checkpoint ({first[:160]})") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a gantool checkpoint")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path} is an incomplete gantool checkpoint (missing {', '.join(missing)})")
    if state["version"] > CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path} was written by a newer gantool (format {state['version']}); upgrade gantool"
        )
    return state


def model_config_of(state: dict[str, Any]) -> ModelConfig:
    return ModelConfig.from_dict(state["model_config"])


def generator_from_checkpoint(state: dict[str, Any]) -> CompletionNetwork:
    """Rebuild the generator (eval mode, CPU) from a loaded checkpoint."""
    generator = CompletionNetwork(model_config_of(state))
    try:
        generator.load_state_dict(state["generator"])
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint weights do not match its model config: {str(e)[:200]}") from None
    return generator.eval()


def discriminator_from_checkpoint(state: dict[str, Any]) -> ContextDiscriminator:
    discriminator = ContextDiscriminator(model_config_of(state))
    discriminator.load_state_dict(state["discriminator"])
    return discriminator

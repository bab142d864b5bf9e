"""Tiny configurations shared by the tests (2-core CPU budget)."""

from __future__ import annotations

import contextlib

import torch

from gantool.core.config import ModelConfig, TrainConfig
from gantool.nn.networks import CompletionNetwork, ContextDiscriminator
from gantool.training.data import InpaintingDataset, StepBatchSampler, SyntheticSource
from gantool.training.loop import DiscriminatorPair, Networks, build_optimizers

TINY_MODEL = dict(width=4, disc_width=2, disc_fc=8, size=32, local_size=16)
TINY_CONFIG = ModelConfig(**TINY_MODEL)
# The tiny model as `gantool train` options, and the CLI tests' common arguments.
TINY_MODEL_ARGS = [arg for key, value in TINY_MODEL.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
TINY_ARGS = [*TINY_MODEL_ARGS, "--batch-size", "4", "--workers", "0", "--quiet"]


def params(module: torch.nn.Module) -> list[torch.Tensor]:
    """A detached copy of a module's parameters."""
    return [p.detach().clone() for p in module.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bitwise equality of two parameter lists."""
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def tiny_train_config(**changes) -> TrainConfig:
    base = dict(TINY_MODEL, batch_size=4, steps_g=2, steps_d=2, steps_joint=4, workers=0,
                log_every=1, sample_every=4, checkpoint_every=4, val_images=2)
    base.update(changes)
    return TrainConfig(**base)


def tiny_networks(seed: int = 0, cfg: TrainConfig | None = None) -> Networks:
    cfg = cfg or tiny_train_config()
    torch.manual_seed(seed)
    model_cfg = cfg.model_config()
    g, d = CompletionNetwork(model_cfg), ContextDiscriminator(model_cfg)
    return Networks(g, d, g, DiscriminatorPair(d))


def tiny_batch(cfg: TrainConfig | None = None, step: int = 0, seed: int = 0):
    cfg = cfg or tiny_train_config()
    dataset = InpaintingDataset(SyntheticSource(seed=seed), cfg.size, cfg.local_size, cfg.mask, cfg.hole_range())
    keys = StepBatchSampler(len(dataset), cfg.batch_size, seed, step, step + 1).batch_keys(step)
    images, masks, corners = zip(*(dataset[k] for k in keys))
    return torch.stack(images), torch.stack(masks), torch.stack(corners)


def no_autocast():
    return contextlib.nullcontext()


__all__ = ["TINY_MODEL", "TINY_CONFIG", "params", "same", "tiny_train_config", "tiny_networks", "tiny_batch", "no_autocast",
           "build_optimizers", "ModelConfig"]

"""The GLCIC training step, correct by construction.

Each joint step:
  1. fake = G(masked real)                       (one generator forward)
  2. D on the real images and on fake.detach();  D step
  3. a FRESH D pass on fake (not detached), D frozen (requires_grad off);
     adversarial + reconstruction loss;          G step
No retain_graph anywhere, no discriminator output reused across backward
calls, and no gradient of G's loss ever lands in D's parameters.

Phases follow GLCIC: reconstruction only (``steps_g``), discriminator only
(``steps_d``), then joint (``steps_joint``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gantool.core.config import TrainConfig
from gantool.nn.losses import discriminator_loss, generator_adversarial_loss, hole_mse
from gantool.nn.networks import CompletionNetwork, ContextDiscriminator, crop_local

PHASE_NAMES = {"g": "completion", "d": "discriminator", "joint": "joint"}


def phase_at(step: int, cfg: TrainConfig) -> str:
    if step < cfg.steps_g:
        return "g"
    return "d" if step < cfg.steps_g + cfg.steps_d else "joint"


class DiscriminatorPair(nn.Module):
    """D on the real and the fake batch in one forward call (so DDP sees one
    forward per backward). Real and fake keep separate BatchNorm statistics."""

    def __init__(self, discriminator: ContextDiscriminator) -> None:
        super().__init__()
        self.discriminator = discriminator

    def forward(self, real_crop: Tensor, real: Tensor, fake_crop: Tensor, fake: Tensor) -> tuple[Tensor, Tensor]:
        return self.discriminator(real_crop, real), self.discriminator(fake_crop, fake)


@dataclass
class Networks:
    """The raw modules and what the loop calls (DDP wrappers or the modules themselves)."""

    generator: CompletionNetwork
    discriminator: ContextDiscriminator
    run_generator: nn.Module
    run_pair: nn.Module


def set_requires_grad(module: nn.Module, flag: bool) -> None:
    for p in module.parameters():
        p.requires_grad_(flag)


def discriminator_step(
    nets: Networks,
    opt_d: torch.optim.Optimizer,
    real: Tensor,
    fake: Tensor,
    corners: Tensor,
    cfg: TrainConfig,
    autocast: contextlib.AbstractContextManager,
) -> dict[str, Tensor]:
    """D on real and on ``fake`` (already detached); one D optimizer step.

    Returns D's loss and its mean sigmoid output on real (``d_real``) and on fake
    (``d_fake``), the balance a GAN's health shows in (0-d tensors)."""
    opt_d.zero_grad(set_to_none=True)
    with autocast:
        real_logits, fake_logits = nets.run_pair(
            crop_local(real, corners, cfg.local_size), real, crop_local(fake, corners, cfg.local_size), fake
        )
        loss_d = discriminator_loss(real_logits.float(), fake_logits.float(), cfg.alpha)
    loss_d.backward()
    opt_d.step()
    return {
        "loss_d": loss_d.detach(),
        "d_real": torch.sigmoid(real_logits.detach().float()).mean(),
        "d_fake": torch.sigmoid(fake_logits.detach().float()).mean(),
    }


def generator_step(
    nets: Networks,
    opt_g: torch.optim.Optimizer,
    real: Tensor,
    fake: Tensor,
    mask: Tensor,
    corners: Tensor,
    cfg: TrainConfig,
    autocast: contextlib.AbstractContextManager,
    adversarial: bool,
) -> tuple[Tensor, Tensor]:
    """Reconstruction loss in the hole (+ adversarial loss from a fresh D pass on
    the non-detached ``fake``, D frozen); one G optimizer step."""
    opt_g.zero_grad(set_to_none=True)
    loss_rec = hole_mse(fake.float(), real, mask)
    loss_adv = torch.zeros((), device=real.device)
    if adversarial:
        set_requires_grad(nets.discriminator, False)  # G's loss must not touch D's parameters
        try:
            with autocast:  # the raw D, not DDP: D is not updated here, so nothing to sync
                logits = nets.discriminator(crop_local(fake, corners, cfg.local_size), fake)
            loss_adv = generator_adversarial_loss(logits.float(), cfg.alpha)
        finally:
            set_requires_grad(nets.discriminator, True)
    loss_g = cfg.recon_weight * loss_rec + loss_adv
    loss_g.backward()
    opt_g.step()
    return loss_rec.detach(), loss_adv.detach()


def train_step(
    phase: str,
    nets: Networks,
    opt_g: torch.optim.Optimizer,
    opt_d: torch.optim.Optimizer,
    batch: tuple[Tensor, Tensor, Tensor],
    cfg: TrainConfig,
    autocast: contextlib.AbstractContextManager,
) -> dict[str, Tensor]:
    """One step of ``phase`` ("g", "d" or "joint"); returns the losses and, where D ran,
    ``d_real`` / ``d_fake`` (0-d tensors)."""
    real, mask, corners = batch
    if phase == "d":
        with torch.no_grad(), autocast:
            fake = nets.run_generator(real, mask)
        return discriminator_step(nets, opt_d, real, fake.float(), corners, cfg, autocast)
    with autocast:
        fake = nets.run_generator(real, mask)
    losses = {}
    if phase == "joint":
        losses.update(discriminator_step(nets, opt_d, real, fake.detach().float(), corners, cfg, autocast))
    rec, adv = generator_step(nets, opt_g, real, fake, mask, corners, cfg, autocast, adversarial=phase == "joint")
    losses["loss_rec"] = rec
    if phase == "joint":
        losses["loss_adv"] = adv
    return losses

"""The GAN loop is correct by construction: these tests prove it.

The first test keeps the classic broken pattern as a documented regression
example; the rest check that each optimizer step moves only its own network,
that the adversarial gradient really reaches G, and that no gradient leaks
between the two networks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from gantool.losses import discriminator_loss, hole_mse
from gantool.networks import crop_local
from gantool.train import discriminator_step, generator_step, train_step
from tiny import build_optimizers, no_autocast, params, same, tiny_batch, tiny_networks, tiny_train_config


def test_broken_pattern_reusing_detached_discriminator_output_fails():
    """The bug gantool exists to fix (kept as a regression example).

    D runs on fake.detach(); its loss is backpropagated for D; the SAME output is
    then reused for the generator loss and backpropagated again. PyTorch refuses:
    the graph was freed. (And with retain_graph=True G would still get no
    gradient, because the fake was detached.)
    """
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    real, mask, corners = tiny_batch(cfg)
    fake = nets.generator(real, mask)
    output_disc = nets.discriminator(crop_local(fake.detach(), corners, cfg.local_size), fake.detach())
    error_fake = F.binary_cross_entropy_with_logits(output_disc, torch.zeros_like(output_disc))
    error_fake.backward()
    error_gen = F.binary_cross_entropy_with_logits(output_disc, torch.ones_like(output_disc))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        error_gen.backward()


def test_retain_graph_silences_the_crash_but_generator_gets_no_gradient():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    real, mask, corners = tiny_batch(cfg)
    fake = nets.generator(real, mask)
    out = nets.discriminator(crop_local(fake.detach(), corners, cfg.local_size), fake.detach())
    F.binary_cross_entropy_with_logits(out, torch.zeros_like(out)).backward(retain_graph=True)
    F.binary_cross_entropy_with_logits(out, torch.ones_like(out)).backward()
    assert all(p.grad is None for p in nets.generator.parameters())


def test_discriminator_phase_step_leaves_generator_parameters_unchanged():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    g_before, d_before = params(nets.generator), params(nets.discriminator)
    train_step("d", nets, opt_g, opt_d, tiny_batch(cfg), cfg, no_autocast())
    assert same(params(nets.generator), g_before)
    assert not same(params(nets.discriminator), d_before)
    assert all(p.grad is None for p in nets.generator.parameters())


def test_generator_step_leaves_discriminator_parameters_and_grads_untouched():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    opt_g, _ = build_optimizers(nets, cfg)
    real, mask, corners = tiny_batch(cfg)
    g_before, d_before = params(nets.generator), params(nets.discriminator)
    fake = nets.generator(real, mask)
    generator_step(nets, opt_g, real, fake, mask, corners, cfg, no_autocast(), adversarial=True)
    assert same(params(nets.discriminator), d_before)
    assert all(p.grad is None for p in nets.discriminator.parameters()), "G's loss leaked into D's grads"
    assert all(p.requires_grad for p in nets.discriminator.parameters()), "D must be unfrozen afterwards"
    assert not same(params(nets.generator), g_before)


def test_adversarial_loss_alone_reaches_the_generator():
    cfg = tiny_train_config(recon_weight=0.0, alpha=1.0)
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    g_before = params(nets.generator)
    losses = train_step("joint", nets, opt_g, opt_d, tiny_batch(cfg), cfg, no_autocast())
    grads = [p.grad for p in nets.generator.parameters()]
    assert all(g is not None for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    assert not same(params(nets.generator), g_before)
    assert float(losses["loss_adv"]) > 0


def test_joint_step_updates_discriminator_exactly_as_its_own_loss_alone():
    """No leaked or stale gradient: D's joint-step update equals a reference
    update computed from D's loss only, with the same optimizer state."""
    cfg = tiny_train_config(alpha=1.0)
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    batch = tiny_batch(cfg)
    # Warm both optimizers with one joint step so Adam has non-trivial state.
    train_step("joint", nets, opt_g, opt_d, batch, cfg, no_autocast())

    reference_d = copy.deepcopy(nets.discriminator)
    reference_opt = torch.optim.Adam(reference_d.parameters(), lr=cfg.lr, betas=cfg.betas)
    reference_opt.load_state_dict(copy.deepcopy(opt_d.state_dict()))  # no shared moment tensors
    generator_before = copy.deepcopy(nets.generator)

    batch = tiny_batch(cfg, step=1)
    train_step("joint", nets, opt_g, opt_d, batch, cfg, no_autocast())

    real, mask, corners = batch
    with torch.no_grad():
        fake = generator_before(real, mask)
    reference_opt.zero_grad()
    loss = discriminator_loss(
        reference_d(crop_local(real, corners, cfg.local_size), real),
        reference_d(crop_local(fake, corners, cfg.local_size), fake),
        cfg.alpha,
    )
    loss.backward()
    reference_opt.step()
    for ours, ref in zip(nets.discriminator.parameters(), reference_d.parameters()):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_glcic_pytorch_phase3_bug_would_be_caught():
    """The reference implementation zeroes D's grads BEFORE G's backward, so G's
    loss fills D's grads and the next D step uses them. Demonstrate that this
    pattern leaves non-zero grads in D, which ours never does."""
    cfg = tiny_train_config(alpha=1.0)
    nets = tiny_networks(cfg=cfg)
    real, mask, corners = tiny_batch(cfg)
    fake = nets.generator(real, mask)
    nets.discriminator.zero_grad()  # too early, as in the buggy loop
    out = nets.discriminator(crop_local(fake, corners, cfg.local_size), fake)
    F.binary_cross_entropy_with_logits(out, torch.ones_like(out)).backward()
    leaked = sum(float(p.grad.abs().sum()) for p in nets.discriminator.parameters() if p.grad is not None)
    assert leaked > 0


def test_discriminator_step_uses_detached_fake_only():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    _, opt_d = build_optimizers(nets, cfg)
    real, mask, corners = tiny_batch(cfg)
    fake = nets.generator(real, mask)
    discriminator_step(nets, opt_d, real, fake.detach(), corners, cfg, no_autocast())
    assert all(p.grad is None for p in nets.generator.parameters())


def test_tiny_model_overfits_a_few_images():
    cfg = tiny_train_config(width=8, batch_size=4, lr=2e-3)
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    batch = tiny_batch(cfg)
    real, mask, _ = batch
    losses = []
    for _ in range(120):
        losses.append(float(train_step("g", nets, opt_g, opt_d, batch, cfg, no_autocast())["loss_rec"]))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.4 * first, (first, last)
    with torch.no_grad():
        assert float(hole_mse(nets.generator(real, mask), real, mask)) < first


def test_no_retain_graph_in_the_package():
    import pathlib
    import re

    import gantool

    root = pathlib.Path(gantool.__file__).parent
    offenders = [p.name for p in root.rglob("*.py") if re.search(r"retain_graph\s*=", p.read_text())]
    assert offenders == []

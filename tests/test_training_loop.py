"""The GAN loop is correct by construction: these tests prove it.

Three tests keep broken hand-written loops as documented regression examples
(they never call gantool, so they cannot catch a gantool regression); each has
a twin right after it that runs gantool's own step functions and fails if
gantool regressed to that bug. The rest check that each optimizer step moves
only its own network, that the adversarial gradient really reaches G, that no
gradient leaks between the two networks, and that resume restores the RNGs.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gantool.training.loop as train_module
from gantool.nn.losses import discriminator_loss, hole_mse
from gantool.nn.networks import crop_local
from gantool.training.loop import discriminator_step, generator_step, train, train_step
from numerics import assert_fp32_close
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


def test_twin_gantool_joint_steps_run_and_move_both_networks():
    """Twin of the above: gantool's joint step (D on the detached fake, then a
    fresh D pass for G) runs step after step and updates both networks."""
    cfg = tiny_train_config(alpha=1.0, recon_weight=0.0)
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    for step in range(2):
        g_before, d_before = params(nets.generator), params(nets.discriminator)
        losses = train_step("joint", nets, opt_g, opt_d, tiny_batch(cfg, step=step), cfg, no_autocast())
        assert set(losses) == {"loss_d", "loss_rec", "loss_adv", "d_real", "d_fake"}
        assert not same(params(nets.generator), g_before) and not same(params(nets.discriminator), d_before)


def test_retain_graph_silences_the_crash_but_generator_gets_no_gradient():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    real, mask, corners = tiny_batch(cfg)
    fake = nets.generator(real, mask)
    out = nets.discriminator(crop_local(fake.detach(), corners, cfg.local_size), fake.detach())
    F.binary_cross_entropy_with_logits(out, torch.zeros_like(out)).backward(retain_graph=True)
    F.binary_cross_entropy_with_logits(out, torch.ones_like(out)).backward()
    assert all(p.grad is None for p in nets.generator.parameters())


def test_twin_gantool_generator_gradient_comes_from_a_fresh_pass_through_the_updated_d():
    """Twin of the above: in gantool's joint step (reconstruction weight 0) G's
    gradient is that of alpha * BCE(D'(G(x)), real), D' being D after its own
    step in the same joint step; computed here with autograd on copies."""
    cfg = tiny_train_config(alpha=0.5, recon_weight=0.0)
    nets = tiny_networks(cfg=cfg)
    _, opt_d = build_optimizers(nets, cfg)
    opt_g = torch.optim.SGD(nets.generator.parameters(), lr=0.0)  # G fixed: its grads stay readable
    real, mask, corners = batch = tiny_batch(cfg)
    generator_before = copy.deepcopy(nets.generator)
    losses = train_step("joint", nets, opt_g, opt_d, batch, cfg, no_autocast())

    fake = generator_before(real, mask)
    updated_d = copy.deepcopy(nets.discriminator)
    logits = updated_d(crop_local(fake, corners, cfg.local_size), fake)
    loss = cfg.alpha * torch.log1p(torch.exp(-logits)).mean()
    assert float(losses["loss_adv"]) == pytest.approx(float(loss.detach()), rel=1e-5)
    expected = torch.autograd.grad(loss, list(generator_before.parameters()))
    assert sum(float(g.abs().sum()) for g in expected) > 0
    # BCE-with-logits (gantool) and log1p(exp(-x)) (here) are equal in exact arithmetic; their
    # float32 roundings differ, and differ again with the CPU's kernels: a few ulps of each
    # gradient's scale per sqrt(terms summed), batch * height * width for a conv weight.
    for p, want in zip(nets.generator.parameters(), expected):
        assert_fp32_close(p.grad, want, real[:, 0].numel())


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
    assert set(losses) == {"loss_d", "loss_rec", "loss_adv", "d_real", "d_fake"}  # its value: the twin above checks it


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


def test_twin_gantool_joint_step_leaves_only_d_loss_gradients_in_d():
    """Twin of the above: after gantool's joint step D's grads are exactly those
    of D's own loss; G's loss (computed after them) added nothing."""
    cfg = tiny_train_config(alpha=1.0)
    nets = tiny_networks(cfg=cfg)
    opt_g, _ = build_optimizers(nets, cfg)
    opt_d = torch.optim.SGD(nets.discriminator.parameters(), lr=0.0)  # D fixed: its grads stay readable
    real, mask, corners = batch = tiny_batch(cfg)
    reference_d, generator_before = copy.deepcopy(nets.discriminator), copy.deepcopy(nets.generator)
    train_step("joint", nets, opt_g, opt_d, batch, cfg, no_autocast())

    with torch.no_grad():
        fake = generator_before(real, mask)
    r = reference_d(crop_local(real, corners, cfg.local_size), real)
    f = reference_d(crop_local(fake, corners, cfg.local_size), fake)
    loss = cfg.alpha * (torch.log1p(torch.exp(-r)).mean() + torch.log1p(torch.exp(f)).mean()) / 2
    for p, want in zip(nets.discriminator.parameters(), torch.autograd.grad(loss, list(reference_d.parameters()))):
        assert_fp32_close(p.grad, want, real[:, 0].numel())  # equal losses, other rounding: see the G twin


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
    for _ in range(40):  # at 40 steps the loss is ~0.1 of its start here (0.15 at 30, 0.02 at 120)
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


def test_resume_restores_the_rng_streams(tmp_path, monkeypatch):
    """Two resumes of one checkpoint, after different global seeding, see the same
    torch, numpy and Python RNG states at their first step: the checkpoint's."""
    cfg = tiny_train_config(steps_g=2, steps_d=1, steps_joint=1, checkpoint_every=100, sample_every=100)
    checkpoint = train(cfg.replace(out=str(tmp_path / "run")), stop_after=2, progress=False).last_checkpoint
    seen, runs = [], []
    real_step = train_module.train_step

    def recording_step(*args, **kwargs):
        if len(seen) < len(runs):
            seen.append((torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()))
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", recording_step)
    for seed in (1, 2):
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        runs.append(seed)
        train({"out": str(tmp_path / f"resumed_{seed}")}, resume=checkpoint, stop_after=3, progress=False)
    (t1, n1, p1), (t2, n2, p2) = seen
    assert torch.equal(t1, t2) and np.array_equal(n1, n2) and p1 == p2

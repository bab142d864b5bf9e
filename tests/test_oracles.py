"""Independent oracles: gantool's losses, metrics and step functions against
values computed here from the formulas (closed form or numpy), never against
gantool's own functions. Then the direction of learning: one D step separates
real from fake, one G step (adversarial only) makes D call G's output more real.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_CONFIG, briefly_trained_generator
from gantool.nn.losses import discriminator_loss, generator_adversarial_loss, hole_mse, l1, psnr, ssim
from gantool.nn.networks import crop_local, fold_batchnorm
from gantool.training.loop import discriminator_step, generator_step, validate
from numerics import assert_fp32_close, conv_fan_in
from tiny import build_optimizers, no_autocast, tiny_batch, tiny_networks, tiny_train_config

REAL_LOGITS = [2.0, -1.0, 0.0, 0.25]
FAKE_LOGITS = [0.5, -3.0, 1.5, -0.75]


def softplus(z: float) -> float:
    """log(1 + e^z): BCE of a logit z against target 0; softplus(-z) is BCE against target 1."""
    return math.log1p(math.exp(z))


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


# ------------------------------------------------------------------------------ losses


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_discriminator_loss_is_alpha_times_half_the_bce_sum(alpha):
    expected = alpha * (mean(softplus(-z) for z in REAL_LOGITS) + mean(softplus(z) for z in FAKE_LOGITS)) / 2
    got = discriminator_loss(torch.tensor(REAL_LOGITS), torch.tensor(FAKE_LOGITS), alpha)
    assert float(got) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_generator_adversarial_loss_targets_real(alpha):
    expected = alpha * mean(softplus(-z) for z in FAKE_LOGITS)  # -log sigmoid(z): "call it real"
    logits = torch.tensor(FAKE_LOGITS, requires_grad=True)
    got = generator_adversarial_loss(logits, alpha)
    assert float(got.detach()) == pytest.approx(expected, rel=1e-6)
    # d/dz softplus(-z) = sigmoid(z) - 1 < 0: G's loss falls as D's logit rises
    got.backward()
    expected_grad = [alpha * (1 / (1 + math.exp(-z)) - 1) / len(FAKE_LOGITS) for z in FAKE_LOGITS]
    assert logits.grad.tolist() == pytest.approx(expected_grad, rel=1e-5)
    assert all(g < 0 for g in logits.grad.tolist())


def test_hole_mse_is_the_mean_over_hole_pixels_and_channels():
    rng = np.random.default_rng(0)
    output, target = rng.random((2, 3, 4, 5)), rng.random((2, 3, 4, 5))
    mask = np.zeros((2, 1, 4, 5))
    mask[0, 0, 1:3, 2:4] = 1  # 4 hole pixels in image 0
    mask[1, 0, 0, 0] = 1  # 1 hole pixel in image 1
    squares = [
        (output[n, c, y, x] - target[n, c, y, x]) ** 2 for n, y, x in zip(*np.nonzero(mask[:, 0])) for c in range(3)
    ]
    expected = sum(squares) / len(squares)  # 15 values: outside the hole nothing counts
    as_tensor = (torch.from_numpy(a).float() for a in (output, target, mask))
    assert float(hole_mse(*as_tensor)) == pytest.approx(expected, rel=1e-5)
    empty = torch.zeros(2, 1, 4, 5)
    assert float(hole_mse(torch.from_numpy(output).float(), torch.from_numpy(target).float(), empty)) == 0.0


# ----------------------------------------------------------------------------- metrics


def np_psnr(pred: np.ndarray, truth: np.ndarray, region: np.ndarray | None = None) -> float:
    err = (pred.astype(np.float64) - truth.astype(np.float64)) ** 2
    values = err[np.broadcast_to(region, err.shape) > 0.5] if region is not None else err.ravel()
    return 10 * math.log10(1.0 / values.mean())


def np_l1(pred: np.ndarray, truth: np.ndarray, region: np.ndarray | None = None) -> float:
    err = np.abs(pred.astype(np.float64) - truth.astype(np.float64))
    return float((err[np.broadcast_to(region, err.shape) > 0.5] if region is not None else err).mean())


def np_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """Wang et al. 2004 on C x H x W arrays: 11x11 Gaussian (sigma 1.5), valid windows, data range 1."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    size = min(11, x.shape[-1], x.shape[-2])
    k = np.arange(size) - (size - 1) / 2
    g = np.exp(-(k**2) / (2 * 1.5**2))
    window = np.outer(g, g) / g.sum() ** 2

    def blur(a: np.ndarray) -> np.ndarray:
        patches = np.lib.stride_tricks.sliding_window_view(a, (size, size), axis=(1, 2))
        return (patches * window).sum(axis=(-1, -2))

    mx, my = blur(x), blur(y)
    sxx, syy, sxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx**2 + my**2 + c1) * (sxx + syy + c2))
    return float(s.mean())


def _pair(seed: int = 0, size: tuple[int, int] = (16, 20)):
    rng = np.random.default_rng(seed)
    truth = rng.random((3, *size)).astype(np.float32)
    pred = np.clip(truth + rng.normal(0, 0.1, truth.shape), 0, 1).astype(np.float32)
    mask = np.zeros((1, *size), np.float32)
    mask[0, 3:9, 4:15] = 1
    pred[:, 10:, :] = truth[:, 10:, :]  # part of the outside is exact: in/out figures differ
    return pred, truth, mask


def test_psnr_and_l1_inside_and_outside_the_hole_match_numpy():
    pred, truth, mask = _pair()
    p, t, m = (torch.from_numpy(a)[None] for a in (pred, truth, mask))
    assert float(psnr(p, t)[0]) == pytest.approx(np_psnr(pred, truth), rel=1e-5)
    assert float(psnr(p, t, m)[0]) == pytest.approx(np_psnr(pred, truth, mask), rel=1e-5)
    assert float(psnr(p, t, 1 - m)[0]) == pytest.approx(np_psnr(pred, truth, 1 - mask), rel=1e-5)
    assert float(l1(p, t)[0]) == pytest.approx(np_l1(pred, truth), rel=1e-5)
    assert float(l1(p, t, m)[0]) == pytest.approx(np_l1(pred, truth, mask), rel=1e-5)
    assert float(l1(p, t, 1 - m)[0]) == pytest.approx(np_l1(pred, truth, 1 - mask), rel=1e-5)
    # closed form: a uniform error of 0.1 is 20 dB and an L1 of 0.1
    flat = torch.full((1, 3, 8, 8), 0.5)
    assert float(psnr(flat + 0.1, flat)[0]) == pytest.approx(20.0, abs=1e-4)
    assert float(l1(flat + 0.1, flat)[0]) == pytest.approx(0.1, abs=1e-6)


def test_ssim_matches_numpy_and_the_closed_form_for_flat_images():
    pred, truth, _ = _pair(seed=1)
    assert float(ssim(torch.from_numpy(pred)[None], torch.from_numpy(truth)[None])[0]) == pytest.approx(
        np_ssim(pred, truth), abs=1e-5
    )
    a, b = 0.2, 0.7  # flat images: no variance, SSIM = (2ab + c1) / (a^2 + b^2 + c1)
    expected = (2 * a * b + 0.01**2) / (a * a + b * b + 0.01**2)
    got = ssim(torch.full((1, 3, 12, 12), a), torch.full((1, 3, 12, 12), b))[0]
    assert float(got) == pytest.approx(expected, abs=1e-4)  # float32 variances are ~1e-8, not 0


class _FixedOutput(torch.nn.Module):
    """A stand-in generator whose output is chosen by the test."""

    def __init__(self, output: torch.Tensor) -> None:
        super().__init__()
        self.output = output

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output


def test_training_validation_metrics_match_numpy(tmp_path: Path):
    preds, truths, masks = zip(*(_pair(seed) for seed in (2, 3)))
    real, out, mask = (torch.from_numpy(np.stack(a)) for a in (truths, preds, masks))
    record = validate(_FixedOutput(out), (real, mask, torch.zeros(2, 2)), 7, "joint", tmp_path / "s.png")
    assert record["step"] == 7 and (tmp_path / "s.png").is_file()
    expected = {
        "val_psnr": mean(np_psnr(p, t) for p, t in zip(preds, truths)),
        "val_psnr_hole": mean(np_psnr(p, t, m) for p, t, m in zip(preds, truths, masks)),
        "val_ssim": mean(np_ssim(p, t) for p, t in zip(preds, truths)),
        "val_l1": mean(np_l1(p, t) for p, t in zip(preds, truths)),
        "val_l1_hole": mean(np_l1(p, t, m) for p, t, m in zip(preds, truths, masks)),
    }
    for key, value in expected.items():
        assert record[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_eval_image_metrics_match_numpy():
    from gantool.tools.evaluate import image_metrics

    pred, truth, mask = _pair(seed=4)
    got = image_metrics(pred.transpose(1, 2, 0), truth.transpose(1, 2, 0), mask[0])
    rows, cols = slice(3, 9), slice(4, 15)  # SSIM in the hole: over its bounding box
    expected = {
        "psnr": np_psnr(pred, truth),
        "psnr_hole": np_psnr(pred, truth, mask),
        "l1": np_l1(pred, truth),
        "l1_hole": np_l1(pred, truth, mask),
        "ssim": np_ssim(pred, truth),
        "ssim_hole": np_ssim(pred[:, rows, cols], truth[:, rows, cols]),
    }
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


# ----------------------------------------------------- step functions against the formulas


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize("adversarial", [False, True])
def test_generator_step_gradient_is_recon_weight_times_hole_mse_plus_alpha_times_bce_real(adversarial):
    """G's gradient after gantool's generator_step equals the gradient of
    w * mean((G - x)^2 over the hole) + alpha * mean(-log sigmoid(D(G))), computed here."""
    w, alpha = 2.5, 0.7
    cfg = tiny_train_config(recon_weight=w, alpha=alpha)
    nets = tiny_networks(cfg=cfg)
    real, mask, corners = tiny_batch(cfg)
    g_ref, d_ref = copy.deepcopy(nets.generator), copy.deepcopy(nets.discriminator)
    opt_g = torch.optim.SGD(nets.generator.parameters(), lr=0.0)  # the grads stay readable, weights fixed
    fake = nets.generator(real, mask)
    generator_step(nets, opt_g, real, fake, mask, corners, cfg, no_autocast(), adversarial=adversarial)

    ref_fake = g_ref(real, mask)
    hole = mask.expand_as(real) > 0.5
    loss = w * ((ref_fake - real)[hole] ** 2).mean()
    if adversarial:
        logits = d_ref(crop_local(ref_fake, corners, cfg.local_size), ref_fake)
        loss = loss + alpha * torch.log1p(torch.exp(-logits)).mean()
    expected = torch.autograd.grad(loss, list(g_ref.parameters()), allow_unused=True)
    for got, want in zip(_grads(nets.generator), expected):
        # autograd through gantool's losses vs these formulas (log1p(exp(-x)) for BCE-with-logits):
        # equal in exact arithmetic, so the tolerance is rounding only (tests/numerics.py).
        want = torch.zeros_like(got) if want is None else want
        assert_fp32_close(got, want, real[:, 0].numel())


def test_discriminator_step_gradient_is_alpha_times_half_the_bce_sum():
    alpha = 0.7
    cfg = tiny_train_config(alpha=alpha)
    nets = tiny_networks(cfg=cfg)
    real, mask, corners = tiny_batch(cfg)
    with torch.no_grad():
        fake = nets.generator(real, mask)
    d_ref = copy.deepcopy(nets.discriminator)
    opt_d = torch.optim.SGD(nets.discriminator.parameters(), lr=0.0)
    discriminator_step(nets, opt_d, real, fake, corners, cfg, no_autocast())

    r = d_ref(crop_local(real, corners, cfg.local_size), real)
    f = d_ref(crop_local(fake, corners, cfg.local_size), fake)
    loss = alpha * (torch.log1p(torch.exp(-r)).mean() + torch.log1p(torch.exp(f)).mean()) / 2
    for got, want in zip(_grads(nets.discriminator), torch.autograd.grad(loss, list(d_ref.parameters()))):
        assert_fp32_close(got, want, real[:, 0].numel())  # equal in exact arithmetic: rounding only


# ------------------------------------------------------------------- direction of learning


def _d_means(nets, real, fake, corners, local_size) -> tuple[float, float]:
    """D's mean logit on real and on fake, as the D step sees them (train mode, one pair call)."""
    with torch.no_grad():
        r, f = nets.run_pair(crop_local(real, corners, local_size), real, crop_local(fake, corners, local_size), fake)
    return float(r.mean()), float(f.mean())


def test_one_discriminator_step_raises_real_and_lowers_fake():
    cfg = tiny_train_config(alpha=1.0)
    nets = tiny_networks(seed=0, cfg=cfg)
    _, opt_d = build_optimizers(nets, cfg)
    real, mask, corners = tiny_batch(cfg, seed=0)
    with torch.no_grad():
        fake = nets.generator(real, mask)
    real_before, fake_before = _d_means(nets, real, fake, corners, cfg.local_size)
    discriminator_step(nets, opt_d, real, fake, corners, cfg, no_autocast())
    real_after, fake_after = _d_means(nets, real, fake, corners, cfg.local_size)
    assert real_after > real_before and fake_after < fake_before, (real_before, real_after, fake_before, fake_after)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_discriminator_step_widens_the_real_fake_margin(seed):
    """On other batches each mean can drift with BatchNorm; the margin always widens."""
    cfg = tiny_train_config(alpha=1.0)
    nets = tiny_networks(seed=seed, cfg=cfg)
    _, opt_d = build_optimizers(nets, cfg)
    real, mask, corners = tiny_batch(cfg, seed=seed)
    with torch.no_grad():
        fake = nets.generator(real, mask)
    before = _d_means(nets, real, fake, corners, cfg.local_size)
    discriminator_step(nets, opt_d, real, fake, corners, cfg, no_autocast())
    after = _d_means(nets, real, fake, corners, cfg.local_size)
    assert after[0] - after[1] > before[0] - before[1], (before, after)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_adversarial_generator_step_raises_d_on_the_fake(seed):
    """Joint phase, reconstruction weight 0: after G's step D calls G's new output more real."""
    cfg = tiny_train_config(alpha=1.0, recon_weight=0.0)
    nets = tiny_networks(seed=seed, cfg=cfg)
    opt_g, _ = build_optimizers(nets, cfg)
    real, mask, corners = tiny_batch(cfg, seed=seed)

    def d_on_fake() -> float:
        with torch.no_grad():
            fake = nets.generator(real, mask)
            return float(nets.discriminator(crop_local(fake, corners, cfg.local_size), fake).mean())

    before = d_on_fake()
    fake = nets.generator(real, mask)
    generator_step(nets, opt_g, real, fake, mask, corners, cfg, no_autocast(), adversarial=True)
    assert d_on_fake() > before


# ------------------------------------------------------------------------ export folding


def test_folded_generator_computes_what_the_eager_one_does():
    generator = briefly_trained_generator(TINY_CONFIG, seed=5)  # BN statistics far from their defaults
    folded = fold_batchnorm(generator)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    image, mask = torch.rand(2, 3, 32, 24), torch.zeros(2, 1, 32, 24)
    mask[..., 6:20, 4:16] = 1
    with torch.no_grad():
        # BN folded into the conv weights: equal in exact arithmetic, rounded differently per layer.
        assert_fp32_close(folded(image, mask), generator(image, mask), conv_fan_in(generator))

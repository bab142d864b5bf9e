"""GLCIC losses and image-quality metrics.

G loss = recon_weight * MSE(inside the hole) + alpha * BCE(D(G), real)
D loss = alpha * (BCE(D(real), real) + BCE(D(G.detach()), fake)) / 2
The discriminator returns logits; BCE-with-logits is the numerically stable
form of GLCIC's sigmoid + BCE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def hole_mse(output: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error over hole pixels (all channels); 0 for an empty mask."""
    mask = mask.expand_as(output)
    return ((output - target) ** 2 * mask).sum() / mask.sum().clamp_min(1.0)


def discriminator_loss(real_logits: Tensor, fake_logits: Tensor, alpha: float) -> Tensor:
    real = F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
    fake = F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
    return alpha * (real + fake) / 2


def generator_adversarial_loss(fake_logits: Tensor, alpha: float) -> Tensor:
    """The generator wants D to call its output real."""
    return alpha * F.binary_cross_entropy_with_logits(fake_logits, torch.ones_like(fake_logits))


# ----------------------------------------------------------------------------- metrics


def psnr(prediction: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-image PSNR in dB for [0, 1] images; inside ``mask`` only when given.

    Identical images give +inf.
    """
    err = (prediction.float() - target.float()) ** 2
    if mask is None:
        mse = err.flatten(1).mean(1)
    else:
        m = mask.float().expand_as(err)
        mse = (err * m).flatten(1).sum(1) / m.flatten(1).sum(1).clamp_min(1.0)
    return 10 * torch.log10(1.0 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> Tensor:
    x = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return g


def ssim(prediction: Tensor, target: Tensor) -> Tensor:
    """Per-image SSIM (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5,
    K1 = 0.01, K2 = 0.03, data range 1), averaged over channels and valid windows."""
    x, y = prediction.float(), target.float()
    channels = x.shape[1]
    size = min(11, x.shape[-1], x.shape[-2])
    g = _gaussian_window(size).to(x.device)
    wx = g.view(1, 1, 1, -1).repeat(channels, 1, 1, 1)
    wy = g.view(1, 1, -1, 1).repeat(channels, 1, 1, 1)

    def blur(t: Tensor) -> Tensor:
        return F.conv2d(F.conv2d(t, wx, groups=channels), wy, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    sxx = blur(x * x) - mu_x**2
    syy = blur(y * y) - mu_y**2
    sxy = blur(x * y) - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    return s.flatten(1).mean(1)


def l1(prediction: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
    err = (prediction.float() - target.float()).abs()
    if mask is None:
        return err.flatten(1).mean(1)
    m = mask.float().expand_as(err)
    return (err * m).flatten(1).sum(1) / m.flatten(1).sum(1).clamp_min(1.0)

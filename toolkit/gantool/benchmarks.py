"""Benchmarks: medians and ratios measured side by side in one process.

``bench_train`` times gantool's joint training step against a reproduction of
GLCIC-PyTorch's phase-3 iteration on the same networks, batch and machine
(fp32, NCHW, Adadelta, sigmoid + BCE, and D's weight gradients computed during
G's backward, as that implementation does). Never used by tests for timing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from gantool.config import TrainConfig
from gantool.networks import CompletionNetwork, ContextDiscriminator, crop_local
from gantool.train import (
    DiscriminatorPair,
    Networks,
    amp_supported,
    autocast_for,
    build_optimizers,
    resolve_device,
    train_step,
)


def _timed(step: Callable[[], None], steps: int, warmup: int, device: torch.device) -> list[float]:
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _random_batch(cfg: TrainConfig, device: torch.device, memory_format: torch.memory_format):
    g = torch.Generator().manual_seed(0)
    real = torch.rand(cfg.batch_size, 3, cfg.size, cfg.size, generator=g)
    mask = torch.zeros(cfg.batch_size, 1, cfg.size, cfg.size)
    corners = torch.randint(0, cfg.size - cfg.local_size + 1, (cfg.batch_size, 2), generator=g)
    for m, (t, l) in zip(mask, corners.tolist()):
        q = cfg.local_size // 4
        m[:, t + q : t + 3 * q, l + q : l + 3 * q] = 1
    return real.to(device, memory_format=memory_format), mask.to(device, memory_format=memory_format), corners


def gantool_step_fn(cfg: TrainConfig, device: torch.device, amp: bool, channels_last: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    model_cfg = cfg.model_config()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    g = CompletionNetwork(model_cfg).to(device, memory_format=fmt)
    d = ContextDiscriminator(model_cfg).to(device, memory_format=fmt)
    nets = Networks(g, d, g, DiscriminatorPair(d))
    opt_g, opt_d = build_optimizers(nets, cfg)
    batch = _random_batch(cfg, device, fmt)
    autocast = autocast_for(device, amp)
    return lambda: train_step("joint", nets, opt_g, opt_d, batch, cfg, autocast)


def reference_step_fn(cfg: TrainConfig, device: torch.device) -> Callable[[], None]:
    """GLCIC-PyTorch's phase-3 iteration, reproduced for timing (same networks)."""
    torch.manual_seed(0)
    model_cfg = cfg.model_config()
    g = CompletionNetwork(model_cfg).to(device)
    d = ContextDiscriminator(model_cfg).to(device)
    opt_g, opt_d = torch.optim.Adadelta(g.parameters()), torch.optim.Adadelta(d.parameters())
    real, mask, corners = _random_batch(cfg, device, torch.contiguous_format)
    ones = torch.ones(cfg.batch_size, device=device)
    zeros = torch.zeros(cfg.batch_size, device=device)

    def step() -> None:
        output = g(real, mask)
        fake = output.detach()
        loss_fake = F.binary_cross_entropy(torch.sigmoid(d(crop_local(fake, corners, cfg.local_size), fake)), zeros)
        loss_real = F.binary_cross_entropy(torch.sigmoid(d(crop_local(real, corners, cfg.local_size), real)), ones)
        ((loss_fake + loss_real) * cfg.alpha / 2).backward()
        opt_d.step()
        opt_d.zero_grad()  # before G's backward: D's weight grads are computed (and leak) below
        loss_rec = F.mse_loss(output * mask, real * mask)
        loss_adv = F.binary_cross_entropy(torch.sigmoid(d(crop_local(output, corners, cfg.local_size), output)), ones)
        ((loss_rec + cfg.alpha * loss_adv) / 2).backward()
        opt_g.step()
        opt_g.zero_grad()

    return step


def bench_train(
    size: int = 160,
    local_size: int = 96,
    batch_size: int = 8,
    width: int = 64,
    steps: int = 5,
    warmup: int = 2,
    device: str = "auto",
    amp: bool | None = None,
    channels_last: bool | None = None,
    reference: bool = True,
) -> dict[str, Any]:
    """Median seconds per joint iteration and images/s, for gantool and (optionally)
    the reference loop, with their ratio."""
    dev = resolve_device(device)
    amp = amp_supported(dev) if amp is None else amp
    channels_last = True if channels_last is None else channels_last
    cfg = TrainConfig(size=size, local_size=local_size, batch_size=batch_size, width=width).validate()
    rows = []
    runs = [("gantool", gantool_step_fn(cfg, dev, amp, channels_last), {"amp_bf16": amp, "channels_last": channels_last})]
    if reference:
        runs.append(("reference (GLCIC-PyTorch phase 3)", reference_step_fn(cfg, dev), {"amp_bf16": False, "channels_last": False}))
    for name, fn, flags in runs:
        times = _timed(fn, steps, warmup, dev)
        median = statistics.median(times)
        rows.append({"name": name, **flags, "median_s_per_iter": median, "images_per_s": batch_size / median,
                     "min_s": min(times), "max_s": max(times), "steps": steps})
    result: dict[str, Any] = {
        "benchmark": "train",
        "device": str(dev),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "size": size, "local_size": local_size, "batch_size": batch_size, "width": width,
        "rows": rows,
    }
    if reference:
        result["speedup_vs_reference"] = rows[1]["median_s_per_iter"] / rows[0]["median_s_per_iter"]
    return result

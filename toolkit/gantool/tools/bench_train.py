"""`gantool bench train`: gantool's joint training step against a reproduction of
GLCIC-PyTorch's phase-3 iteration on the same networks, batch and machine (fp32, NCHW,
Adadelta, sigmoid + BCE, and D's weight gradients computed during G's backward, as that
implementation does). The two loops are timed round by round and the speed-up is the
median of the paired rounds' ratios, with its spread. Never used by tests for timing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from gantool.core.config import BENCH_TRAIN_BATCH, TrainConfig
from gantool.core.errors import InputError
from gantool.nn.networks import CompletionNetwork, ContextDiscriminator, crop_local
from gantool.tools.interleave import interleaved, paired_ratio
from gantool.training.loop import (
    DiscriminatorPair,
    Networks,
    autocast_for,
    build_optimizers,
    resolve_device,
    train_step,
    use_amp,
    use_channels_last,
)


def _random_batch(cfg: TrainConfig, device: torch.device, memory_format: torch.memory_format):
    g = torch.Generator().manual_seed(0)
    real = torch.rand(cfg.batch_size, 3, cfg.size, cfg.size, generator=g)
    mask = torch.zeros(cfg.batch_size, 1, cfg.size, cfg.size)
    corners = torch.randint(0, cfg.size - cfg.local_size + 1, (cfg.batch_size, 2), generator=g)
    for m, (t, l) in zip(mask, corners.tolist()):
        q = cfg.local_size // 4
        m[:, t + q : t + 3 * q, l + q : l + 3 * q] = 1
    return real.to(device, memory_format=memory_format), mask.to(device, memory_format=memory_format), corners


def gantool_step_fn(cfg: TrainConfig, device: torch.device, amp: bool, channels_last: bool) -> Callable[[], object]:
    torch.manual_seed(0)
    model_cfg = cfg.model_config()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    g = CompletionNetwork(model_cfg).to(device=device, memory_format=fmt)  # type: ignore[call-overload]
    d = ContextDiscriminator(model_cfg).to(device=device, memory_format=fmt)  # type: ignore[call-overload]
    nets = Networks(g, d, g, DiscriminatorPair(d))
    opt_g, opt_d = build_optimizers(nets, cfg)
    batch = _random_batch(cfg, device, fmt)
    autocast = autocast_for(device, amp)
    return lambda: train_step("joint", nets, opt_g, opt_d, batch, cfg, autocast)


def reference_step_fn(cfg: TrainConfig, device: torch.device) -> Callable[[], object]:
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
    size: int = TrainConfig.size,
    local_size: int = TrainConfig.local_size,
    batch_size: int = BENCH_TRAIN_BATCH,
    width: int = TrainConfig.width,
    steps: int = 5,
    warmup: int = 2,
    device: str = "auto",
    amp: bool | None = None,
    channels_last: bool | None = None,
    reference: bool = True,
) -> dict[str, Any]:
    """Median seconds per joint iteration and images/s, for gantool and (optionally)
    the reference loop, with their ratio.

    ``amp`` and ``channels_last`` default as in ``gantool train`` (``auto``: bf16 autocast
    with channels_last on CUDA and on CPUs with native bf16), so the default benchmark
    times the default training setup. The loops alternate step by step (A, B, B, A, ...).
    """
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 10**6:
            raise InputError(f"--{name} must be an integer in {low}..1000000, got {value!r}")
    cfg = TrainConfig(
        size=size,
        local_size=local_size,
        batch_size=batch_size,
        width=width,
        amp=amp,
        device=device,
        channels_last=channels_last,
    ).validate()
    dev = resolve_device(device)
    amp, channels_last = use_amp(cfg, dev), use_channels_last(cfg, dev)
    rows = []
    runs = [
        ("gantool", gantool_step_fn(cfg, dev, amp, channels_last), {"amp_bf16": amp, "channels_last": channels_last})
    ]
    if reference:
        runs.append(
            (
                "reference (GLCIC-PyTorch phase 3)",
                reference_step_fn(cfg, dev),
                {"amp_bf16": False, "channels_last": False},
            )
        )
    all_times = interleaved([fn for _, fn, _ in runs], steps, warmup, dev)
    for (name, _, flags), times in zip(runs, all_times):
        median = statistics.median(times)
        rows.append(
            {
                "name": name,
                **flags,
                "median_s_per_iter": median,
                "images_per_s": batch_size / median,
                "min_s": min(times),
                "max_s": max(times),
                "steps": steps,
                "times_s": times,
            }
        )
    result: dict[str, Any] = {
        "benchmark": "train",
        "device": str(dev),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "size": size,
        "local_size": local_size,
        "batch_size": batch_size,
        "width": width,
        "rows": rows,
    }
    if reference:
        paired = paired_ratio(all_times[1], all_times[0])  # reference time / gantool time, per round
        result["speedup_vs_reference"] = paired["median"]
        result["speedup_paired"] = paired
    return result

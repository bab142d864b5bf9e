"""`gantool bench train`: gantool's joint training step against a reproduction of
GLCIC-PyTorch's phase-3 iteration on the same networks, batch and machine (fp32, NCHW,
Adadelta, sigmoid + BCE, and D's weight gradients computed during G's backward, as that
implementation does). The two loops are timed round by round and the speed-up is the
median of the paired rounds' ratios, with its spread. Never used by tests for timing.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
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


def _tracked_run(uri: str, cfg: TrainConfig) -> tuple[Any, Path]:
    """An MLflow run (experiment gantool-bench) for the timed records, and its scratch run folder."""
    from gantool.core.config import toml_text
    from gantool.core.mlflow_store import MlflowStore, resolve_tracking_uri
    from gantool.training.tracking_mlflow import MlflowRunLog

    store = MlflowStore.connect(resolve_tracking_uri(uri), "gantool-bench")
    folder = Path(tempfile.mkdtemp(prefix="gantool-bench-train-"))
    run = MlflowRunLog(store, folder)
    params = {k: v for k, v in cfg.to_dict().items() if k != "out"}
    run.open(0, params, {"gantool.world_size": "1"}, toml_text(cfg.to_dict()), (cfg.lr, cfg.lr))
    return run, folder


def _block(
    step: Callable[[], Any], count: int, tracked: tuple[Any, Path] | None = None, cfg: TrainConfig | None = None
) -> Callable[[], object]:
    """``count`` training steps; tracked: then their record sent to MLflow, waited for."""
    done = [0]

    def run() -> None:
        start = time.perf_counter()
        for _ in range(count):
            losses = step()
        done[0] += count
        if tracked is not None and cfg is not None:
            seconds = time.perf_counter() - start
            record = {"step": done[0], "phase": "joint", **{k: float(v) for k, v in dict(losses).items()},
                      "images_per_s": cfg.batch_size * count / seconds, "data_wait": 0.0}  # fmt: skip
            tracked[0].train(record, cfg.lr, cfg.lr)
            tracked[0].sender.wait_idle()

    return run


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


def _check_log_every(log_every: int) -> bool:
    if isinstance(log_every, bool) or not isinstance(log_every, int) or not 1 <= log_every <= 10**6:
        raise InputError(f"--log-every must be an integer in 1..1000000, got {log_every!r}")
    return True


def _timed_runs(
    cfg: TrainConfig,
    dev: torch.device,
    amp: bool,
    channels_last: bool,
    reference: bool,
    tracked: tuple[Any, Path] | None,
    log_every: int,
) -> list[tuple[str, Callable[[], object], dict[str, bool]]]:
    """The rows to time: gantool's step, and the reference loop, or (with ``tracked``) blocks of
    ``log_every`` steps without and with sending their record to the MLflow run."""
    gantool = gantool_step_fn(cfg, dev, amp, channels_last)
    flags = {"amp_bf16": amp, "channels_last": channels_last}
    if tracked is not None:
        return [
            (f"gantool, {log_every} steps", _block(gantool, log_every), flags),
            (f"gantool + MLflow, {log_every} steps", _block(gantool, log_every, tracked, cfg), flags),
        ]
    runs = [("gantool", gantool, flags)]
    if reference:
        runs.append(
            (
                "reference (GLCIC-PyTorch phase 3)",
                reference_step_fn(cfg, dev),
                {"amp_bf16": False, "channels_last": False},
            )
        )
    return runs


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
    mlflow: str | None = None,
    log_every: int = TrainConfig.log_every,
) -> dict[str, Any]:
    """Median seconds per joint iteration and images/s, for gantool and (optionally)
    the reference loop, with their ratio.

    ``mlflow`` (a tracking URI) times MLflow tracking's cost instead of the reference: each
    timed call is ``log_every`` steps, and the tracked row then sends that block's record to
    an MLflow run in the store and waits until the store has it (an upper bound of what a run
    pays: in ``gantool train`` the sending overlaps the next steps). The run is deleted after.

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
    tracked = _tracked_run(mlflow, cfg) if mlflow is not None and _check_log_every(log_every) else None
    runs = _timed_runs(cfg, dev, amp, channels_last, reference and mlflow is None, tracked, log_every)
    try:
        all_times = interleaved([fn for _, fn, _ in runs], steps, warmup, dev)
    finally:
        if tracked is not None:
            tracked[0].close("FINISHED", trained=False)  # deleted: a benchmark is not a run
            shutil.rmtree(tracked[1], ignore_errors=True)
    per_call = log_every if tracked is not None else 1  # steps in one timed call
    for (name, _, flags), block_times in zip(runs, all_times):
        times = [t / per_call for t in block_times]
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
    if tracked is not None:
        result["mlflow_overhead"] = paired_ratio(all_times[1], all_times[0])  # tracked time / plain time, per block
        result["log_every"] = log_every
    elif reference:
        paired = paired_ratio(all_times[1], all_times[0])  # reference time / gantool time, per round
        result["speedup_vs_reference"] = paired["median"]
        result["speedup_paired"] = paired
    return result

"""What a run is built from: the device, bf16 autocast, the networks, the optimizers, RNG state."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gantool.core.config import ModelConfig, TrainConfig
from gantool.core.cpu import onednn_bf16_capped
from gantool.core.errors import CheckpointError, InputError, first_line
from gantool.nn.networks import CompletionNetwork, ContextDiscriminator
from gantool.training.distributed import DistributedContext, sync_batchnorm_supported
from gantool.training.steps import DiscriminatorPair, Networks


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(
            "--device cuda was requested but torch sees no CUDA device (torch.cuda.is_available() is False)"
        )
    return torch.device(name)


def amp_supported(device: torch.device) -> bool:
    """bf16 autocast is worth it on CUDA and on CPUs with native bf16 (AVX512-BF16 / AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_native_bf16()


# torch's own CPU probes (private in torch 2.13, hence looked up by name). Not
# get_cpu_capability(): it says "AVX512" on AVX-512 CPUs without BF16 too.
_CPU_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
_CPUINFO_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 flags; "bf16" is the Arm feature
CPUINFO = Path("/proc/cpuinfo")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU does bf16 arithmetic in hardware (AVX512-BF16, AMX or Arm BF16), and this
    process lets oneDNN use it (not capped below by ``ONEDNN_MAX_CPU_ISA``: then it is an older CPU)."""
    if onednn_bf16_capped():
        return False
    probes = [getattr(torch.cpu, name, None) for name in _CPU_BF16_PROBES]
    if any(probe is not None and probe() for probe in probes):
        return True
    try:  # Arm, or a torch without the probes
        words = CPUINFO.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return False
    return not _CPUINFO_BF16_FLAGS.isdisjoint(words)


def autocast_for(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def build_networks(
    model_cfg: ModelConfig, cfg: TrainConfig, device: torch.device, dist: DistributedContext
) -> Networks:
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    generator, discriminator = CompletionNetwork(model_cfg), ContextDiscriminator(model_cfg)
    if cfg.sync_bn and dist.enabled:
        if not sync_batchnorm_supported(device):
            raise InputError(
                f"--sync-bn needs GPUs: torch's SyncBatchNorm does not run on {device.type} tensors; "
                "drop --sync-bn (each process then normalizes with its own batch statistics)"
            )
        generator = nn.SyncBatchNorm.convert_sync_batchnorm(generator)
        discriminator = nn.SyncBatchNorm.convert_sync_batchnorm(discriminator)
    memory_format = torch.channels_last if use_channels_last(cfg, device) else torch.contiguous_format
    generator.to(device=device, memory_format=memory_format)  # type: ignore[call-overload]
    discriminator.to(device=device, memory_format=memory_format)  # type: ignore[call-overload]
    run_generator, run_pair = dist.wrap(generator), dist.wrap(DiscriminatorPair(discriminator))
    if cfg.compile:
        run_generator, run_pair = torch.compile(run_generator), torch.compile(run_pair)  # type: ignore[assignment]
    return Networks(generator, discriminator, run_generator, run_pair)


def use_channels_last(cfg: TrainConfig, device: torch.device) -> bool:
    """channels_last: as chosen, else on for CUDA and wherever bf16 autocast runs (it pays together)."""
    return cfg.channels_last if cfg.channels_last is not None else device.type == "cuda" or use_amp(cfg, device)


def use_amp(cfg: TrainConfig, device: torch.device) -> bool:
    """bf16 autocast: as chosen, else ("auto") on where it is native: CUDA, or a CPU with AVX512-BF16/AMX/Arm BF16."""
    return cfg.amp if cfg.amp is not None else amp_supported(device)


def build_optimizers(nets: Networks, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    opt_g = torch.optim.Adam(nets.generator.parameters(), lr=cfg.lr, betas=cfg.betas)
    opt_d = torch.optim.Adam(nets.discriminator.parameters(), lr=cfg.lr_d or cfg.lr, betas=cfg.betas)
    return opt_g, opt_d


def rng_state() -> dict[str, Any]:
    """Global RNG states as plain containers and tensors (weights_only-loadable)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),  # type: ignore[attr-defined]
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back :func:`rng_state`'s streams; a hand-edited or foreign state is a one-line CheckpointError."""
    try:
        torch.set_rng_state(state["torch"])
        random.setstate(_as_tuple(state["python"]))
        n = state["numpy"]
        np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise CheckpointError(f"cannot resume: the checkpoint's rng state is not valid ({first_line(e)})") from None
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value

"""The GLCIC training loop, correct by construction.

Each joint step:
  1. fake = G(masked real)                       (one generator forward)
  2. D on the real images and on fake.detach();  D step
  3. a FRESH D pass on fake (not detached), D frozen (requires_grad off);
     adversarial + reconstruction loss;          G step
No retain_graph anywhere, no discriminator output reused across backward
calls, and no gradient of G's loss ever lands in D's parameters.

Phases follow GLCIC: reconstruction only (``steps_g``), discriminator only
(``steps_d``), then joint (``steps_joint``).

:func:`train` is the whole run (importable, testable); the step functions
below it are the loop's body.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from gantool.core.config import ModelConfig, TrainConfig, check_options, toml_text
from gantool.core.constants import CHECKPOINTS_DIR, LAST_CHECKPOINT, METRICS_FILE, RUN_CONFIG_FILE, SAMPLES_DIR
from gantool.core.errors import CheckpointError, GantoolError, InputError, TrainingError
from gantool.core.fileio import atomic_save, atomic_write_text, ensure_writable_dir
from gantool.core.processing import to_uint8
from gantool.nn.losses import discriminator_loss, generator_adversarial_loss, hole_mse, l1, psnr, ssim
from gantool.nn.networks import CompletionNetwork, ContextDiscriminator, crop_local
from gantool.training.checkpoint import load_checkpoint, save_checkpoint
from gantool.training.data import (
    InpaintingDataset,
    StepBatchSampler,
    estimate_fill,
    holdout_count,
    open_source,
    validation_batch,
)
from gantool.training.distributed import (
    DistributedContext,
    seed_rank,
    setup_distributed,
    sync_batchnorm_supported,
)
from gantool.training.runfolder import RunPlan, claim_run_folder, lock_run_folder, plan_run_folder, trim_metrics
from gantool.training.tracking import RunTracker, summary_writer_class

log = logging.getLogger(__name__)

PHASE_NAMES = {"g": "completion", "d": "discriminator", "joint": "joint"}


def phase_at(step: int, cfg: TrainConfig) -> str:
    if step < cfg.steps_g:
        return "g"
    return "d" if step < cfg.steps_g + cfg.steps_d else "joint"


# ------------------------------------------------------------------------ the step functions


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


# --------------------------------------------------------------------------------- set-up


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
    """Whether this CPU does bf16 arithmetic in hardware (AVX512-BF16, AMX or Arm BF16)."""
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
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


# ------------------------------------------------------------------------------ the run


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    phase: str
    last_checkpoint: Path | None
    interrupted: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    rank: int = 0  # under torchrun, only rank 0 wrote files (and should print)
    stop_signal: int | None = None  # the signal that stopped the run (SIGINT, SIGTERM), if any

    @property
    def exit_code(self) -> int:
        """0, or 128 + the stopping signal (130 for Ctrl-C, 143 for SIGTERM), as a shell reports it."""
        if not self.interrupted:
            return 0
        return 128 + (self.stop_signal or signal.SIGINT)


# Stop at the next step boundary with a checkpoint: Ctrl-C, and what SLURM, Kubernetes,
# `timeout` and torchrun send to end a job.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Write a checkpoint at the next step boundary and keep training (POSIX only).
CHECKPOINT_SIGNAL: signal.Signals | None = getattr(signal, "SIGUSR1", None)


class _StopFlag:
    """Signals set flags the loop checks at step boundaries.

    SIGINT and SIGTERM ask the run to stop (a second one aborts at once);
    SIGUSR1 asks for a checkpoint now. Under torchrun the launcher forwards the
    signal it gets (Ctrl-C's SIGINT, a scheduler's SIGTERM) to its workers, which
    run in their own sessions, and sends SIGKILL 30 s later (--shutdown-timeout).
    """

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.checkpoint_requested = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if not threading_main():
            yield
            return

        def stop(signum: int, frame: Any) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.requested, self.signum = True, signum

        def checkpoint_now(signum: int, frame: Any) -> None:
            self.checkpoint_requested = True

        handlers: dict[signal.Signals, Any] = {sig: stop for sig in STOP_SIGNALS}
        if CHECKPOINT_SIGNAL is not None:
            handlers[CHECKPOINT_SIGNAL] = checkpoint_now
        previous = {sig: signal.getsignal(sig) for sig in handlers}
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


MODEL_KEYS = ("size", "local_size", "width", "disc_width", "disc_fc")


def prepare_run(
    options: TrainConfig | Mapping[str, Any], resume: str | Path | None
) -> tuple[TrainConfig, dict[str, Any] | None, RunPlan]:
    """Resolve and check the config, the resume state and where the run writes.

    Writes nothing: every option is checked (name, type, range) before a folder
    exists. ``options`` is a full TrainConfig, or a mapping of explicitly chosen
    options applied on top of the defaults, or on top of the checkpoint's own
    config when resuming (a resumed run keeps its schedule, data and model
    unless told otherwise).
    """
    chosen = check_options(dict(options)) if not isinstance(options, TrainConfig) else None
    state = load_checkpoint(resume) if resume is not None else None
    if state is not None and ("train_config" not in state or "opt_g" not in state):
        raise CheckpointError(f"{resume} has no training state (was it exported weights?)")
    if isinstance(options, TrainConfig):
        cfg = options
    else:
        base = TrainConfig.from_dict(state["train_config"]).replace(out=None) if state else TrainConfig()
        cfg = base.replace(**(chosen or {}))
    if state is not None:
        saved = TrainConfig.from_dict(state["train_config"])
        clashes = [k for k in MODEL_KEYS if getattr(saved, k) != getattr(cfg, k)]
        if clashes:
            raise InputError(f"--resume: {', '.join(clashes)} differ from the checkpoint's model")
    cfg.validate()
    step = int(state["step"]) if state is not None else 0
    if step >= cfg.total_steps:
        raise InputError(
            f"the checkpoint is at step {step}, already past the schedule's {cfg.total_steps} steps; "
            "raise --steps-joint"
        )
    return cfg, state, plan_run_folder(cfg.out, resume, state)


def train(
    cfg: TrainConfig | Mapping[str, Any],
    resume: str | Path | None = None,
    stop_after: int | None = None,
    progress: bool = True,
) -> TrainResult:
    """Run (or resume) training. ``stop_after`` ends the run early after that step
    count (checkpointing it), as an interrupted run would."""
    cfg, state, plan = prepare_run(cfg, resume)
    if cfg.tensorboard:
        summary_writer_class()  # a missing extra fails here, before any folder exists
    source = open_source(cfg.data, cfg.seed)  # a bad --data fails before a run folder exists
    dist = setup_distributed(cfg.device)
    release = None
    try:
        device = dist.device or resolve_device(cfg.device)
        run_dir, release = _claim_on_rank0(plan, dist)
        return _train(cfg.replace(out=str(run_dir)), state, run_dir, source, device, dist, stop_after, progress)
    finally:
        if release is not None:
            release()
        dist.shutdown()


def _claim_on_rank0(plan: RunPlan, dist: DistributedContext) -> tuple[Path, Any]:
    """Rank 0 makes (or reuses) the run folder and locks it; every rank gets its path
    (or its error). Returns the path and rank 0's lock release (None elsewhere)."""
    run_dir, error, release = None, None, None
    if dist.is_main:
        try:
            run_dir = claim_run_folder(plan)
            release = lock_run_folder(run_dir)
        except GantoolError as e:
            if not dist.enabled:
                raise
            error = str(e)
    run_dir, error = dist.broadcast_object((run_dir, error))
    if error or run_dir is None:
        raise InputError(error or "the run folder could not be made")
    return run_dir, release


def _train(
    cfg: TrainConfig,
    state: dict[str, Any] | None,
    run_dir: Path,
    source: Any,
    device: torch.device,
    dist: DistributedContext,
    stop_after: int | None,
    progress: bool,
) -> TrainResult:
    amp = use_amp(cfg, device)
    if amp and not amp_supported(device) and dist.is_main:
        log.warning("bf16 autocast is not natively supported on this %s; it will be slow", device.type)
    if cfg.sync_bn and not dist.enabled and dist.is_main:
        log.warning("--sync-bn has no effect in a single process (launch with torchrun for several)")
    if source.skipped and dist.is_main:
        log.warning("skipped %d unreadable file(s) in %s (first: %s)", len(source.skipped), cfg.data, source.skipped[0])
    held = holdout_count(source, cfg.val_images)
    fill = tuple(state["model_config"]["fill"]) if state else (cfg.fill or estimate_fill(source, cfg.size))
    model_cfg = cfg.model_config(fill)

    nets = build_networks(model_cfg, cfg, device, dist)
    opt_g, opt_d = build_optimizers(nets, cfg)
    step = 0
    if state is not None:
        nets.generator.load_state_dict(state["generator"])
        nets.discriminator.load_state_dict(state["discriminator"])
        opt_g.load_state_dict(state["opt_g"])
        opt_d.load_state_dict(state["opt_d"])
        restore_rng_state(state["rng"])  # rank 0's streams
        step = int(state["step"])
    if dist.rank > 0:
        seed_rank(cfg.seed, dist.rank, step)

    train_items = len(source) - held if cfg.data != "synthetic" else len(source)
    val = validation_batch(source, cfg.val_images, cfg.size, cfg.local_size, cfg.mask, cfg.hole_range(), cfg.seed)
    val = tuple(t.to(device) for t in val)  # type: ignore[assignment]
    end = min(cfg.total_steps, stop_after) if stop_after is not None else cfg.total_steps
    # Each rank takes its contiguous share of the same step-indexed global batch
    # (the DistributedSampler role; exact on resume, independent of the rank count).
    sampler = StepBatchSampler(train_items, cfg.batch_size, cfg.seed, step, end, dist.rank, dist.world_size)
    dataset = InpaintingDataset(source, cfg.size, cfg.local_size, cfg.mask, cfg.hole_range())
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=cfg.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=False,
    )
    setup_error: str | None = None
    if dist.is_main:
        try:
            for sub in (CHECKPOINTS_DIR, SAMPLES_DIR):
                ensure_writable_dir(run_dir / sub)
            chosen = {"amp": amp, "channels_last": use_channels_last(cfg, device)}  # what "auto" chose here
            atomic_write_text(run_dir / RUN_CONFIG_FILE, toml_text({**cfg.to_dict(), **chosen}))
            trim_metrics(run_dir / METRICS_FILE, step)  # a killed run may have logged past its checkpoint
        except GantoolError as e:
            if not dist.enabled:
                raise
            setup_error = str(e)
        if not held and cfg.data != "synthetic":
            log.warning("only %d image(s): validation uses training images (not held out)", len(source))
    setup_error = dist.broadcast_object(setup_error)  # all ranks stop, not rank 0 alone
    if setup_error:
        raise InputError(setup_error)

    autocast = autocast_for(device, amp)
    memory_format = torch.channels_last if use_channels_last(cfg, device) else torch.contiguous_format
    result = TrainResult(run_dir, step, phase_at(step, cfg), None, rank=dist.rank)
    last_good = run_dir / CHECKPOINTS_DIR / LAST_CHECKPOINT if state is not None or step else None
    tracker = RunTracker(cfg, run_dir, step, result.phase, enabled=dist.is_main)  # rank 0 writes
    saved_step: int | None = None

    def checkpoint(at_step: int) -> Path:
        path = run_dir / CHECKPOINTS_DIR / LAST_CHECKPOINT
        save_checkpoint(
            path,
            {
                "model_config": model_cfg.to_dict(),
                "train_config": cfg.to_dict(),
                "generator": nets.generator.state_dict(),
                "discriminator": nets.discriminator.state_dict(),
                "opt_g": opt_g.state_dict(),
                "opt_d": opt_d.state_dict(),
                "step": at_step,
                "phase": phase_at(max(at_step - 1, 0), cfg),
                "rng": rng_state(),
                "metrics": result.history[-1] if result.history else {},
            },
        )
        if cfg.keep_checkpoints:
            keep = path.with_name(f"step_{at_step}.pt")
            keep.unlink(missing_ok=True)
            try:
                os.link(path, keep)  # same bytes, no second write; last.pt is later replaced by rename
            except OSError:
                atomic_save(keep, lambda tmp: tmp.write_bytes(path.read_bytes()))
        tracker.checkpointed(at_step)
        return path

    stop = _StopFlag()
    bar = _progress_bar(progress and dist.is_main, step, end)
    nets.run_generator.train()
    nets.run_pair.train()
    tick, images = time.perf_counter(), 0
    with stop.installed(), _metrics_writer(run_dir / METRICS_FILE, dist.is_main) as write_metrics, tracker:
        try:
            for batch in loader:
                phase = phase_at(step, cfg)
                batch = (
                    batch[0].to(device, non_blocking=True).contiguous(memory_format=memory_format),
                    batch[1].to(device, non_blocking=True).contiguous(memory_format=memory_format),
                    batch[2],
                )
                losses = train_step(phase, nets, opt_g, opt_d, batch, cfg, autocast)
                # Under DDP: losses averaged over ranks, and one stop decision for all of them.
                values, stop_now = dist.step_consensus(losses, stop.requested)
                bad = [k for k, v in values.items() if not math.isfinite(v)]
                if bad:
                    where = f"{last_good} is the last good checkpoint" if last_good else "no checkpoint was written yet"
                    raise TrainingError(
                        f"non-finite {', '.join(bad)} at step {step + 1} ({PHASE_NAMES[phase]} phase); "
                        f"stopped: {where}. Try a lower --lr{' or no --amp' if amp else ''}."
                    )
                step += 1
                images += batch[0].shape[0] * dist.world_size
                if step % cfg.log_every == 0 or step == end:
                    elapsed = time.perf_counter() - tick
                    record = {"step": step, "phase": phase, **values, "images_per_s": images / max(elapsed, 1e-9)}
                    tick, images = time.perf_counter(), 0
                    result.history.append(record)
                    write_metrics(record)
                    tracker.log_train(record, opt_g.param_groups[0]["lr"], opt_d.param_groups[0]["lr"])
                    bar.set_postfix_str(_postfix(record), refresh=False)
                if dist.is_main and (step % cfg.sample_every == 0 or step == end):
                    sample_path = run_dir / SAMPLES_DIR / f"step_{step}.png"
                    record = validate(nets.generator, val, step, phase, sample_path)
                    result.history.append(record)
                    write_metrics(record)
                    tracker.log_validation(record, sample_path)
                wanted = stop.checkpoint_requested and dist.is_main
                if dist.is_main and (step % cfg.checkpoint_every == 0 or step == end or wanted):
                    last_good, saved_step = checkpoint(step), step
                    if wanted:
                        stop.checkpoint_requested = False
                        log.info("checkpoint at step %d (SIGUSR1): %s", step, last_good)
                bar.update(1)
                if stop_now:
                    result.interrupted = True
                    break
        except (RuntimeError, KeyboardInterrupt) as e:
            if not stop.requested and not isinstance(e, KeyboardInterrupt):
                raise  # a real failure (DataLoader workers also die on Ctrl-C: that case is an interrupt)
            result.interrupted = True
        finally:
            bar.close()
        if result.interrupted and dist.is_main and step > result.step and saved_step != step:
            last_good = checkpoint(step)
        tracker.finish(step, phase_at(max(step - 1, 0), cfg), result.interrupted)
    dist.barrier()  # the others wait until rank 0's last checkpoint is on disk
    result.step, result.phase, result.last_checkpoint = step, phase_at(max(step - 1, 0), cfg), last_good
    result.stop_signal = stop.signum if result.interrupted else None
    return result


@torch.no_grad()
def validate(
    generator: CompletionNetwork, val: tuple[Tensor, Tensor, Tensor], step: int, phase: str, sample_path: Path
) -> dict[str, Any]:
    """Metrics on the fixed held-out batch, and a sample grid (masked | output | real)."""
    was_training = generator.training
    generator.eval()
    real, mask, _ = val
    out = generator(real, mask).float()
    generator.train(was_training)
    record = {
        "step": step,
        "phase": phase,
        "val_psnr": float(psnr(out, real).clamp(max=99).mean()),
        "val_psnr_hole": float(psnr(out, real, mask).clamp(max=99).mean()),
        "val_ssim": float(ssim(out, real).mean()),
        "val_l1": float(l1(out, real).mean()),
        "val_l1_hole": float(l1(out, real, mask).mean()),
    }
    masked = real * (1 - mask) + mask  # holes shown white
    rows = torch.cat([masked, out, real], dim=3)  # N x 3 x H x 3W
    grid = to_uint8(rows.permute(0, 2, 3, 1).reshape(-1, rows.shape[3], 3).cpu().numpy())
    from PIL import Image

    atomic_save(sample_path, lambda tmp: Image.fromarray(grid).save(tmp, format="PNG"))
    return record


@contextlib.contextmanager
def _metrics_writer(path: Path, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield lambda record: None
        return
    try:
        f = path.open("a", encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
    with f:

        def write(record: dict[str, Any]) -> None:
            try:
                f.write(json.dumps(record) + "\n")
                f.flush()
            except OSError as e:  # a full disk ends the run with one line; checkpoints stay intact
                raise InputError(f"cannot write {path}: {e.strerror or e}") from None

        yield write


def _progress_bar(enabled: bool, start: int, end: int) -> Any:
    import sys

    from tqdm.auto import tqdm

    # Redirected to a log file, a bar that redraws 10 times a second buries the log.
    interval = 0.1 if sys.stderr.isatty() else 30.0
    return tqdm(
        total=end, initial=start, disable=not enabled, unit="step", dynamic_ncols=True, leave=True, mininterval=interval
    )


def _postfix(record: dict[str, Any]) -> str:
    parts = [PHASE_NAMES[record["phase"]]]
    parts += [f"{k.removeprefix('loss_')}={v:.4g}" for k, v in record.items() if k.startswith("loss_")]
    if "d_real" in record:
        parts.append(f"D(real)={record['d_real']:.3f} D(fake)={record['d_fake']:.3f}")
    parts.append(f"{record['images_per_s']:.1f} img/s")
    return " ".join(parts)

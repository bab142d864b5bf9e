"""The training run: :func:`train` (importable, testable) around the step functions.

The step itself (what each phase computes and updates) is in
:mod:`gantool.training.steps`; what it is built from (device, networks,
optimizers, RNG state) in :mod:`gantool.training.build`; signals in
:mod:`gantool.training.signals`. This module orchestrates one run: config and
resume checks, the run folder, the data, the loop, checkpoints, metrics,
samples and the end of the run (finished, stopped by a signal, failed).

A checkpoint holds one complete step: it is written only at a step boundary.
A second stop signal mid-step (or mid-write) writes nothing, so the last
complete checkpoint stays as it was.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gantool.core.config import TrainConfig, check_options, toml_text
from gantool.core.constants import CHECKPOINTS_DIR, LAST_CHECKPOINT, METRICS_FILE, RUN_CONFIG_FILE, SAMPLES_DIR
from gantool.core.errors import CheckpointError, GantoolError, InputError, TrainingError
from gantool.core.fileio import atomic_save, atomic_write_text, ensure_writable_dir
from gantool.nn.losses import hole_mse
from gantool.training.build import (
    amp_supported,
    autocast_for,
    build_networks,
    build_optimizers,
    cpu_has_native_bf16,
    resolve_device,
    restore_rng_state,
    rng_state,
    use_amp,
    use_channels_last,
)
from gantool.training.checkpoint import check_training_state, load_checkpoint, load_training_state, save_checkpoint
from gantool.training.data import (
    InpaintingDataset,
    StepBatchSampler,
    check_data_unchanged,
    data_fingerprint,
    estimate_fill,
    holdout_count,
    open_source,
    report_source,
    report_unreadable,
    validation_batch,
)
from gantool.training.distributed import (
    DistributedContext,
    is_collective_failure,
    process_lost,
    seed_rank,
    setup_distributed,
)
from gantool.training.init_from import adopt_init_model, run_model
from gantool.training.progress import postfix, progress_bar
from gantool.training.progress import postfix as _postfix  # noqa: F401 (tests import it from here)
from gantool.training.records import metrics_writer, validate
from gantool.training.runfolder import (
    RunPlan,
    check_utf8_path,
    claim_run_folder,
    lock_run_folder,
    plan_run_folder,
    remove_untrained_run,
    resume_checkpoint,
    trim_metrics,
)
from gantool.training.signals import AbortNow, StopFlag
from gantool.training.sources import normalise_data
from gantool.training.steps import (
    PHASE_NAMES,
    DiscriminatorPair,
    Networks,
    discriminator_step,
    generator_step,
    phase_at,
    set_requires_grad,
    train_step,
)
from gantool.training.tracking import RunTracker, summary_writer_class
from gantool.training.tracking_mlflow import MlflowStore, connect_mlflow, prepare_mlflow

log = logging.getLogger(__name__)

__all__ = [  # the step and build functions stay importable from here
    "PHASE_NAMES",
    "DiscriminatorPair",
    "Networks",
    "TrainResult",
    "amp_supported",
    "autocast_for",
    "build_networks",
    "build_optimizers",
    "cpu_has_native_bf16",
    "discriminator_step",
    "generator_step",
    "hole_mse",
    "phase_at",
    "prepare_run",
    "resolve_device",
    "set_requires_grad",
    "train",
    "train_step",
    "use_amp",
    "use_channels_last",
    "validate",
]

# ------------------------------------------------------------------------------ the run


@dataclass
class TrainResult:
    run_dir: Path | None  # None: stopped before a run folder was kept (nothing was written)
    step: int
    phase: str
    last_checkpoint: Path | None
    interrupted: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    rank: int = 0  # under torchrun, only rank 0 wrote files (and should print)
    world_size: int = 1  # processes in the run (more than one under torchrun or --nproc-per-node)
    stop_signal: int | None = None  # the signal that stopped the run (SIGINT, SIGTERM), if any
    aborted: bool = False  # a second signal stopped it at once, without writing a checkpoint
    checkpoint_step: int | None = None  # the step of ``last_checkpoint``

    @property
    def exit_code(self) -> int:
        """0, or 128 + the stopping signal (130 for Ctrl-C, 143 for SIGTERM), as a shell reports it."""
        if not self.interrupted:
            return 0
        return 128 + (self.stop_signal or signal.SIGINT)


MODEL_KEYS = ("size", "local_size", "width", "disc_width", "disc_fc")


def prepare_run(
    options: TrainConfig | Mapping[str, Any], resume: str | Path | None
) -> tuple[TrainConfig, dict[str, Any] | None, RunPlan]:
    """Resolve and check the config, the resume state and where the run writes.

    Writes nothing: every option is checked (name, type, range) before a folder
    exists. ``options`` is a full TrainConfig, or a mapping of explicitly chosen
    options applied on top of the defaults, or on top of the checkpoint's own
    config when resuming (a resumed run keeps its schedule, data and model
    unless told otherwise). A relative ``data`` is made absolute here, so a
    resume from another folder trains on the same images.
    """
    chosen = check_options(dict(options)) if not isinstance(options, TrainConfig) else None
    resume = resume_checkpoint(resume) if resume is not None else None  # a run folder: its newest checkpoint
    state = load_checkpoint(resume) if resume is not None else None
    if state is not None:
        check_training_state(state, resume)  # type: ignore[arg-type]
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
    cfg = adopt_init_model(cfg, chosen, resuming=state is not None)
    cfg = prepare_mlflow(cfg.validate())  # its tracking URI absolute, so a resume finds the store
    check_utf8_path(cfg.data, "--data")
    check_utf8_path(cfg.out, "--out")
    cfg = cfg.replace(data=normalise_data(cfg.data))  # absolute and normalised: no "sub/.."
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
    allow_data_change: bool = False,
    stop: StopFlag | None = None,
) -> TrainResult:
    """Run (or resume) training. ``stop_after`` ends the run early after that step
    count (checkpointing it), as an interrupted run would.

    ``allow_data_change`` lets a resume train on a data folder other than (or
    changed from) the one its checkpoint recorded. ``stop`` is a
    :class:`StopFlag` whose handlers are already installed (the CLI installs
    them before importing torch, so an early Ctrl-C is caught too).
    """
    stop = stop or StopFlag()
    result = TrainResult(None, 0, "g", None)
    with stop.installed():
        try:
            return _run(cfg, resume, stop_after, progress, allow_data_change, stop, result)
        except AbortNow:
            result.interrupted = result.aborted = True
            result.stop_signal = stop.signum
            return result


def _run(
    cfg_in: TrainConfig | Mapping[str, Any],
    resume: str | Path | None,
    stop_after: int | None,
    progress: bool,
    allow_data_change: bool,
    stop: StopFlag,
    result: TrainResult,
) -> TrainResult:
    cfg, state, plan = prepare_run(cfg_in, resume)
    if cfg.tensorboard:
        summary_writer_class()  # a missing extra fails here, before any folder exists
    # A bad --data fails before a run folder exists; a run continued in place reuses its data index.
    index_dirs = [plan.folder] if plan.folder is not None and not plan.new else []
    source = open_source(cfg.data, cfg.seed, cfg.scale_range(), index_dirs)
    data = data_fingerprint(source, cfg.data)
    if state is not None:
        check_data_unchanged(state.get("data"), data, allow_data_change)
    store = connect_mlflow(cfg)  # rank 0: a bad URI or a dead store fails here, before a run folder exists
    dist = setup_distributed(cfg.device, cfg.collective_timeout)
    release, made = None, False
    existed = plan.folder is not None and plan.folder.exists()  # an empty --out the user made is kept
    try:
        device = dist.device or resolve_device(cfg.device)
        run_dir, release = _claim_on_rank0(plan, dist)
        made = plan.new and dist.is_main
        result.run_dir, result.rank, result.world_size = run_dir, dist.rank, dist.world_size
        _train(
            cfg.replace(out=str(run_dir)),
            state,
            run_dir / CHECKPOINTS_DIR / plan.resumed if plan.resumed else None,
            run_dir,
            source,
            data,
            device,
            dist,
            stop_after,
            progress,
            stop,
            result,
            store,
        )
        return result
    except GantoolError as e:
        cause = worker_cause(str(e))
        if cause is None:
            raise
        raise type(e)(cause) from None
    except RuntimeError as e:  # a collective outside the step loop (set-up, the final barrier)
        if dist.enabled and is_collective_failure(e):
            raise process_lost(dist, e, "outside a step") from None
        raise
    except OSError as e:  # a write no helper wrapped (a full disk under TensorBoard's writer, ...): one line
        raise InputError(f"cannot write {e.filename or result.run_dir}: {e.strerror or e}") from None
    finally:
        if release is not None:
            release()
        if made and result.run_dir is not None and remove_untrained_run(result.run_dir, keep_folder=existed):
            result.run_dir = None  # nothing was trained: the new folder is gone again
        dist.shutdown()


def worker_cause(message: str) -> str | None:
    """The one-line cause inside a DataLoader worker's re-raised error, or None for any other message.

    torch re-raises an error of a worker process in the main one as "Caught X in
    DataLoader worker process N." followed by the worker's traceback; its last
    line is "module.X: the message".
    """
    if not message.startswith("Caught ") or "DataLoader worker" not in message.split("\n", 1)[0]:
        return None
    last = [line for line in message.splitlines() if line.strip()][-1]
    head, sep, rest = last.partition(": ")
    return rest if sep and " " not in head else last


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


# long: nanoGPT-style, the whole loop reads at once: set-up calls, then the step loop with its checkpoint, sample and signal points
def _train(
    cfg: TrainConfig,
    state: dict[str, Any] | None,
    resumed: Path | None,
    run_dir: Path,
    source: Any,
    data: dict[str, Any],
    device: torch.device,
    dist: DistributedContext,
    stop_after: int | None,
    progress: bool,
    stop: StopFlag,
    result: TrainResult,
    store: MlflowStore | None = None,
) -> None:
    amp = use_amp(cfg, device)
    if amp and not amp_supported(device) and dist.is_main:
        log.warning("bf16 autocast is not natively supported on this %s; it will be slow", device.type)
    if cfg.sync_bn and not dist.enabled and dist.is_main:
        log.warning("--sync-bn has no effect in a single process (launch with torchrun for several)")
    if dist.is_main:
        report_source(source, cfg.data)
    if state is not None:
        source.mark_unreadable(state.get("data_unreadable") or [])  # the count goes on across a resume
    held = holdout_count(source, cfg.val_images)
    train_items = len(source) - held if cfg.data != "synthetic" else len(source)
    source.train_count = train_items  # a file that fails to decode is replaced by another training image
    val = validation_batch(source, cfg.val_images, cfg.size, cfg.local_size, cfg.mask, cfg.hole_range(), cfg.seed)
    fill = (
        tuple(state["model_config"]["fill"])
        if state
        else (cfg.fill or estimate_fill(source, cfg.size, channel_shuffle=cfg.channel_shuffle))
    )
    model_cfg, init = run_model(cfg, fill, state)

    nets = build_networks(model_cfg, cfg, device, dist)
    opt_g, opt_d = build_optimizers(nets, cfg)
    step = 0
    if state is not None:
        load_training_state(state, nets, opt_g, opt_d)
        restore_rng_state(state["rng"])  # rank 0's streams
        step = int(state["step"])
    elif init is not None:
        init.load_into(nets.generator, nets.discriminator)
    if dist.rank > 0:
        seed_rank(cfg.seed, dist.rank, step)

    val = tuple(t.to(device) for t in val)  # type: ignore[assignment]
    end = min(cfg.total_steps, stop_after) if stop_after is not None else cfg.total_steps
    # Each rank takes its contiguous share of the same step-indexed global batch
    # (the DistributedSampler role; exact on resume, independent of the rank count).
    sampler = StepBatchSampler(train_items, cfg.batch_size, cfg.seed, step, end, dist.rank, dist.world_size)
    dataset = InpaintingDataset(source, cfg.size, cfg.local_size, cfg.mask, cfg.hole_range(), cfg.channel_shuffle)
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
            source.keep_index(run_dir)  # --resume reads the file list from here (best effort)
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
    dist.start_steps()  # a process that stops answering from here on ends the run within the timeout

    autocast = autocast_for(device, amp)
    memory_format = torch.channels_last if use_channels_last(cfg, device) else torch.contiguous_format
    result.step, result.phase = step, phase_at(step, cfg)
    # The run's own newest checkpoint: the one resumed in place, none yet in a new folder (a branch
    # from another run's checkpoint, which is not this run's to name).
    last_good = resumed
    result.last_checkpoint, result.checkpoint_step = last_good, (step if last_good else None)
    tags = {"gantool.data_fingerprint": json.dumps(data), "gantool.world_size": str(dist.world_size)}
    tracker = RunTracker(cfg, run_dir, step, result.phase, enabled=dist.is_main, mlflow=store, tags=tags)  # rank 0
    tracker.data_status = source.status
    tracker.checkpoint_step = result.checkpoint_step  # status.json's: none yet in a branch's new folder
    saved_step: int | None = None
    start_step = step

    def checkpoint(at_step: int) -> Path:
        path = run_dir / CHECKPOINTS_DIR / LAST_CHECKPOINT
        before = _file_id(path)
        try:
            _save(path, at_step)
        except (AbortNow, CheckpointError) as e:
            if isinstance(e, CheckpointError) and not stop.aborted:
                raise  # else a second signal inside torch's writer, which turned it into a write error
            if _file_id(path) not in (None, before):  # cut short after the rename: the new file is whole, and last
                result.last_checkpoint, result.checkpoint_step = path, at_step
                tracker.checkpoint_step = at_step  # the tracker's "stopped" record names it
            raise AbortNow from None
        if cfg.keep_checkpoints:
            keep = path.with_name(f"step_{at_step}.pt")
            keep.unlink(missing_ok=True)
            try:
                os.link(path, keep)  # same bytes, no second write; last.pt is later replaced by rename
            except OSError:
                atomic_save(keep, lambda tmp: tmp.write_bytes(path.read_bytes()))
        result.last_checkpoint, result.checkpoint_step = path, at_step
        tracker.checkpointed(at_step, path)
        return path

    def _save(path: Path, at_step: int) -> None:
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
                "data": data,
                "data_unreadable": source.unreadable_indices(),
                "metrics": result.history[-1] if result.history else {},
            },
        )

    bar = progress_bar(progress and dist.is_main, step, end)
    nets.run_generator.train()
    nets.run_pair.train()
    tick, images = time.perf_counter(), 0
    # Seconds spent waiting for the DataLoader since the last log line: its share of the
    # wall time is logged as data_wait (near 0 when the loader keeps up).
    waited, fetched_at = 0.0, time.perf_counter()
    in_step = False  # True while the networks and optimizers hold part of a step
    with metrics_writer(run_dir / METRICS_FILE, dist.is_main) as write_metrics, tracker:
        try:
            # A signal during set-up stops here, before the first step (one decision for all ranks).
            _, stop_now = dist.step_consensus({}, stop.requested)
            result.interrupted = stop_now
            for batch in [] if stop_now else loader:
                waited += time.perf_counter() - fetched_at
                phase = phase_at(step, cfg)
                batch = (
                    batch[0].to(device, non_blocking=True).contiguous(memory_format=memory_format),
                    batch[1].to(device, non_blocking=True).contiguous(memory_format=memory_format),
                    batch[2],
                )
                in_step = True
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
                in_step = False
                result.step = step
                images += batch[0].shape[0] * dist.world_size
                if step % cfg.log_every == 0 or step == end:
                    elapsed = time.perf_counter() - tick
                    record = {"step": step, "phase": phase, **values, "images_per_s": images / max(elapsed, 1e-9)}
                    record["data_wait"] = min(1.0, waited / max(elapsed, 1e-9))
                    tick, images, waited = time.perf_counter(), 0, 0.0
                    result.history.append(record)
                    write_metrics(record)
                    tracker.log_train(record, opt_g.param_groups[0]["lr"], opt_d.param_groups[0]["lr"])
                    bar.set_postfix_str(postfix(record), refresh=False)
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
                fetched_at = time.perf_counter()
                if stop_now:
                    result.interrupted = True
                    break
        except (RuntimeError, KeyboardInterrupt) as e:
            if dist.enabled and is_collective_failure(e):
                # Another process is gone: what is in memory may be part of a step, so nothing is
                # saved (even if a stop signal, such as the launcher's, came too).
                at = f"the last complete checkpoint is {last_good} (step {result.checkpoint_step})"
                raise process_lost(
                    dist, e, f"at step {step + 1}", at if last_good else "no checkpoint was written"
                ) from None
            if not stop.requested and not isinstance(e, KeyboardInterrupt):
                raise  # a real failure (DataLoader workers also die on Ctrl-C: that case is an interrupt)
            result.interrupted = True
        finally:
            bar.close()
        # Only a whole step is saved, and never after a second signal (it may have cut a step or a write short).
        whole_step = not stop.aborted and not in_step
        if result.interrupted and whole_step and dist.is_main and step > start_step and saved_step != step:
            last_good = checkpoint(step)
        if stop.aborted:
            raise AbortNow  # the tracker records "stopped at once"; train() returns the result
        tracker.finish(step, phase_at(max(step - 1, 0), cfg), result.interrupted)
        if dist.is_main:
            report_unreadable(source, cfg.data)
    dist.barrier()  # the others wait until rank 0's last checkpoint is on disk
    result.step, result.phase = step, phase_at(max(step - 1, 0), cfg)
    result.stop_signal = stop.signum if result.interrupted else None


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``: an atomic write's rename puts a new inode in place."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino

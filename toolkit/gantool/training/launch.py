"""``gantool train --nproc-per-node N``: DDP on one machine without spelling torchrun.

The launcher is PyTorch's own (``torch.distributed.launcher.api.elastic_launch``,
what ``torchrun`` runs): N worker processes of ``python -m gantool train ...``
with RANK / WORLD_SIZE / LOCAL_RANK set, a c10d rendezvous on 127.0.0.1.

What this adds around it:

- every refusal (options, resume, data, batch not divisible by N, ``--sync-bn``
  on the CPU) is one line *before* any process or folder exists
  (:func:`check_launch`);
- SIGINT and SIGTERM: the agent forwards them to every worker (which stop at
  the next step boundary with a checkpoint) and raises ``SignalException``
  here; that becomes exit 130 / 143, no traceback. SIGUSR1, which the agent
  does not handle, is forwarded to every worker here (checkpoint, continue);
- a worker that dies (kill -9, a crash) is one line naming its rank and how it
  ended; the other workers are stopped by the agent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gantool.core.errors import InputError, TrainingError

log = logging.getLogger(__name__)

MAX_PROCESSES = 256


def check_launch(options: Mapping[str, Any], resume: str | None, nproc: int, allow_data_change: bool) -> None:
    """Everything a worker would refuse, checked once here (writes nothing, starts nothing)."""
    from gantool.training.build import resolve_device
    from gantool.training.data import check_data_unchanged, data_fingerprint, open_source
    from gantool.training.distributed import sync_batchnorm_supported
    from gantool.training.loop import prepare_run

    if not 1 <= nproc <= MAX_PROCESSES:
        raise InputError(f"--nproc-per-node must be in 1..{MAX_PROCESSES}, got {nproc}")
    if "WORLD_SIZE" in os.environ:
        raise InputError("--nproc-per-node under torchrun: use one launcher (drop --nproc-per-node, or torchrun)")
    cfg, state, _ = prepare_run(options, resume)
    if cfg.batch_size % nproc:
        raise InputError(f"--batch-size {cfg.batch_size} must be divisible by the {nproc} processes")
    device = resolve_device(cfg.device)
    if cfg.sync_bn and not sync_batchnorm_supported(device):
        raise InputError(
            f"--sync-bn needs GPUs: torch's SyncBatchNorm does not run on {device.type} tensors; "
            "drop --sync-bn (each process then normalizes with its own batch statistics)"
        )
    if cfg.tensorboard:
        from gantool.training.tracking import summary_writer_class

        summary_writer_class()
    source = open_source(cfg.data, cfg.seed)
    if state is not None:
        check_data_unchanged(state.get("data"), data_fingerprint(source, cfg.data), allow_data_change)


def _children() -> list[int]:
    """The pids of this process's children (the workers), from /proc (Linux)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _forward_sigusr1() -> Iterator[None]:
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None:
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        for pid in _children():
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    previous = signal.signal(sig, forward)
    try:
        yield
    finally:
        signal.signal(sig, previous)


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``gantool train ARGV`` in ``nproc`` processes; returns the exit code (0, 130, 143).

    A worker that fails is a one-line TrainingError naming its rank.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"gantool-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.2,
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: N processes share the cores
    # The agent's notices ("Received 15 death signal, shutting down workers", one per
    # worker): what matters is said once below, or by rank 0.
    noisy = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.distributed.elastic")
    ]
    levels = [logger.level for logger in noisy]
    for logger in noisy:
        logger.setLevel(logging.ERROR)
    try:
        with _forward_sigusr1():
            elastic_launch(config, sys.executable)("-m", "gantool", "train", *argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        if failure.exitcode in (130, 143):  # a worker stopped by a signal sent to it alone
            return failure.exitcode
        raise TrainingError(
            f"process {rank} of {nproc} ended with {how} (pid {failure.pid}); the others were stopped. "
            "The run's last checkpoint is in its checkpoints/ folder (resume with --resume .../last.pt)"
        ) from None
    finally:
        for logger, level in zip(noisy, levels):
            logger.setLevel(level)
    return 0

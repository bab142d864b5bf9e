"""Multi-process training on PyTorch's own engine (torchrun + DistributedDataParallel).

``torchrun --nproc-per-node N -m gantool train ...`` sets RANK, WORLD_SIZE and
LOCAL_RANK; :func:`setup_distributed` reads them. Without them everything is a
no-op single process. gloo on the CPU, nccl on CUDA (one GPU per process,
``cuda:LOCAL_RANK``).

What the training loop needs from here:

- :meth:`DistributedContext.wrap`: DistributedDataParallel around a module;
- :meth:`DistributedContext.broadcast_object`: rank 0's value on every rank
  (the run folder, whose default name is a timestamp);
- :meth:`DistributedContext.step_consensus`: one small all-reduce per step that
  averages the logged losses and lets every rank agree on stopping (a NaN or a
  Ctrl-C seen by one rank must stop all of them at the same step, or the others
  would wait forever in the next collective);
- :meth:`DistributedContext.start_steps`: from the first step on, a collective
  waits at most ``collective_timeout`` s for the others (set-up waits longer,
  :data:`~gantool.core.constants.SETUP_COLLECTIVE_TIMEOUT_S`), so a hung process
  ends the run instead of holding the others for gloo's 30 minutes;
- :func:`seed_rank`: a distinct, reproducible RNG stream per rank;
- :func:`sync_batchnorm_supported`: torch's SyncBatchNorm refuses CPU tensors.

The data split is :class:`gantool.training.data.StepBatchSampler` (each rank takes its
contiguous share of the step's global batch).
"""

from __future__ import annotations

import datetime
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as torch_dist
from torch import Tensor, nn

from gantool.core.constants import DEFAULT_COLLECTIVE_TIMEOUT_S, SETUP_COLLECTIVE_TIMEOUT_S
from gantool.core.errors import InputError, ProcessLostError

T = TypeVar("T")

# Devices whose tensors torch.nn.SyncBatchNorm accepts (torch 2.9-2.13 list these
# in SyncBatchNorm.forward; CPU tensors raise "SyncBatchNorm expected input tensor
# to be on GPU ..."). A test checks this against torch itself.
SYNC_BATCHNORM_DEVICE_TYPES = ("cuda", "hpu", "xpu")


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device | None = None  # set when distributed (one device per process)
    owns_group: bool = False
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # s, from the first step on

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, module: nn.Module) -> nn.Module:
        if not self.enabled:
            return module
        if self.device is not None and self.device.type == "cuda":
            return nn.parallel.DistributedDataParallel(module, device_ids=[self.device.index])
        return nn.parallel.DistributedDataParallel(module)

    def broadcast_object(self, value: T) -> T:
        """Rank 0's ``value`` on every rank (picklable objects)."""
        if not self.enabled:
            return value
        box = [value]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]

    def step_consensus(self, losses: Mapping[str, Tensor], stop: bool) -> tuple[dict[str, float], bool]:
        """Losses averaged over the ranks, and whether any rank asked to stop.

        One all-reduce of a few numbers; every rank gets the same answer, so a
        non-finite loss or an interrupt stops all ranks at the same step. A
        single process returns its own values unchanged.
        """
        names = list(losses)
        if not self.enabled:
            return {k: float(v) for k, v in losses.items()}, stop
        device = next(iter(losses.values())).device if names else (self.device or torch.device("cpu"))
        packed = torch.stack(
            [*(losses[k].detach().float().reshape(()) for k in names), torch.tensor(float(stop), device=device)]
        )
        torch_dist.all_reduce(packed, op=torch_dist.ReduceOp.SUM)
        values = packed.tolist()
        return {k: v / self.world_size for k, v in zip(names, values)}, values[-1] > 0

    def start_steps(self) -> None:
        """From here on a collective waits at most ``collective_timeout`` s (the set-up waited longer).

        ``torch.distributed.set_timeout`` (torch >= 2.14) changes gloo's and NCCL's; older torch has
        only the private ``_set_pg_timeout`` (torch >= 2.3, deprecated in 2.14). Without either the
        set-up's longer timeout stays in force."""
        setter = getattr(torch_dist, "set_timeout", None) or getattr(
            torch_dist.distributed_c10d, "_set_pg_timeout", None
        )
        if self.enabled and setter is not None:
            setter(datetime.timedelta(seconds=self.collective_timeout))

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def shutdown(self) -> None:
        if self.owns_group and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
            self.owns_group = False


def _env_int(name: str, default: str | None = None) -> int:
    raw = os.environ.get(name, default)
    if raw is None:
        raise InputError(f"WORLD_SIZE is set but {name} is not: launch multi-process training with torchrun")
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"environment variable {name}={raw!r} is not an integer") from None


def setup_distributed(
    device_name: str = "auto", collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S
) -> DistributedContext:
    """Join the process group torchrun describes in the environment, if any.

    Joining and the set-up's collectives wait at least SETUP_COLLECTIVE_TIMEOUT_S for the
    others; :meth:`DistributedContext.start_steps` then bounds each collective by
    ``collective_timeout``."""
    world_size = _env_int("WORLD_SIZE", "1")
    if world_size <= 1:
        return DistributedContext()
    rank, local_rank = _env_int("RANK"), _env_int("LOCAL_RANK", "0")
    if not 0 <= rank < world_size:
        raise InputError(f"RANK={rank} is outside 0..{world_size - 1}")
    want_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if want_cuda:
        if not torch.cuda.is_available():
            raise InputError("--device cuda under torchrun, but torch sees no CUDA device")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    owns = not torch_dist.is_initialized()
    if owns:
        setup = datetime.timedelta(seconds=max(collective_timeout, SETUP_COLLECTIVE_TIMEOUT_S))
        torch_dist.init_process_group(backend="nccl" if want_cuda else "gloo", timeout=setup)
    return DistributedContext(rank, world_size, local_rank, device, owns, collective_timeout)


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """A 32-bit seed derived from the run seed, the rank and the step."""
    return int(np.random.SeedSequence([seed, rank, step, 3]).generate_state(1)[0])


def seed_rank(seed: int, rank: int, step: int = 0) -> None:
    """Give this process its own torch / NumPy / ``random`` streams.

    The loop itself draws no global random numbers (crops and masks are keyed
    per sample, see :mod:`gantool.training.data`), but DataLoader worker seeds and any
    user extension do: without this every rank would draw the same numbers.
    Rank 0 keeps the stream the single-process run has (so its checkpoints
    resume bitwise); other ranks re-derive theirs from ``(seed, rank, step)``
    at start and on resume.
    """
    derived = rank_seed(seed, rank, step)
    torch.manual_seed(derived)
    np.random.seed(derived)
    random.seed(derived)


def sync_batchnorm_supported(device: torch.device) -> bool:
    """Whether torch.nn.SyncBatchNorm runs on ``device`` (not on the CPU, as of torch 2.13)."""
    return device.type in SYNC_BATCHNORM_DEVICE_TYPES or device.type == torch._C._get_privateuse1_backend_name()


# What gloo and NCCL say when a peer is gone; torch raises some of these as plain RuntimeError
# (gloo's "Connection closed by peer" in torch 2.13), others as torch.distributed.DistError.
# When one receive times out, gloo closes every pair of the group and the process's other
# pending operations (DDP's buffer broadcast, say) fail with "Application timeout caused pair
# closure" (gloo/transport/tcp/unbound_buffer.cc), without the word "gloo".
_PEER_GONE = ("gloo", "nccl", "connection closed by peer", "connection reset by peer", "broken pipe", "pair closure")
_TIMED_OUT = ("timed out", "timeout caused")


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective (or DDP's all-reduce) failing, not a bug of this process."""
    if isinstance(error, torch_dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(mark in text for mark in _PEER_GONE)


def process_lost(dist: DistributedContext, error: BaseException, where: str, kept: str = "") -> ProcessLostError:
    """The one line a surviving process reports, with the backend's cause (its source location cut)
    and ``kept``, what is left on disk."""
    cause = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    if cause.startswith("[") and "] " in cause:  # "[/.../gloo/transport/tcp/pair.cc:553] Connection closed ..."
        cause = cause.split("] ", 1)[1]
    cause = cause.split(". ", 1)[0].rstrip(".")
    if any(mark in cause.lower() for mark in _TIMED_OUT):  # gloo: "Timed out waiting 5000ms for recv ..."
        cause += f": no answer within --collective-timeout {dist.collective_timeout:g} s"
    return ProcessLostError(
        f"process {dist.rank} of {dist.world_size} lost contact with another process {where} ({cause}); "
        f"it stopped without saving{'; ' + kept if kept else ''}"
    )

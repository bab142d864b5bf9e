"""Multi-process training on PyTorch's own engine (torchrun + DistributedDataParallel).

``torchrun --nproc-per-node N -m gantool train ...`` sets RANK, WORLD_SIZE and
LOCAL_RANK; :func:`setup_distributed` reads them. Without them everything is a
no-op single process. gloo on the CPU, nccl on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch import nn

from gantool.errors import InputError


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device | None = None  # set when distributed (one device per process)
    owns_group: bool = False

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

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def shutdown(self) -> None:
        if self.owns_group and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
            self.owns_group = False


def setup_distributed(device_name: str = "auto") -> DistributedContext:
    """Join the process group torchrun describes in the environment, if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
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
        torch_dist.init_process_group(backend="nccl" if want_cuda else "gloo")
    return DistributedContext(rank, world_size, local_rank, device, owns)

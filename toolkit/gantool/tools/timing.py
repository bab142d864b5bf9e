"""Wall-clock timing shared by the benchmarks (CUDA work synchronised around each step)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def timed(step: Callable[[], object], steps: int, warmup: int, device: torch.device) -> list[float]:
    """Seconds per call of ``step`` after ``warmup`` untimed calls."""
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

"""Wall-clock timing shared by the benchmarks (CUDA work synchronised around each step)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

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


def strict_json(value: Any) -> Any:
    """``value`` with non-finite floats as None, for ``json.dumps(..., allow_nan=False)``:
    strict JSON has no Infinity or NaN (a hole PSNR of identical outputs is infinite)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value

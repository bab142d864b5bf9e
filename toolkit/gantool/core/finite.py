"""Counting NaN and Inf in weights: one definition for every place that refuses them.

Training refuses to resume or start from them, export refuses to write them, and every
inference backend refuses to run them (:mod:`gantool.runtime.weights`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def non_finite_count(tensor: Any) -> tuple[int, int] | None:
    """(non-finite values, size) of a floating torch tensor or numpy array; None when it is
    not floating point. Vectorised, and without a copy for torch tensors (any device, bf16 too)."""
    if hasattr(tensor, "is_floating_point"):  # a torch tensor
        if not tensor.is_floating_point():
            return None
        import torch  # delayed: torch is loaded already if a tensor exists

        finite_t = torch.isfinite(tensor.detach())
        size = finite_t.numel()
        return (0 if bool(finite_t.all()) else size - int(finite_t.sum())), size
    array = np.asarray(tensor)
    if not np.issubdtype(array.dtype, np.floating):
        return None
    finite = np.isfinite(array)
    return (0 if finite.all() else int(finite.size - finite.sum())), int(finite.size)


def non_finite_weights(state_dict: Mapping[str, Any]) -> str:
    """'' when every floating tensor (torch or numpy) is finite, else which hold NaN/Inf (one line)."""
    bad = []
    for name, tensor in state_dict.items():
        counted = non_finite_count(tensor)
        if counted and counted[0]:
            bad.append(f"{name}: {counted[0]} of {counted[1]}")
    if not bad:
        return ""
    return "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more tensors" if len(bad) > 3 else "")

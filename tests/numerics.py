"""Tolerances derived from the dtype and the size of what is compared.

Two float32 computations that are equal in exact arithmetic (autograd vs a
hand-written loss, a folded vs an unfolded BatchNorm, a fused vs an eager
kernel) add the same terms in a different order. Which order depends on the
CPU: ATen and oneDNN pick AVX-512, AVX2 or scalar kernels at run time, and the
thread count splits reductions differently. A hand-picked absolute tolerance
near float32's epsilon (1e-7) therefore passes on one CPU and fails on another
(1.34e-7 on an AMD EPYC). These helpers scale the tolerance instead:

    tolerance = ulps * eps(dtype) * sqrt(reduction_len) * max|reference|

- ``eps(dtype) * max|reference|``: one unit in the last place at the scale of
  the tensor (rounding errors are relative to the partial sums, and those are
  at the scale of the largest element, not of each element; an element-wise
  relative tolerance means nothing for elements that cancel to near 0).
- ``sqrt(reduction_len)``: each element is a sum of ``reduction_len`` terms;
  independent roundings of n additions grow like sqrt(n) (the worst case, n,
  is far looser and never seen).
- ``ulps``: headroom. Measured on this suite's gradient twins (AVX-512, AVX2,
  1 and 2 threads): at most 18 ulps of the largest element, against a budget
  of 4 * sqrt(4096) = 256; the bugs the twins guard against (a stale D, a
  dropped loss term) are off by 1e5 ulps and more.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def _dtype_eps(reference: torch.Tensor | np.ndarray) -> float:
    if isinstance(reference, torch.Tensor):
        return float(torch.finfo(reference.dtype).eps)
    return float(np.finfo(reference.dtype).eps)


def _max_abs(reference: torch.Tensor | np.ndarray) -> float:
    if isinstance(reference, torch.Tensor):
        return float(reference.detach().abs().max()) if reference.numel() else 0.0
    return float(np.abs(reference).max()) if reference.size else 0.0


def fp32_tol(reference: torch.Tensor | np.ndarray, reduction_len: int, ulps: float = 4.0) -> float:
    """Absolute tolerance for comparing another evaluation of ``reference``.

    ``reduction_len``: how many terms were summed into each element (for a
    conv weight's gradient, batch * height * width; for a network's output,
    the fan-in of its layers summed over the depth). Uses the reference's own
    dtype, so a float64 oracle gets float64's epsilon.
    """
    if reduction_len < 1:
        raise ValueError(f"reduction_len must be >= 1, got {reduction_len}")
    return ulps * _dtype_eps(reference) * math.sqrt(reduction_len) * _max_abs(reference)


def assert_fp32_close(
    actual: torch.Tensor, expected: torch.Tensor, reduction_len: int, ulps: float = 4.0, msg: str = ""
) -> None:
    """``torch.testing.assert_close`` with :func:`fp32_tol`'s absolute tolerance and no relative one."""
    atol = fp32_tol(expected, reduction_len, ulps)
    torch.testing.assert_close(
        actual, expected, rtol=0.0, atol=atol, msg=lambda m: f"{msg} (atol {atol:.3g} from fp32_tol)\n{m}".strip()
    )


def conv_fan_in(module: torch.nn.Module) -> int:
    """Terms summed into one output of a stack of convolutions: the sum of each layer's fan-in.

    The bound for a network's output (errors of each layer add up through the depth).
    """
    total = 0
    for m in module.modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            total += m.in_channels // m.groups * math.prod(m.kernel_size)
        elif isinstance(m, torch.nn.Linear):
            total += m.in_features
    return max(total, 1)


__all__ = ["assert_fp32_close", "conv_fan_in", "fp32_tol"]

"""Benchmarks that load cannot fool: rows timed round by round, ratios from paired rounds,
and the CPU's estimated peak.

On a shared machine a neighbour's job slows whatever runs at that moment. Timing
every repetition of row A and then every one of row B turns that noise into a
ratio; timing A, B, A, B, ... (:func:`interleaved`) lets it hit every row alike, and
the ratio of the two rows inside each round (:func:`paired_ratio`) cancels most of it.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


def _call(step: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def interleaved(
    steps: Sequence[Callable[[], object]], rounds: int, warmup: int, device: torch.device | None = None
) -> list[list[float]]:
    """Seconds per call of each of ``steps``, one call of each per round.

    Every step first gets ``warmup`` untimed calls. The order alternates between rounds
    (A B, B A, A B, ...) so that no row always runs right after another one's caches.
    """
    device = device or torch.device("cpu")
    for _ in range(warmup):
        for step in steps:
            _call(step, device)
    times: list[list[float]] = [[] for _ in steps]
    order = list(range(len(steps)))
    for r in range(rounds):
        for i in order if r % 2 == 0 else order[::-1]:
            times[i].append(_call(steps[i], device))
    return times


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """The ratio ``numerator[r] / denominator[r]`` of each round: its median and spread."""
    ratios = [n / d for n, d in zip(numerator, denominator) if d > 0]
    if not ratios:
        return {"median": None, "min": None, "max": None, "rounds": 0}
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "rounds": len(ratios)}


def spread_text(ratio: dict[str, Any]) -> str:
    """``"2.19x (1.95-2.40 over 5 paired rounds)"``."""
    if ratio.get("median") is None:
        return "n/a"
    return f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f} over {ratio['rounds']} paired rounds)"


# ----------------------------------------------------------------------------- the CPU's peak

PEAK_HOW = (
    "estimated: usable cores (sched_getaffinity) x clock ('cpu MHz' in /proc/cpuinfo) x operations per cycle "
    "per core from the instruction set (fp32: 2 FMA units x SIMD lanes x 2; bf16: AVX512-BF16 dot products "
    "at 2x fp32, AMX 1024; int8: VNNI at 4x fp32, AMX 2048; Zen 4 runs 512-bit work as two 256-bit halves). "
    "A nominal upper bound, not a measurement: turbo, SMT siblings and memory bandwidth move it."
)


def _cpuinfo_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def ops_per_cycle(flags: set[str], vendor: str) -> dict[str, int | None]:
    """Nominal operations per cycle per core, by precision, from the CPU's flags."""
    wide = "avx512f" in flags
    half = vendor == "AuthenticAMD" and wide  # Zen 4: 512-bit instructions on 256-bit units
    if wide and not half:
        fp32 = 64
    elif "avx2" in flags and "fma" in flags:
        fp32 = 32
    else:
        return {"fp32": None, "bf16": None, "int8": None}
    bf16 = 1024 if "amx_bf16" in flags else (2 * fp32 if "avx512_bf16" in flags else None)
    if "amx_int8" in flags:
        int8: int | None = 2048
    elif "avx512_vnni" in flags or "avx_vnni" in flags:
        int8 = 4 * fp32
    else:
        int8 = 2 * fp32  # AVX2 vpmaddubsw + vpmaddwd: about half the VNNI rate
    return {"fp32": fp32, "bf16": bf16, "int8": int8}


def cpu_peak(cpuinfo: str | None = None, cores: int | None = None) -> dict[str, Any]:
    """This CPU's estimated peak in G operations per second by precision (None where unknown), and how."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    fields = _cpuinfo_fields(cpuinfo)
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    match = re.match(r"[\d.]+", fields.get("cpu MHz", ""))
    ghz = float(match.group()) / 1000 if match else None
    per_cycle = ops_per_cycle(set(fields.get("flags", "").split()), fields.get("vendor_id", ""))
    peaks = {k: (cores * ghz * v if ghz and v else None) for k, v in per_cycle.items()}
    return {"gops": peaks, "cores": cores, "ghz": ghz, "model": fields.get("model name", ""), "how": PEAK_HOW}


# ----------------------------------------------------------------------------- peak memory


def _peak_rss_reset() -> bool:
    """Reset the kernel's peak-RSS counter (Linux: writing 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak resident memory above the starting point while the block runs, in MB.

    Linux: VmHWM after the block minus VmRSS before it, with the peak counter
    reset first (so native allocations of torch and ONNX Runtime count, which
    tracemalloc cannot see). Elsewhere: the growth of ru_maxrss, a lower bound
    (0 when an earlier run already went higher).
    """

    def __enter__(self) -> PeakMemory:
        import resource

        self.exact = _peak_rss_reset()
        self.start_kb = _status_kb("VmRSS") if self.exact else None
        if self.start_kb is None:
            self.exact = False
            scale = 1 if sys.platform != "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
            self.start_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // scale
        self.peak_mb: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        import resource

        if self.exact:
            peak_kb = _status_kb("VmHWM")
        else:
            scale = 1 if sys.platform != "darwin" else 1024
            peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // scale
        if peak_kb is not None and self.start_kb is not None:
            self.peak_mb = max(0, peak_kb - self.start_kb) / 1024

"""What the training loop writes as it goes: the validation record and sample grid of a step
(:func:`validate`), and the metrics file, one JSON line per record (:func:`metrics_writer`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gantool.core.errors import InputError
from gantool.core.fileio import atomic_save
from gantool.core.processing import to_uint8
from gantool.nn.losses import l1, psnr, ssim
from gantool.nn.networks import CompletionNetwork


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
def metrics_writer(path: Path, enabled: bool) -> Iterator[Any]:
    """A function that appends one record to ``path`` (flushed; a full disk is one line), or that
    writes nothing where ``enabled`` is false (the ranks other than 0)."""
    if not enabled:
        yield lambda record: None
        return
    try:
        f = path.open("a", encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None

    def write(record: dict[str, Any]) -> None:
        try:
            f.write(json.dumps(record) + "\n")
            f.flush()
        except OSError as e:  # a full disk ends the run with one line; checkpoints stay intact
            raise InputError(f"cannot write {path}: {e.strerror or e}") from None

    try:
        yield write
    finally:
        # The line a full disk refused is still buffered: write() already reported it.
        with contextlib.suppress(OSError):
            f.close()

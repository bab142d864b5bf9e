"""The training progress bar: one line a person watches (steps, phase, losses, D's outputs, images/s)."""

from __future__ import annotations

import sys
from typing import Any

from gantool.training.steps import PHASE_NAMES


def progress_bar(enabled: bool, start: int, end: int) -> Any:
    from tqdm.auto import tqdm

    # Redirected to a log file, a bar that redraws 10 times a second buries the log.
    interval = 0.1 if sys.stderr.isatty() else 30.0
    return tqdm(
        total=end, initial=start, disable=not enabled, unit="step", dynamic_ncols=True, leave=True, mininterval=interval
    )


def postfix(record: dict[str, Any]) -> str:
    parts = [PHASE_NAMES[record["phase"]]]
    parts += [f"{k.removeprefix('loss_')}={v:.4g}" for k, v in record.items() if k.startswith("loss_")]
    if "d_real" in record:
        parts.append(f"D(real)={record['d_real']:.3f} D(fake)={record['d_fake']:.3f}")
    parts.append(f"{record['images_per_s']:.1f} img/s")
    return " ".join(parts)

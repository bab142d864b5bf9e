"""A run's checkpoint files, found without loading one: ``checkpoints/last.pt`` and the kept
``checkpoints/step_N.pt``. Training, ``gantool runs``, ``export RUN``, ``--init-from RUN``,
``--resume RUN`` and ``--model RUN`` all take a run's newest checkpoint from here."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gantool.core.constants import LAST_CHECKPOINT

STEP_CHECKPOINT = re.compile(r"step_(\d+)\.pt")


def step_checkpoints(folder: Path) -> dict[int, Path]:
    """A checkpoints folder's ``step_N.pt`` files by step (none when it cannot be read)."""
    try:
        return {int(m.group(1)): p for p in folder.iterdir() if (m := STEP_CHECKPOINT.fullmatch(p.name))}
    except OSError:
        return {}


def newest_checkpoint(folder: Path) -> tuple[Path | None, int | None]:
    """checkpoints/last.pt (else the highest step_N.pt) and its step when the names tell it.

    last.pt is a hard link to the newest step_N.pt when both were kept, so the
    same file gives last.pt's step without loading it.
    """
    if not folder.is_dir():
        return None, None
    steps = sorted(step_checkpoints(folder).items(), reverse=True)
    last = folder / LAST_CHECKPOINT
    if not last.is_file():
        return (steps[0][1], steps[0][0]) if steps else (None, None)
    for step, candidate in steps:
        try:
            if os.path.samefile(candidate, last):
                return last, step
        except OSError:
            continue
    return last, None

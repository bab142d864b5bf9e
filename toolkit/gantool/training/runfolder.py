"""Run folders: created exclusively, marked as gantool's, never shared or mixed.

A run folder is ``runs/<timestamp>`` (``-2``, ``-3``, ... when that name is
taken) or ``--out``. It is made by one process and marked with a run file
(:data:`RUN_FILE`), created exclusively, so two runs never share a folder and
a folder that is not a gantool run (no run file) is never written into.

Resuming (:func:`plan_run_folder`):

- ``--resume RUN/checkpoints/X.pt`` continues in RUN, the checkpoint's own run,
  when X is RUN's newest checkpoint. An older one is refused (it would rewrite
  the newer checkpoints and log the same steps twice): branch with ``--out``.
- ``--resume X --out NEW`` continues into NEW, a new (or empty) folder whose run
  file records its parent checkpoint. Any other existing folder is refused.
- ``--resume X`` where X is not inside a run folder continues into a new
  ``runs/<timestamp>`` folder (never the folder X lies in).

Continuing in a run drops the metrics lines past the checkpoint's step
(:func:`trim_metrics`), so after a kill -9 no step is logged twice.

While a run trains, its folder holds a lock file (:func:`lock_run_folder`): a
second process resuming the same run is refused instead of mixing its
checkpoints and metrics in. A lock left by a killed process (its pid is gone)
is taken over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gantool import __version__
from gantool.core.constants import (
    CHECKPOINTS_DIR,
    LAST_CHECKPOINT,
    METRICS_FILE,
    RUN_CONFIG_FILE,
    RUN_FILE,
    SAMPLES_DIR,
    STATUS_FILE,
    TENSORBOARD_DIR,
)
from gantool.core.errors import GantoolError, InputError, first_line
from gantool.core.fileio import TMP_PREFIX, atomic_write_text, ensure_writable_dir, pid_alive
from gantool.core.run_checkpoints import newest_checkpoint, step_checkpoints
from gantool.training.checkpoint import load_checkpoint
from gantool.training.index import RUN_INDEX_FILE

log = logging.getLogger(__name__)

RUN_FORMAT = "gantool-run"
RUNS_ROOT = Path("runs")
LOCK_FILE = ".gantool-lock"
# Runs made before the run file existed: these three together mark one.
_LEGACY_MARKS = (CHECKPOINTS_DIR, RUN_CONFIG_FILE, METRICS_FILE)


def is_run_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is a gantool run (has the run file, or is a run made before it)."""
    folder = Path(folder)
    return (folder / RUN_FILE).is_file() or all((folder / name).exists() for name in _LEGACY_MARKS)


def run_of_checkpoint(checkpoint: str | Path) -> Path | None:
    """The run folder ``checkpoint`` belongs to (``RUN/checkpoints/<file>``), or None."""
    path = Path(checkpoint).resolve()
    if path.parent.name != CHECKPOINTS_DIR or not is_run_folder(path.parent.parent):
        return None
    return path.parent.parent


def resume_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``--resume PATH`` continues from: PATH itself, or for a run folder its
    newest checkpoint (``last.pt``, else the highest ``step_N.pt``)."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not is_run_folder(path):
        raise InputError(f"--resume {path}: a folder that is not a gantool run; pass a checkpoint file")
    newest, _ = newest_checkpoint(path / CHECKPOINTS_DIR)
    if newest is None:
        raise InputError(f"--resume {path}: the run has no checkpoint in {path / CHECKPOINTS_DIR}")
    return newest


@dataclass
class RunPlan:
    """Where a run writes: ``folder`` (None: a new ``runs/<timestamp>``), whether the
    folder is made now (``new``), the checkpoint a new folder continues from
    (``parent``), and the file in ``folder``/checkpoints a run continued in place
    starts from (``resumed``: last.pt, or a step_N.pt when last.pt is gone)."""

    folder: Path | None
    new: bool
    parent: dict[str, Any] | None = None
    resumed: str | None = None


def plan_run_folder(out: str | None, resume: str | Path | None, state: dict[str, Any] | None) -> RunPlan:
    """Decide the run folder without writing anything (raises a one-line InputError)."""
    own = run_of_checkpoint(resume) if resume is not None else None
    parent = None
    if resume is not None and state is not None:
        parent = {"checkpoint": str(Path(resume).resolve()), "step": int(state["step"])}
    if out is not None:
        target = Path(out)
        if own is not None and target.resolve() == own:
            return _continue_in(own, Path(resume), state)  # type: ignore[arg-type]
        _check_new_folder(target)
        return RunPlan(target, True, parent)
    if own is not None:
        return _continue_in(own, Path(resume), state)  # type: ignore[arg-type]
    _check_not_inside_a_run(RUNS_ROOT / "new")
    return RunPlan(None, True, parent)


def _check_not_inside_a_run(target: Path) -> None:
    outer = enclosing_run(target)
    if outer is not None:
        raise InputError(
            f"{target} would lie inside the run {outer}; a run folder is never made inside another run: "
            "choose an --out outside it"
        )


def _continue_in(run: Path, resume: Path, state: dict[str, Any] | None) -> RunPlan:
    step = int(state["step"]) if state is not None else 0
    newest = newest_run_step(run, resume, step)
    if newest is not None and newest > step:
        raise InputError(
            f"--resume {resume} is at step {step}, but its run {run} has newer state "
            f"(step {newest}); to branch from step {step}, add --out NEW_FOLDER"
        )
    return RunPlan(run, False, resumed=resume.resolve().name)


def newest_run_step(run: Path, resume: Path, step: int) -> int | None:
    """The newest step ``run`` holds besides ``resume`` (at ``step``): of its last.pt,
    of any ``step_N.pt`` and, unless ``resume`` is the run's newest checkpoint, of
    the steps logged in metrics.jsonl.

    Any of them past ``step`` means continuing in place would overwrite newer
    state, whether or not last.pt is still there. Lines logged past the newest
    checkpoint itself are what a kill -9 leaves; resuming from it drops them.
    """
    steps: list[int] = []
    folder = run / CHECKPOINTS_DIR
    last = folder / LAST_CHECKPOINT
    last_step = None
    if last.is_file():
        if last.resolve() == resume.resolve():
            last_step = step
        else:
            try:
                last_step = int(load_checkpoint(last)["step"])
            except (GantoolError, TypeError, ValueError) as e:
                log.warning("cannot read %s (%s); continuing from %s", last, first_line(e), resume)
    if last_step is not None:
        steps.append(last_step)
    steps += list(step_checkpoints(folder))
    logged = last_logged_step(run / METRICS_FILE)
    if logged is not None and last_step != step:
        steps.append(logged)
    return max(steps) if steps else None


def last_logged_step(path: Path) -> int | None:
    """The highest step in a metrics.jsonl (None if there is none or it is unreadable)."""
    best = None
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    step = json.loads(line).get("step")
                except (ValueError, AttributeError):
                    continue
                if isinstance(step, int) and not isinstance(step, bool):
                    best = step if best is None else max(best, step)
    except OSError:
        return None
    return best


def enclosing_run(target: Path) -> Path | None:
    """The run folder ``target`` would lie inside (itself excluded), at any depth, or None."""
    for folder in Path(os.path.abspath(target)).parents:
        try:
            if is_run_folder(folder):
                return folder
        except OSError:
            continue
    return None


def check_utf8_path(value: str | None, flag: str) -> None:
    """Refuse a path gantool could not write into its UTF-8 files (config.toml, status.json)."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise InputError(
            f"{flag} {shown!r} is not valid UTF-8 (a name in another encoding, such as Latin-1); "
            "gantool records paths in UTF-8 files: rename it"
        ) from None


# What a run folder holds that gantool wrote (removed again when nothing was trained).
_RUN_FILES = (RUN_FILE, LOCK_FILE, RUN_CONFIG_FILE, METRICS_FILE, STATUS_FILE, RUN_INDEX_FILE)
_RUN_SUBFOLDERS = (CHECKPOINTS_DIR, SAMPLES_DIR, TENSORBOARD_DIR)


def remove_untrained_run(folder: Path, keep_folder: bool = False) -> bool:
    """Remove a run folder this process made when it holds no checkpoint and no logged step.

    A refusal or an interrupt before the first step then leaves nothing behind.
    Only gantool's own files are removed; anything else keeps the folder. Returns
    whether the folder was emptied.
    """
    try:
        if any((folder / CHECKPOINTS_DIR).glob("*.pt")) or last_logged_step(folder / METRICS_FILE) is not None:
            return False
        for sub in _RUN_SUBFOLDERS:
            if (folder / sub).is_dir():
                for entry in (folder / sub).iterdir():
                    if entry.is_file() and (sub == TENSORBOARD_DIR or entry.name.startswith(TMP_PREFIX)):
                        entry.unlink()
                (folder / sub).rmdir()
        for name in _RUN_FILES:
            (folder / name).unlink(missing_ok=True)
        for entry in folder.iterdir():
            if entry.name.startswith(TMP_PREFIX):
                entry.unlink()
        if not keep_folder:
            folder.rmdir()
    except OSError:
        return False
    return True


def _check_new_folder(target: Path) -> None:
    _check_not_inside_a_run(target)
    if not target.exists():
        return
    if not target.is_dir():
        raise InputError(f"output path exists and is not a folder: {target}")
    if is_run_folder(target):
        last = target / CHECKPOINTS_DIR / LAST_CHECKPOINT
        how = f"resume it with --resume {last}, or" if last.is_file() else "it has no checkpoint yet;"
        raise InputError(f"{target} already holds a run; {how} choose another --out")
    if any(target.iterdir()):
        raise InputError(f"{target} is not empty and is not a gantool run folder; choose a new or empty --out")


def claim_run_folder(plan: RunPlan, now: datetime | None = None) -> Path:
    """Make (or reuse, when continuing) the run folder; returns its resolved path.

    A new folder is taken exclusively: ``os.mkdir`` for a default name (a suffix
    when taken), and the run file created with O_EXCL in either case, so of two
    processes claiming one folder exactly one wins.
    """
    if not plan.new:
        assert plan.folder is not None
        return plan.folder.resolve()
    if plan.folder is None:
        folder = _make_default_folder(now or datetime.now())
    else:
        folder = plan.folder
        _check_new_folder(folder)
        ensure_writable_dir(folder)
    record = {
        "format": RUN_FORMAT,
        "version": 1,
        "gantool_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "parent": plan.parent,
    }
    try:
        fd = os.open(folder / RUN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise InputError(f"{folder} already holds a run (another process claimed it); choose another --out") from None
    except OSError as e:
        raise InputError(f"cannot write to run folder {folder}: {e.strerror or e}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=2) + "\n")
    return folder.resolve()


def _make_default_folder(now: datetime) -> Path:
    name = now.strftime("%Y%m%d-%H%M%S")
    try:
        RUNS_ROOT.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create {RUNS_ROOT}: {e.strerror or e}") from None
    for suffix in range(1, 1000):
        folder = RUNS_ROOT / (name if suffix == 1 else f"{name}-{suffix}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise InputError(f"cannot create output folder {folder}: {e.strerror or e}") from None
        return folder
    raise InputError(f"could not find a free run folder name {RUNS_ROOT / name}-N; use --out")


def read_run_file(folder: str | Path) -> dict[str, Any]:
    """The run file's record ({} for a run made before run files, or an unreadable one)."""
    try:
        data = json.loads((Path(folder) / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def trim_metrics(path: Path, step: int) -> int:
    """Drop metrics lines past ``step`` (and a torn last line); returns how many were dropped.

    Continuing from a checkpoint at ``step`` logs steps ``step + 1`` onwards again;
    lines a killed run wrote past its last checkpoint would otherwise appear twice.
    """
    if not path.is_file():
        return 0
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line)
    dropped = len(lines) - len(kept)
    if dropped:
        atomic_write_text(path, "".join(line + "\n" for line in kept))
        log.info("dropped %d metrics line(s) past step %d from %s", dropped, step, path)
    return dropped


def lock_run_folder(folder: Path) -> Callable[[], None]:
    """Mark ``folder`` as in use by this process; returns the function that releases it.

    The lock file holds "<host> <pid>". A lock of a process that is gone (same
    host) is stale and taken over; a live one (or one on another host, which
    cannot be checked) is a one-line InputError saying how to clear it.
    """
    path = folder / LOCK_FILE
    me = f"{socket.gethostname()} {os.getpid()}"
    for attempt in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            try:
                holder = path.read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                holder = ""
            host, _, pid = holder.partition(" ")
            stale = host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))
            if stale and attempt == 0:
                log.info(
                    "taking over the lock of a training process that is gone (%s) in %s",
                    holder,
                    folder,
                )
                path.unlink(missing_ok=True)
                continue
            raise InputError(
                f"{folder} is in use by another training process ({holder or 'unknown'}); "
                f"if none is running, delete {path}"
            ) from None
        except OSError as e:
            raise InputError(f"cannot write to run folder {folder}: {e.strerror or e}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(me + "\n")
        break

    def release() -> None:
        try:
            if path.read_text(encoding="utf-8").strip() == me:
                path.unlink()
        except OSError:
            pass

    return release

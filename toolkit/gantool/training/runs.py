"""Run folders as a person reads them: status, progress, last validation, newest checkpoint, curves.

``gantool runs`` lists the runs under a folder, summarises one, and plots its
losses, D's outputs and validation PSNR. Everything comes from what a run folder
holds (config.toml, metrics.jsonl, checkpoints/, status.json); torch is never
imported, so listing a folder of runs is quick.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gantool.core.config import TrainConfig, read_toml
from gantool.core.constants import (
    CHECKPOINTS_DIR,
    METRICS_FILE,
    RUN_CONFIG_FILE,
    STATUS_FILE,
    TENSORBOARD_DIR,
)
from gantool.core.errors import GantoolError, InputError, first_line
from gantool.core.fileio import atomic_save
from gantool.core.run_checkpoints import newest_checkpoint
from gantool.training.tracking import (
    D_WIN_FAKE,
    D_WIN_REAL,
    FINISHED,
    RUNNING,
    STATES,
    TENSORBOARD_INSTALL,
)
from gantool.training.tracking_mlflow import read_mlflow_record

# Derived states (training never writes these).
KILLED = "killed"  # status.json says running, but its process is gone (kill -9, a crash, a reboot)
INCOMPLETE = "incomplete"  # no status record (an older gantool) and the schedule is not done
BROKEN = "broken"  # a file the summary needs is unreadable

RUN_MARKERS = (RUN_CONFIG_FILE, METRICS_FILE, STATUS_FILE, CHECKPOINTS_DIR)
PHASE_KEYS = ("steps_g", "steps_d", "steps_joint")
LOSS_KEYS = ("loss_rec", "loss_d", "loss_adv")
D_KEYS = ("d_real", "d_fake")
VAL_KEYS = ("val_psnr", "val_psnr_hole")
PLOT_GROUPS = ("losses", "D outputs", "validation PSNR")  # one axis each


@dataclass
class RunInfo:
    """What ``gantool runs`` shows about one run folder."""

    path: Path
    status: str  # running, finished, stopped, failed, killed, incomplete or broken
    reason: str | None = None  # e.g. "signal", "non-finite"
    message: str | None = None  # the full one-line cause of a failure
    step: int | None = None
    total_steps: int | None = None
    phase: str | None = None
    val_psnr: float | None = None
    checkpoint: Path | None = None
    checkpoint_step: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    train: list[dict[str, Any]] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0  # unreadable lines in metrics.jsonl (a write cut short by kill -9)
    mlflow: dict[str, Any] | None = None  # the MLflow run it is tracked in (mlflow.json), if any
    unreadable_images: int = 0  # training images found undecodable (status.json)
    first_unreadable: str | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def label(self) -> str:
        """Status with its short reason: "stopped (signal)", "failed (non-finite)"."""
        return f"{self.status} ({self.reason})" if self.reason else self.status


def looks_like_run(path: Path) -> bool:
    try:
        return path.is_dir() and any((path / marker).exists() for marker in RUN_MARKERS)
    except OSError:  # an unreadable folder is not listed
        return False


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Training and validation records of a metrics.jsonl, each in step order, one per step.

    A step logged twice (a run killed after its last checkpoint, then resumed)
    keeps its newest record; an unreadable line (a write cut short) is skipped
    and counted.
    """
    train: dict[int, dict[str, Any]] = {}
    validation: dict[int, dict[str, Any]] = {}
    skipped = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (ValueError, KeyError, TypeError):
                skipped += 1
                continue
            if not isinstance(record, dict):
                skipped += 1
                continue
            if "val_psnr" in record:
                if _is_number(record["val_psnr"]):  # a null or hand-edited value is not a measurement
                    validation[step] = record
            else:
                train.pop(step, None)  # re-inserted last, so "last logged" stays last
                train[step] = record
    reached = list(train)[-1] if train else None  # the step the run last logged, in file order
    # A resume from an older checkpoint that has not caught up yet: later steps are the abandoned run's.
    limit = reached if reached is not None and reached < max(train) else None
    return (
        [train[s] for s in sorted(train) if limit is None or s <= limit],
        [validation[s] for s in sorted(validation) if limit is None or s <= limit],
        skipped,
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _num(value: Any) -> float:
    """A number to format (NaN for a missing, null or non-numeric value)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def process_alive(pid: int, host: str | None) -> bool | None:
    """Whether ``pid`` runs on this machine; None when the record is from another host."""
    if (host and host != socket.gethostname()) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except OSError:
        return None
    return True


def summarize_run(path: str | Path) -> RunInfo:
    """Read one run folder. Unreadable files make the status "broken" (with the cause), never an exception."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path} is not a folder")
    if not looks_like_run(path):
        raise InputError(f"{path} is not a gantool run folder (no config.toml, metrics.jsonl or checkpoints/)")
    info = RunInfo(path=path, status=INCOMPLETE, mlflow=read_mlflow_record(path))
    try:
        _read_into(info)
    except (OSError, GantoolError, ValueError, TypeError, KeyError) as e:
        info.status, info.reason, info.message = BROKEN, None, first_line(e)
    return info


def _read_into(info: RunInfo) -> None:
    path = info.path
    if (path / RUN_CONFIG_FILE).is_file():
        info.config = read_toml(path / RUN_CONFIG_FILE)
        defaults = TrainConfig()
        info.total_steps = sum(int(info.config.get(k, getattr(defaults, k))) for k in PHASE_KEYS)
    if (path / METRICS_FILE).is_file():
        info.train, info.validation, info.skipped_lines = read_metrics(path / METRICS_FILE)
    if info.train:
        phase = info.train[-1].get("phase")
        info.step, info.phase = int(info.train[-1]["step"]), (str(phase) if phase is not None else None)
    if info.validation:
        info.val_psnr = float(info.validation[-1]["val_psnr"])
    info.checkpoint, info.checkpoint_step = newest_checkpoint(path / CHECKPOINTS_DIR)

    if info.checkpoint_step is not None and (info.step is None or info.checkpoint_step > info.step):
        info.step = info.checkpoint_step
    status = read_status(path)
    if status is None:
        if info.total_steps is not None and info.step is not None and info.step >= info.total_steps:
            info.status = FINISHED
        return
    info.status, info.reason, info.message = status["state"], status.get("reason"), status.get("message")
    unreadable = status.get("unreadable_images")
    if isinstance(unreadable, int) and not isinstance(unreadable, bool) and unreadable > 0:
        info.unreadable_images, info.first_unreadable = unreadable, str(status.get("first_unreadable") or "?")
    if info.step is None or int(status.get("step") or 0) > info.step:
        info.step, info.phase = int(status.get("step") or 0), status.get("phase")
    info.total_steps = int(status.get("total_steps") or info.total_steps or 0) or info.total_steps
    if status.get("checkpoint_step") is not None:
        info.checkpoint_step = int(status["checkpoint_step"])
    if info.checkpoint_step is not None and (info.step is None or info.checkpoint_step > info.step):
        info.step = info.checkpoint_step  # the run got at least as far as its checkpoint
    if info.status == RUNNING and process_alive(int(status.get("pid") or 0), status.get("host")) is False:
        info.status, info.reason = KILLED, None
        info.message = f"status.json says running, but process {status.get('pid')} is gone"


def read_status(path: Path) -> dict[str, Any] | None:
    """The run's status.json, None if it has none; InputError if it is unreadable."""
    try:
        status = json.loads((path / STATUS_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise InputError(f"{STATUS_FILE} is not valid JSON: {first_line(e)}") from None
    if not isinstance(status, dict) or status.get("state") not in STATES:
        raise InputError(f"{STATUS_FILE} has no known state")
    return status


def find_runs(root: str | Path) -> list[RunInfo]:
    """The runs directly under ``root``, by name (an empty list when it holds none)."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"{root} does not exist")
    if not root.is_dir():
        raise InputError(f"{root} is not a folder")
    return [summarize_run(p) for p in sorted(root.iterdir()) if looks_like_run(p)]


# ------------------------------------------------------------------------ text


def _step_text(info: RunInfo) -> str:
    step = "-" if info.step is None else str(info.step)
    return f"{step}/{info.total_steps}" if info.total_steps is not None else step


def _checkpoint_text(info: RunInfo, relative_to: Path) -> str:
    if info.checkpoint is None:
        return "-"
    try:
        shown = str(info.checkpoint.relative_to(relative_to))
    except ValueError:
        shown = str(info.checkpoint)
    return f"{shown} (step {info.checkpoint_step})" if info.checkpoint_step is not None else shown


def runs_table(runs: list[RunInfo]) -> str:
    """One line per run: name, status, step/total, phase, last val PSNR, (its MLflow run id, when any
    run has one,) newest checkpoint."""
    tracked = any(info.mlflow for info in runs)
    header = ("run", "status", "step", "phase", "val PSNR", *(("mlflow run",) if tracked else ()), "checkpoint")
    rows = [header] + [
        (
            info.name,
            info.label,
            _step_text(info),
            info.phase or "-",
            "-" if info.val_psnr is None else f"{info.val_psnr:.2f} dB",
            *(((info.mlflow or {}).get("run_id", "-"),) if tracked else ()),
            _checkpoint_text(info, info.path),
        )
        for info in runs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]).rstrip() for row in rows)


def run_report(info: RunInfo) -> str:
    """A few lines a person reads to know where a run stands."""
    lines = [f"run:         {info.path}", f"status:      {info.label}"]
    if info.message:
        lines.append(f"             {info.message}")
    lines.append(f"step:        {_step_text(info)}" + (f" ({info.phase} phase)" if info.phase else ""))
    if info.config:
        schedule = ", ".join(f"{k} {info.config.get(k, getattr(TrainConfig(), k))}" for k in PHASE_KEYS)
        lines.append(f"schedule:    {schedule}")
    if info.train:
        last = info.train[-1]
        values = "  ".join(f"{k}={_num(last[k]):.4g}" for k in (*LOSS_KEYS, *D_KEYS) if k in last)
        lines.append(f"last logged: step {last['step']}: {values}")
        lines.append(f"speed:       {_num(last.get('images_per_s')):.1f} images/s")
    if info.validation:
        last = info.validation[-1]
        lines.append(
            f"validation:  step {last['step']}: PSNR {last['val_psnr']:.2f} dB "
            f"(hole {_num(last.get('val_psnr_hole')):.2f} dB), SSIM {_num(last.get('val_ssim')):.3f}"
        )
        best = max(info.validation, key=lambda r: r["val_psnr"])
        lines.append(f"best PSNR:   {best['val_psnr']:.2f} dB at step {best['step']}")
    lines.append(f"checkpoint:  {_checkpoint_text(info, info.path)}")
    if info.mlflow:
        where = f"{info.mlflow.get('tracking_uri')} (experiment {info.mlflow.get('experiment')})"
        lines.append(f"mlflow:      run {info.mlflow['run_id']} in {where}")
    if info.skipped_lines:
        lines.append(f"note:        {info.skipped_lines} unreadable line(s) in {METRICS_FILE} skipped")
    if info.unreadable_images:
        lines.append(
            f"data:        {info.unreadable_images} unreadable image(s) skipped (first: {info.first_unreadable})"
        )
    if (info.path / TENSORBOARD_DIR).is_dir():
        lines.append(f"tensorboard: tensorboard --logdir {info.path / TENSORBOARD_DIR}")
    return "\n".join(lines)


# ------------------------------------------------------------------------ plot


def plot_run(info: RunInfo, path: str | Path | None = None, overwrite: bool = False) -> Any:
    """Losses, D's outputs and validation PSNR against the step, one axis each
    (PLOT_GROUPS), phase boundaries marked; saved as a PNG at ``path`` if given.

    Returns the matplotlib Figure. Uses ``matplotlib.figure.Figure`` directly,
    not pyplot, so no global backend or figure state is touched.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError(f"--plot needs matplotlib; install it with: {TENSORBOARD_INSTALL}") from None
    if not info.train and not info.validation:
        raise InputError(f"{info.path} has no metrics to plot yet")
    fig = Figure(figsize=(8, 7.5), dpi=100, layout="constrained")
    ax_loss, ax_d, ax_val = fig.subplots(len(PLOT_GROUPS), 1, sharex=True)

    def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
        chosen = [r for r in records if key in r]
        return [int(r["step"]) for r in chosen], [float(r[key]) for r in chosen]

    for key in LOSS_KEYS:
        steps, values = series(info.train, key)
        if steps:
            ax_loss.plot(steps, values, label=key, linewidth=1)
    if any(v > 0 for r in info.train for k, v in r.items() if k in LOSS_KEYS):
        ax_loss.set_yscale("log")  # reconstruction (~1e-2) and alpha-weighted GAN losses (~1e-4) differ in scale
    for key, colour in zip(D_KEYS, ("tab:green", "tab:red")):
        steps, values = series(info.train, key)
        if steps:
            ax_d.plot(steps, values, label=key, linewidth=1, color=colour)
    ax_d.axhline(D_WIN_REAL, color="grey", linestyle=":", linewidth=0.8)
    ax_d.axhline(D_WIN_FAKE, color="grey", linestyle=":", linewidth=0.8)
    ax_d.set_ylim(-0.02, 1.02)
    for key in VAL_KEYS:
        steps, values = series(info.validation, key)
        if steps:
            ax_val.plot(steps, values, label=key, marker="o", markersize=3, linewidth=1)
    for ax, title, unit in zip((ax_loss, ax_d, ax_val), PLOT_GROUPS, ("loss", "mean sigmoid", "dB")):
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel(unit)
        ax.grid(True, alpha=0.3)
        if ax.lines and any(line.get_label()[:1] != "_" for line in ax.lines):
            ax.legend(fontsize=8, loc="best")
        else:
            ax.text(0.5, 0.5, "not reached yet", transform=ax.transAxes, ha="center", va="center", color="grey")
        _mark_phases(ax, info)
    ax_val.set_xlabel("step")
    fig.suptitle(f"{info.name}: {info.label}, step {_step_text(info)}", fontsize=11)
    if path is not None:
        kind = plot_format(path)
        atomic_save(path, lambda tmp: fig.savefig(tmp, format=kind), overwrite=overwrite)
    return fig


PLOT_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".svg": "svg", ".pdf": "pdf"}


def plot_format(path: str | Path) -> str:
    """The image format a --plot path's suffix names (its bytes must match its name)."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise InputError(f"--plot {path}: the name must end in one of {', '.join(PLOT_FORMATS)}")
    return PLOT_FORMATS[suffix]


def _mark_phases(ax: Any, info: RunInfo) -> None:
    """Dashed lines where the discriminator and the joint phases begin."""
    if not info.config:
        return
    defaults = TrainConfig()
    steps_g, steps_d = (int(info.config.get(k, getattr(defaults, k))) for k in ("steps_g", "steps_d"))
    last = info.step or 0
    # Step N is the N-th step trained, so a phase of length L ends after step L.
    for start, name in ((steps_g, "D only"), (steps_g + steps_d, "joint")):
        if 0 < start < last:
            ax.axvline(start + 0.5, color="black", linestyle="--", linewidth=0.7, alpha=0.6)
            ax.text(start + 0.5, 1.0, f" {name}", transform=ax.get_xaxis_transform(), fontsize=7, va="top")

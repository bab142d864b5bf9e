"""What a person watches while a GAN trains: TensorBoard, D's health and the run's status record.

:class:`RunTracker` is the one object the training loop reports to (rank 0 only
writes). It

- writes TensorBoard event files under ``<run>/tensorboard/`` when
  ``TrainConfig.tensorboard`` is on: every loss per phase, D's mean sigmoid
  output on real and on fake, images/s, the learning rates, the validation
  metrics, the validation grid and the resolved config;
- watches D's outputs (:class:`DiscriminatorHealth`) and warns once when D wins
  outright for a sustained stretch;
- keeps ``<run>/status.json`` (state, step, phase, newest checkpoint, pid), which
  ``gantool runs`` reads to tell a running run from a finished, stopped, failed or
  killed one;
- with ``TrainConfig.mlflow``, sends the same to an MLflow run
  (:mod:`gantool.training.tracking_mlflow`).

torch's ``SummaryWriter`` imports the ``tensorboard`` package, so writing logs
needs it, not only viewing them: it is the ``tensorboard`` extra, imported only
when asked for (:func:`summary_writer_class`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gantool import __version__
from gantool.core.artifacts import META_VERSION
from gantool.core.config import TrainConfig, toml_text, tomllib
from gantool.core.constants import CHECKPOINTS_DIR, METRICS_FILE, RUN_CONFIG_FILE, STATUS_FILE, TENSORBOARD_DIR
from gantool.core.errors import InputError, ProcessLostError, TrainingError, first_line
from gantool.core.fileio import atomic_write_text
from gantool.training.tracking_mlflow import RUN_FAILED, RUN_FINISHED, RUN_KILLED, MlflowRunLog, MlflowStore

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger(__name__)

TENSORBOARD_INSTALL = 'pip install "gantool[tensorboard]"'

# D "wins outright" when it calls nearly every real image real and nearly every
# fake one fake: its sigmoid outputs saturate, and the generator's adversarial
# gradient (through log D(G(x))) carries almost no information. A warning is
# logged once when every logged joint step over at least D_WIN_SPAN steps (and
# at least D_WIN_MIN_RECORDS logged steps) has d_real > D_WIN_REAL and
# d_fake < D_WIN_FAKE. Only the joint phase is watched: in the discriminator
# phase G does not train, so D separating real from fake is what that phase is for.
D_WIN_REAL = 0.95
D_WIN_FAKE = 0.05
D_WIN_SPAN = 300  # steps
D_WIN_MIN_RECORDS = 5
D_WATCHED_PHASES = ("joint",)

# STATUS_FILE (status.json): what the training process last said about its run.
RUNNING, FINISHED, STOPPED, FAILED = "running", "finished", "stopped", "failed"
STATES = (RUNNING, FINISHED, STOPPED, FAILED)
# Short reasons beside STOPPED / FAILED (the full message goes to "message").
BY_SIGNAL, EARLY_STOP, NON_FINITE, ERROR = "signal", "early stop", "non-finite", "error"
DATA_STATUS_KEYS = ("unreadable_images", "first_unreadable")  # what a source adds (kept by mark_failed)
PROCESS_LOST = "process lost"  # --nproc-per-node: a worker died or stopped answering (the launcher's record)


def summary_writer_class() -> Any:
    """torch's ``SummaryWriter``, or an InputError that says how to install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise InputError(
            f"--tensorboard needs the tensorboard package ({first_line(e)}); install it with: {TENSORBOARD_INSTALL}"
        ) from None
    return SummaryWriter


def write_status(
    run_dir: Path,
    state: str,
    step: int,
    total_steps: int,
    phase: str,
    checkpoint_step: int | None = None,
    reason: str | None = None,
    message: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Replace ``<run>/status.json`` atomically (a reader never sees half a record); ``extra``: more
    keys (the data's unreadable images, :meth:`~gantool.training.sources.IndexedSource.status`)."""
    record = {
        "state": state,
        "reason": reason,
        "message": message,
        "step": step,
        "total_steps": total_steps,
        "phase": phase,
        "checkpoint_step": checkpoint_step,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    text = json.dumps(record, indent=1) + "\n"
    try:
        atomic_write_text(run_dir / STATUS_FILE, text)
    except InputError:
        # A full disk has no room for the temp file; the old record's blocks can
        # still hold the new one (a reader may then see it half-written, which
        # `gantool runs` reports as broken rather than as a stale "running").
        if not _overwrite_in_place(run_dir / STATUS_FILE, text):
            raise


def failure_reason(exc: BaseException) -> str:
    """status.json's short reason for a run that ``exc`` ended: a non-finite loss, another
    process of the run lost, or any other error."""
    if isinstance(exc, ProcessLostError):
        return PROCESS_LOST
    return NON_FINITE if isinstance(exc, TrainingError) else ERROR


def mark_failed(run_dir: Path, message: str, reason: str = PROCESS_LOST) -> bool:
    """Record in the run's status.json that it failed, keeping its step, phase and checkpoint.

    The ``--nproc-per-node`` launcher calls this after a worker failed: rank 0, which
    keeps the record, may have been killed (kill -9) while it said "running". Returns
    False (and writes nothing) when there is no readable record: the run had not started.
    """
    try:
        record = json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict):
        return False

    def number(key: str) -> int | None:
        value = record.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    write_status(
        run_dir,
        FAILED,
        number("step") or 0,
        number("total_steps") or 0,
        str(record.get("phase") or ""),
        number("checkpoint_step"),
        reason,
        message,
        {k: record[k] for k in DATA_STATUS_KEYS if k in record},
    )
    return True


def _overwrite_in_place(path: Path, text: str) -> bool:
    try:
        with path.open("r+", encoding="utf-8") as f:
            f.write(text)
            f.truncate()
    except OSError:
        return False
    return True


class DiscriminatorHealth:
    """Warns once when D wins outright (see D_WIN_*) over a sustained stretch of logged steps."""

    def __init__(self, span: int = D_WIN_SPAN, min_records: int = D_WIN_MIN_RECORDS) -> None:
        self.span, self.min_records = span, min_records
        self.streak_start: int | None = None  # first step of the current run of D-winning records
        self.streak_records = 0
        self.warned = False

    def observe(self, record: Mapping[str, Any]) -> bool:
        """Take one logged training record; True when this record triggered the warning."""
        if record.get("phase") not in D_WATCHED_PHASES or "d_real" not in record:
            return False
        if not (record["d_real"] > D_WIN_REAL and record["d_fake"] < D_WIN_FAKE):
            self.streak_start, self.streak_records = None, 0
            return False
        if self.streak_start is None:
            self.streak_start = int(record["step"])
        self.streak_records += 1
        stretch = int(record["step"]) - self.streak_start
        if self.warned or stretch < self.span or self.streak_records < self.min_records:
            return False
        self.warned = True
        log.warning(
            "the discriminator wins outright: D(real) > %.2f and D(fake) < %.2f in every logged step from "
            "%d to %d; the generator's adversarial signal is vanishing (consider a lower --lr-d, resuming "
            "from a checkpoint before this stretch)",
            D_WIN_REAL,
            D_WIN_FAKE,
            self.streak_start,
            record["step"],
        )
        return True


class RunTracker:
    """Rank 0's observer of one run; a no-op where ``enabled`` is False (other ranks).

    Use as a context manager around the loop. On an exception the status becomes
    "failed" (``TrainingError``: a non-finite loss) unless :meth:`finish` ran.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        start_step: int,
        phase: str,
        enabled: bool = True,
        mlflow: MlflowStore | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """``mlflow``: the store to track the run in (connected before the run folder was made);
        ``tags``: the MLflow run's tags (data fingerprint, world size)."""
        self.cfg, self.run_dir, self.enabled = cfg, Path(run_dir), enabled
        self.mlflow_store, self.mlflow_tags = mlflow, dict(tags or {})
        self.mlflow: MlflowRunLog | None = None
        self.step, self.phase = start_step, phase
        self.start_step = start_step
        self.checkpoint_step: int | None = start_step if start_step else None
        self.health = DiscriminatorHealth()
        self.writer: Any = None
        self.finished = False
        self.data_status: Callable[[], Mapping[str, Any]] | None = None  # the data's part of status.json

    # -------------------------------------------------------------- context

    def __enter__(self) -> Self:
        if not self.enabled:
            return self
        if self.mlflow_store is not None:
            self._open_mlflow(self.mlflow_store)
        self._status(RUNNING)
        if self.cfg.tensorboard:
            writer_class = summary_writer_class()
            # A resumed run appends a new event file; purge_step makes TensorBoard drop the
            # earlier files' events from the resume point on (a run killed after its last
            # checkpoint logged steps that are trained again), so no step is shown twice.
            purge = self.start_step + 1 if self.start_step else None
            _after_existing_event_files(self.run_dir / TENSORBOARD_DIR)
            self.writer = writer_class(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=purge)
            config = toml_text(self.cfg.to_dict())
            # Markdown: indented lines render as a code block.
            self.writer.add_text("config", "\n".join("    " + line for line in config.splitlines()), self.start_step)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            if self.enabled and exc is not None and not self.finished:
                if isinstance(exc, KeyboardInterrupt):
                    message = "a second signal stopped it at once, without writing a checkpoint"
                    self._status(STOPPED, BY_SIGNAL, message)
                else:
                    self._status(FAILED, failure_reason(exc), first_line(exc))
        except (InputError, OSError) as e:
            if exc is None:
                raise
            log.warning("could not record the run's end in %s: %s", STATUS_FILE, first_line(e))
        finally:
            if self.mlflow is not None:
                mlflow, self.mlflow = self.mlflow, None
                mlflow.close(self._mlflow_status(exc), trained=self._kept_anything())
            if self.writer is not None:
                writer, self.writer = self.writer, None
                try:
                    writer.close()
                except OSError as e:  # a full disk: the event file keeps what was flushed
                    if exc is None:
                        raise InputError(
                            f"cannot write TensorBoard logs in {self.run_dir / TENSORBOARD_DIR}: {e.strerror or e}"
                        ) from None

    # -------------------------------------------------------------- hooks the loop calls

    def log_train(self, record: Mapping[str, Any], lr_g: float, lr_d: float) -> None:
        """One logged training record (step, phase, losses, d_real / d_fake, images_per_s, data_wait)."""
        if not self.enabled:
            return
        self.step, self.phase = int(record["step"]), str(record["phase"])
        d_wins = self.health.observe(record)
        if self.mlflow is not None:
            self.mlflow.train(record, lr_g, lr_d)
            if d_wins:
                self.mlflow.tag("gantool.d_health", f"D wins outright from step {self.health.streak_start}")
        if self.writer is None:
            return
        step = self.step
        for key, value in record.items():
            if key.startswith(("loss_", "d_")):
                self.writer.add_scalar(f"{self.phase}/{key}", value, step)
        self.writer.add_scalar("train/images_per_s", record["images_per_s"], step)
        if "data_wait" in record:
            self.writer.add_scalar("train/data_wait", record["data_wait"], step)
        self.writer.add_scalar("train/lr_g", lr_g, step)
        self.writer.add_scalar("train/lr_d", lr_d, step)

    def log_validation(self, record: Mapping[str, Any], sample_path: Path) -> None:
        """Validation metrics, and the grid just saved at ``sample_path`` (the same image)."""
        if not self.enabled:
            return
        self.step, self.phase = int(record["step"]), str(record["phase"])
        self._status(RUNNING)
        if self.mlflow is not None:
            self.mlflow.validation(record, sample_path)
        if self.writer is None:
            return
        for key, value in record.items():
            if key.startswith("val_"):
                self.writer.add_scalar(f"val/{key.removeprefix('val_')}", value, self.step)
        import numpy as np
        from PIL import Image

        with Image.open(sample_path) as grid:
            pixels = np.asarray(grid.convert("RGB"))
        self.writer.add_image("val/samples", pixels, self.step, dataformats="HWC")
        self.writer.flush()  # a killed run keeps what it showed up to its last validation

    def checkpointed(self, step: int, path: Path | None = None) -> None:
        if not self.enabled:
            return
        self.checkpoint_step = step
        self._status(RUNNING)
        if self.mlflow is not None and path is not None:
            self.mlflow.checkpointed(step, path)

    def finish(self, step: int, phase: str, interrupted: bool) -> None:
        """The loop ended without an error: finished, or stopped (a signal, or ``stop_after``)."""
        if not self.enabled:
            return
        self.step, self.phase, self.finished = step, phase, True
        if step >= self.cfg.total_steps:
            self._status(FINISHED)
        else:
            self._status(STOPPED, BY_SIGNAL if interrupted else EARLY_STOP)

    def _open_mlflow(self, store: MlflowStore) -> None:
        cfg = self.cfg
        run = MlflowRunLog(store, self.run_dir, checkpoints=cfg.mlflow_checkpoints)
        try:  # the resolved config as the run wrote it (with what "auto" chose: amp, channels_last)
            config = (self.run_dir / RUN_CONFIG_FILE).read_text(encoding="utf-8")
        except OSError:
            config = toml_text(cfg.to_dict())
        params = {k: v for k, v in tomllib.loads(config).items() if k != "out"}
        tags = {META_VERSION: __version__, "gantool.run_folder": str(self.run_dir), **self.mlflow_tags}
        tags.setdefault("gantool.world_size", "1")
        run.open(self.start_step, params, tags, config, (cfg.lr, cfg.lr_d or cfg.lr))
        self.mlflow = run

    def _mlflow_status(self, exc: BaseException | None) -> str:
        if self.finished:
            return RUN_FINISHED if self.step >= self.cfg.total_steps else RUN_KILLED
        return RUN_KILLED if exc is None or isinstance(exc, KeyboardInterrupt) else RUN_FAILED

    def _kept_anything(self) -> bool:
        """Whether the run folder keeps a checkpoint or a logged step (else it is removed, and so
        is an MLflow run made for it)."""
        metrics = self.run_dir / METRICS_FILE
        return any((self.run_dir / CHECKPOINTS_DIR).glob("*.pt")) or (metrics.is_file() and metrics.stat().st_size > 0)

    def _status(self, state: str, reason: str | None = None, message: str | None = None) -> None:
        extra = self.data_status() if self.data_status is not None else None
        write_status(
            self.run_dir,
            state,
            self.step,
            self.cfg.total_steps,
            self.phase,
            self.checkpoint_step,
            reason,
            message,
            extra,
        )


def _after_existing_event_files(log_dir: Path) -> None:
    """Wait (at most a second) until a new event file's name sorts after the existing ones.

    TensorBoard reads a folder's event files in name order, and the purge of a
    resume only drops events from files read before it. The names start with
    the creation time in whole seconds, then the pid and a per-process counter
    (not zero-padded), so a file created in the same second as an existing one
    could sort before it.
    """
    newest = 0
    for path in log_dir.glob("events.out.tfevents.*"):
        stamp = path.name.split(".")[3]
        if stamp.isdigit():
            newest = max(newest, int(stamp))
    wait = newest + 1 - time.time()
    if 0 < wait <= 1:  # more would be a clock set back: nothing to gain by waiting
        time.sleep(wait)

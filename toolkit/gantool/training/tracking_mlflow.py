"""A training run tracked in MLflow: what :class:`~gantool.training.tracking.RunTracker` sends to a store.

``gantool train --mlflow [URI]`` (``mlflow = "URI"`` in the TOML) opens one MLflow run per
run folder, on rank 0 only, and feeds it from the same calls as TensorBoard:

- params: the resolved config; tags: gantool's version, the data fingerprint, the run folder,
  the world size;
- metrics at every ``--log-every`` step (step = the global step), named as TensorBoard's tags
  (``joint/loss_adv``, ``train/images_per_s``, ``val/psnr``, ...);
- artifacts: ``config.toml``, each validation grid (``samples/step_N.png``), the final
  checkpoint's metadata (``checkpoint.json``) and, with ``--mlflow-checkpoints``, every checkpoint.

The run id is kept in the run folder (:data:`MLFLOW_RUN_FILE`), so ``--resume`` reopens the same
MLflow run. **Every step once:** MLflow's metric history only appends, and a run killed with
kill -9 after its last checkpoint has already sent steps it will train again. So on opening,
the newest step MLflow holds for each metric is read back, and a value is sent only for a
later step: the steps between the checkpoint and the kill keep the values first sent (the same
losses: a resume on the CPU is bitwise), and steps the store never got (it was down, or the run
was not tracked yet) are sent from metrics.jsonl and samples/ first.

Sending never holds training up: the calls after start-up go through one background thread,
MLflow's HTTP retries are bounded (:data:`HTTP_DEFAULTS`, unless set in the environment), and a
store that fails mid-run gives one warning, after which nothing more is sent; the run folder keeps
everything and a later ``--resume`` sends what is missing. A bad URI or an unreachable store fails
in one line before the run folder is made.

MLflow is the ``mlflow`` extra, imported only when asked for (:func:`import_mlflow`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gantool import __version__
from gantool.core.config import TrainConfig
from gantool.core.constants import CHECKPOINTS_DIR, METRICS_FILE, MLFLOW_RUN_FILE, RUN_CONFIG_FILE, SAMPLES_DIR
from gantool.core.errors import GantoolError, InputError
from gantool.core.fileio import TMP_PREFIX, atomic_write_text
from gantool.core.mlflow_store import (  # noqa: F401 (re-exported)
    MLFLOW_INSTALL,
    MlflowStore,
    import_mlflow,
    mlflow_cause,
    mlflow_installed,
    quiet_mlflow,
    resolve_tracking_uri,
)

log = logging.getLogger(__name__)

QUEUE_LIMIT = 10_000  # calls waiting for the background thread; more means the store cannot keep up
BATCH_LIMIT = 1000  # metrics per log_batch request (MLflow's own limit)
CLOSE_TIMEOUT_S = 120.0  # the end of a run waits at most this long for the store
RUN_KILLED, RUN_FAILED, RUN_FINISHED = "KILLED", "FAILED", "FINISHED"
UPLOAD_PREFIX = TMP_PREFIX + "mlflow-"  # hard links of checkpoints being uploaded


# ----------------------------------------------------------------------------- MLflow itself


def prepare_mlflow(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its tracking URI absolute; the missing extra is one line, before any folder exists."""
    if cfg.mlflow is None:
        return cfg
    if not mlflow_installed():
        raise InputError(f"--mlflow needs MLflow, which is not installed; install it with: {MLFLOW_INSTALL}")
    return cfg.replace(mlflow=resolve_tracking_uri(cfg.mlflow))


def connect_mlflow(cfg: TrainConfig) -> MlflowStore | None:
    """The store a run tracks in, reached now (before its folder is made), on rank 0 only: under
    torchrun the other processes (RANK > 0) never touch it."""
    if cfg.mlflow is None or os.environ.get("RANK", "0") != "0":
        return None
    return MlflowStore.connect(str(cfg.mlflow), cfg.mlflow_experiment)


def read_mlflow_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The run folder's MLflow record (tracking_uri, experiment_id, experiment, run_id), or None."""
    try:
        record = json.loads((Path(run_dir) / MLFLOW_RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        return None
    return record


def metrics_of(record: Mapping[str, Any], lr_g: float | None = None, lr_d: float | None = None) -> dict[str, float]:
    """A metrics.jsonl record as MLflow metrics, named as the TensorBoard tags."""
    if "val_psnr" in record:
        return {f"val/{k.removeprefix('val_')}": float(v) for k, v in record.items() if k.startswith("val_")}
    phase = record["phase"]
    metrics = {f"{phase}/{k}": float(v) for k, v in record.items() if k.startswith(("loss_", "d_"))}
    for key in ("images_per_s", "data_wait"):
        if key in record:
            metrics[f"train/{key}"] = float(record[key])
    if lr_g is not None and lr_d is not None:
        metrics["train/lr_g"], metrics["train/lr_d"] = float(lr_g), float(lr_d)
    return metrics


# ----------------------------------------------------------------------------- sending


class _Sender:
    """One background thread that makes the store's calls in order; training never waits for it.

    The first failure is one warning; nothing is sent after it (the run folder has everything).
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.failed: str | None = None
        self.calls: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.Queue(QUEUE_LIMIT)
        self.thread = threading.Thread(target=self._work, name="gantool-mlflow", daemon=True)
        self.thread.start()

    def put(self, call: Callable[..., Any], *args: Any) -> None:
        if self.failed is not None:
            return
        try:
            self.calls.put_nowait((call, args))
        except queue.Full:
            self._fail(f"it fell {QUEUE_LIMIT} calls behind")

    def _work(self) -> None:
        while (item := self.calls.get()) is not None:
            call, args = item
            try:
                if self.failed is None:
                    call(*args)
            except Exception as e:
                self._fail(mlflow_cause(e))
            finally:
                self.calls.task_done()

    def wait_idle(self) -> None:
        """Until every queued call is done (``gantool bench train --mlflow`` times the sending this way)."""
        self.calls.join()

    def _fail(self, cause: str) -> None:
        if self.failed is None:
            self.failed = cause
            log.warning(
                "MLflow: the tracking store %s failed (%s); training goes on without it: the run folder keeps "
                "every metric, sample and checkpoint, and --resume sends what the store is missing",
                self.uri,
                cause,
            )

    def close(self, timeout: float) -> bool:
        """Let the queued calls finish (at most ``timeout`` s); whether they did."""
        with contextlib.suppress(queue.Full):
            self.calls.put(None, timeout=1.0)
        self.thread.join(timeout)
        return not self.thread.is_alive()


class MlflowRunLog:
    """Rank 0's MLflow run for one run folder: opened (or reopened), fed, ended."""

    def __init__(self, store: MlflowStore, run_dir: Path, checkpoints: bool = False) -> None:
        self.store, self.client, self.run_dir, self.checkpoints = store, store.client, Path(run_dir), checkpoints
        self.run_id = ""
        self.created = False  # this process made the MLflow run (deleted again if nothing was trained)
        self.sent: dict[str, int] = {}  # each metric's newest step in the store
        self.sent_samples: set[str] = set()  # the grids the store holds (file names)
        self.sender: _Sender | None = None
        self.last_checkpoint: tuple[int, Path] | None = None
        self.last_records: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ start

    def open(
        self,
        start_step: int,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        config_text: str,
        lrs: tuple[float, float],
    ) -> None:
        """Create the MLflow run, or reopen the one the run folder names; then queue what it misses."""
        try:
            with quiet_mlflow():
                run = self._reopen(start_step)
                if run is None:
                    run = self._create(params, tags)
                else:
                    self._update_params(run, params, start_step)
                    self.client.set_tag(self.run_id, "gantool.world_size", tags["gantool.world_size"])
                    self.client.update_run(self.run_id, status="RUNNING")
        except GantoolError:
            raise
        except Exception as e:
            raise InputError(f"--mlflow {self.store.uri}: cannot open the MLflow run: {mlflow_cause(e)}") from None
        self.sender = _Sender(self.store.uri)
        self.sender.put(self.client.log_text, self.run_id, config_text, RUN_CONFIG_FILE)
        self._send_missing(start_step, lrs)
        for leftover in self.run_dir.glob(UPLOAD_PREFIX + "*"):  # a killed upload's hard links
            shutil.rmtree(leftover, ignore_errors=True)

    def _reopen(self, start_step: int) -> Any:
        record = read_mlflow_record(self.run_dir)
        if record is None or record.get("tracking_uri") != self.store.uri:
            if record is not None:
                log.warning(
                    "MLflow: this run was tracked in %s (run %s); it goes on in a new run in %s",
                    record.get("tracking_uri"), record["run_id"], self.store.uri,
                )  # fmt: skip
            return None
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(record["run_id"])
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                raise
            run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            log.warning("MLflow: run %s is gone from %s; a new one takes its place", record["run_id"], self.store.uri)
            return None
        self.run_id = run.info.run_id
        self.sent = self._newest_steps(run)
        # Grids by what the store holds, not by their metrics: a kill between a step's metrics and
        # its grid upload once lost that grid for good (the resumed step's metrics were not fresh).
        self.sent_samples = {Path(a.path).name for a in self.client.list_artifacts(self.run_id, SAMPLES_DIR)}
        return run

    def _newest_steps(self, run: Any) -> dict[str, int]:
        # A run's latest value of each metric is the one at its highest step (MLflow's own rule).
        metrics = getattr(run.data, "_metric_objs", None)
        if metrics is None:  # another MLflow: the history of each metric
            metrics = [m for key in run.data.metrics for m in self.client.get_metric_history(self.run_id, key)]
        newest: dict[str, int] = {}
        for metric in metrics:
            newest[metric.key] = max(newest.get(metric.key, metric.step), metric.step)
        return newest

    def _create(self, params: Mapping[str, Any], tags: Mapping[str, str]) -> Any:
        from mlflow.entities import Param

        run = self.client.create_run(self.store.experiment_id, run_name=self.run_dir.name, tags=dict(tags))
        self.run_id, self.created, self.sent = run.info.run_id, True, {}
        record = {
            "tracking_uri": self.store.uri,
            "experiment_id": self.store.experiment_id,
            "experiment": self.store.experiment,
            "run_id": self.run_id,
        }
        atomic_write_text(self.run_dir / MLFLOW_RUN_FILE, json.dumps(record, indent=1) + "\n")
        items = [Param(key, _param_text(value)) for key, value in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])
        return run

    def _update_params(self, run: Any, params: Mapping[str, Any], start_step: int) -> None:
        """Params never change in MLflow: new keys are logged, changed ones recorded in a tag."""
        from mlflow.entities import Param

        old = run.data.params
        new = [Param(k, _param_text(v)) for k, v in params.items() if k not in old]
        changed = {k: [old[k], _param_text(v)] for k, v in params.items() if k in old and old[k] != _param_text(v)}
        if new:
            self.client.log_batch(self.run_id, params=new)
        if changed:
            self.client.set_tag(self.run_id, f"gantool.changed_at_step_{start_step}", json.dumps(changed))

    def _send_missing(self, start_step: int, lrs: tuple[float, float]) -> None:
        """Steps up to ``start_step`` that metrics.jsonl and samples/ hold and the store does not."""
        path = self.run_dir / METRICS_FILE
        records = []
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    record = json.loads(line)
                    if isinstance(record, dict) and int(record["step"]) <= start_step:
                        records.append(record)
        pending: list[Any] = []  # in requests of BATCH_LIMIT metrics: a long run's history is thousands of records
        for record in records:
            is_val = "val_psnr" in record
            pending += self._fresh_metrics(record, *(() if is_val else lrs))
            if is_val:
                self._queue_sample(self.run_dir / SAMPLES_DIR / f"step_{record['step']}.png")
        self._queue_batches(pending)

    # ------------------------------------------------------------------ during the run

    def train(self, record: Mapping[str, Any], lr_g: float, lr_d: float) -> None:
        self.last_records["train"] = dict(record)
        self._queue_metrics(record, lr_g, lr_d)

    def validation(self, record: Mapping[str, Any], sample_path: Path) -> None:
        self.last_records["val"] = dict(record)
        self._queue_metrics(record)
        self._queue_sample(sample_path)  # after its step's metrics

    def tag(self, key: str, value: str) -> None:
        if self.sender is not None:
            self.sender.put(self.client.set_tag, self.run_id, key, value)

    def checkpointed(self, step: int, path: Path) -> None:
        self.last_checkpoint = (step, path)
        if not self.checkpoints or self.sender is None:
            return
        # A hard link keeps this checkpoint's bytes while last.pt is replaced by the next one.
        folder = self.run_dir / f"{UPLOAD_PREFIX}{step}"
        try:
            folder.mkdir(exist_ok=True)
            link = folder / f"step_{step}.pt"
            link.unlink(missing_ok=True)
            os.link(path, link)
        except OSError as e:
            log.warning("MLflow: cannot stage %s for upload: %s", path, e.strerror or e)
            return
        self.sender.put(self._upload_checkpoint, folder, link)

    def _upload_checkpoint(self, folder: Path, link: Path) -> None:
        try:
            self.client.log_artifact(self.run_id, str(link), CHECKPOINTS_DIR)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _queue_metrics(self, record: Mapping[str, Any], lr_g: float | None = None, lr_d: float | None = None) -> bool:
        """Queue the record's metrics at steps past what the store holds; whether there were any."""
        fresh = self._fresh_metrics(record, lr_g, lr_d)
        self._queue_batches(fresh)
        return bool(fresh)

    def _fresh_metrics(
        self, record: Mapping[str, Any], lr_g: float | None = None, lr_d: float | None = None
    ) -> list[Any]:
        """The record's metrics at a step past the newest the store holds for each (then marked sent)."""
        if self.sender is None:
            return []
        from mlflow.entities import Metric

        step, now = int(record["step"]), int(time.time() * 1000)
        fresh = [
            Metric(k, v, now, step) for k, v in metrics_of(record, lr_g, lr_d).items() if step > self.sent.get(k, -1)
        ]
        for metric in fresh:
            self.sent[metric.key] = step
        return fresh

    def _queue_batches(self, metrics: list[Any]) -> None:
        if self.sender is not None:
            for start in range(0, len(metrics), BATCH_LIMIT):
                self.sender.put(self._log_metrics, metrics[start : start + BATCH_LIMIT])

    def _log_metrics(self, metrics: list[Any]) -> None:
        self.client.log_batch(self.run_id, metrics=metrics)

    def _queue_sample(self, path: Path) -> None:
        """A grid the store does not hold yet, once."""
        if self.sender is not None and path.name not in self.sent_samples and path.is_file():
            self.sent_samples.add(path.name)
            self.sender.put(self._log_sample, path)

    def _log_sample(self, path: Path) -> None:
        if path.is_file():  # a later run (a resume) may have replaced it meanwhile: same step, same grid
            self.client.log_artifact(self.run_id, str(path), SAMPLES_DIR)

    # ------------------------------------------------------------------ end

    def close(self, status: str, trained: bool) -> None:
        """End the MLflow run with ``status``; one this process made that trained nothing is deleted
        (as its run folder is). Waits at most CLOSE_TIMEOUT_S for the store."""
        sender = self.sender
        if sender is None:
            return
        if not trained and self.created:
            sender.put(self.client.delete_run, self.run_id)
            (self.run_dir / MLFLOW_RUN_FILE).unlink(missing_ok=True)
        else:
            if self.last_checkpoint is not None:
                sender.put(self._log_checkpoint_metadata, *self.last_checkpoint)
            sender.put(self.client.set_terminated, self.run_id, status)
        if not sender.close(CLOSE_TIMEOUT_S):
            log.warning(
                "MLflow: the tracking store %s did not finish within %.0f s; run %s may show as running there "
                "(the run folder keeps everything)",
                self.store.uri, CLOSE_TIMEOUT_S, self.run_id,
            )  # fmt: skip

    def _log_checkpoint_metadata(self, step: int, path: Path) -> None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(2**20):
                digest.update(chunk)
        metadata = {
            "file": str(path),
            "step": step,
            "bytes": path.stat().st_size,
            "sha256": digest.hexdigest(),
            "gantool_version": __version__,
            "run_folder": str(self.run_dir),
            "metrics": self.last_records.get("train", {}),
            "validation": self.last_records.get("val", {}),
        }
        self.client.log_dict(self.run_id, metadata, "checkpoint.json")


def _param_text(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)
    return text[:6000]  # MLflow's limit for a param value

"""Real MLflow stores for the tests: a SQLite database, and an ``mlflow server`` process on a loopback port.

Nothing is mocked: gantool talks to MLflow's own client and server. The server runs as its own
process group (uvicorn and its workers), so a test can kill it whole (the store "goes away") and
no process outlives the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MlflowServer:
    """A running ``mlflow server`` (HTTP tracking and artifact upload) and where it keeps things."""

    url: str
    process: subprocess.Popen
    folder: Path

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """End the server and every process it started (its own process group)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        else:  # the group may outlive its leader (uvicorn's workers)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)


def start_mlflow_server(folder: Path) -> MlflowServer:
    """``mlflow server`` on a free loopback port with a SQLite backend and an artifact folder."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(folder / "server.log", "wb")  # noqa: SIM115 (the server writes it while it runs)
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
               "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]  # fmt: skip
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    process = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)  # fmt: skip
    server = MlflowServer(f"http://127.0.0.1:{port}", process, folder)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            server.stop()
            pytest.fail(f"mlflow server exited with {process.returncode}:\n{(folder / 'server.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            time.sleep(0.3)
    server.stop()
    pytest.fail(f"mlflow server did not answer within {SERVER_START_TIMEOUT_S} s")


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path}"


def client_for(uri: str):
    from gantool.training.tracking_mlflow import import_mlflow, quiet_mlflow

    with quiet_mlflow():  # SQLAlchemy's deprecation warning as MLflow sets its store up
        client = import_mlflow().MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)  # the store's set-up happens here, not in a test's assert
    return client


def runs_of(uri: str, experiment: str, deleted: bool = False) -> list:
    """The runs of ``experiment`` (with ``deleted``, the deleted ones too)."""
    from mlflow.entities import ViewType

    client = client_for(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {uri}"
    view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
    return client.search_runs([found.experiment_id], run_view_type=view)


def run_of(uri: str, experiment: str):
    """The one MLflow run of ``experiment`` (failing if there are several or none)."""
    runs = runs_of(uri, experiment)
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def histories(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric's history as (step, value) pairs, in the order MLflow returns them."""
    client = client_for(uri)
    keys = client.get_run(run_id).data.metrics
    return {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in keys}


def metrics_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def expected_steps(run_dir: Path) -> dict[str, list[int]]:
    """The steps each MLflow metric must have, from the run folder's metrics.jsonl."""
    from gantool.training.tracking_mlflow import metrics_of

    steps: dict[str, list[int]] = {}
    for record in metrics_lines(run_dir):
        lrs = () if "val_psnr" in record else (1.0, 1.0)
        for key in metrics_of(record, *lrs):
            steps.setdefault(key, []).append(int(record["step"]))
    return steps


def assert_every_step_once(uri: str, run_id: str, run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The MLflow run's history holds each step of metrics.jsonl once, for every metric, and nothing else."""
    found = histories(uri, run_id)
    expected = expected_steps(run_dir)
    assert set(found) == set(expected), (sorted(found), sorted(expected))
    for key, points in found.items():
        assert sorted(step for step, _ in points) == expected[key], key
    return found

"""``gantool train --mlflow``: runs tracked in real MLflow stores (a SQLite database, a real
``mlflow server`` process), read back with MLflow's own client. Nothing is mocked.

The fast tier shares one SQLite store per module (each test its own experiment); the slow tier
runs ``gantool train`` processes against a server on a loopback port: resume after SIGKILL,
SIGTERM, a server killed mid-run, two DDP processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import gantool.training.steps as steps_module
from gantool.cli import cli
from gantool.core.config import tomllib
from gantool.core.errors import InputError, TrainingError
from gantool.training.loop import train
from gantool.training.signals import StopFlag
from gantool.training.tracking_mlflow import MLFLOW_INSTALL, metrics_of
from mlflow_helpers import (
    assert_every_step_once,
    client_for,
    histories,
    metrics_lines,
    run_of,
    runs_of,
    sqlite_uri,
)
from tiny import TINY_ARGS, tiny_train_config

pytest.importorskip("mlflow")  # the dev extra installs it


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module (its tables are made once); each test uses its own experiment."""
    return sqlite_uri(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """The test's folder as the current one: MLflow puts a SQLite store's artifacts in ./mlruns."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def download(uri: str, run_id: str, path: str) -> Path:
    import mlflow

    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, tracking_uri=uri))


def test_a_run_is_one_mlflow_run_with_the_config_tags_every_metric_and_the_artifacts(store, here):
    out = here / "run"
    train(tiny_train_config(out=str(out), mlflow=store, mlflow_experiment="full", lr_d=1e-4), progress=False)
    run = run_of(store, "full")
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    record = json.loads((out / "mlflow.json").read_text())
    assert record["run_id"] == run.info.run_id and record["tracking_uri"] == store and record["experiment"] == "full"

    config = tomllib.loads((out / "config.toml").read_text())  # what "auto" chose included (amp)
    assert "amp" in config and config["mlflow"] == store
    params = {k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in config.items() if k != "out"}
    assert run.data.params == params
    tags = run.data.tags
    assert tags["gantool.run_folder"] == str(out.resolve()) and tags["gantool.world_size"] == "1"
    assert json.loads(tags["gantool.data_fingerprint"])["path"] == "synthetic"
    import gantool

    assert tags["gantool.version"] == gantool.__version__

    # Every metric at every logged step, once, with metrics.jsonl's values (g 1-2, d 3-4, joint 5-8).
    found = assert_every_step_once(store, run.info.run_id, out)
    assert [s for s, _ in found["g/loss_rec"]] == [1, 2] and [s for s, _ in found["joint/loss_adv"]] == [5, 6, 7, 8]
    assert [s for s, _ in found["val/psnr"]] == [4, 8] and [s for s, _ in found["d/d_real"]] == [3, 4]
    for line in metrics_lines(out):
        for key, value in metrics_of(line).items():
            assert dict(found[key])[line["step"]] == pytest.approx(value, rel=1e-12), key
    assert {v for _, v in found["train/lr_g"]} == {2e-4} and {v for _, v in found["train/lr_d"]} == {1e-4}

    assert download(store, run.info.run_id, "config.toml").read_text() == (out / "config.toml").read_text()
    for step in (4, 8):
        grid = download(store, run.info.run_id, f"samples/step_{step}.png")
        assert grid.read_bytes() == (out / "samples" / f"step_{step}.png").read_bytes()
    meta = json.loads(download(store, run.info.run_id, "checkpoint.json").read_text())
    last = out / "checkpoints" / "last.pt"
    assert meta["step"] == 8 and meta["sha256"] == hashlib.sha256(last.read_bytes()).hexdigest()
    assert meta["file"] == str(last) and meta["metrics"]["step"] == 8
    names = {a.path for a in client_for(store).list_artifacts(run.info.run_id)}
    assert "checkpoints" not in names  # checkpoints themselves only with --mlflow-checkpoints


def test_mlflow_checkpoints_uploads_every_checkpoint_and_leaves_nothing_behind(store, here):
    out = here / "run"
    train(tiny_train_config(out=str(out), mlflow=store, mlflow_experiment="checkpoints", mlflow_checkpoints=True,
                            keep_checkpoints=False), progress=False)  # fmt: skip
    run = run_of(store, "checkpoints")
    names = {a.path for a in client_for(store).list_artifacts(run.info.run_id, "checkpoints")}
    assert names == {"checkpoints/step_4.pt", "checkpoints/step_8.pt"}
    # step 4's bytes, although last.pt was replaced by step 8's meanwhile (a hard link kept them)
    step_4 = download(store, run.info.run_id, "checkpoints/step_4.pt")
    from gantool.training.checkpoint import load_checkpoint

    assert load_checkpoint(step_4)["step"] == 4
    assert download(store, run.info.run_id, "checkpoints/step_8.pt").read_bytes() == (
        out / "checkpoints" / "last.pt"
    ).read_bytes()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no upload links left


def test_a_killed_run_resumed_has_every_step_once_and_ends_finished(store, here):
    out = here / "run"
    cfg = tiny_train_config(out=str(out), mlflow=store, mlflow_experiment="resume", checkpoint_every=2,
                            sample_every=2)  # fmt: skip
    train(cfg, stop_after=6, progress=False)
    first = run_of(store, "resume")
    assert first.info.status == "KILLED"  # stopped before the schedule's end
    sent = histories(store, first.info.run_id)
    assert [s for s, _ in sent["joint/loss_rec"]] == [5, 6]
    # As after a kill -9 at step 6 whose last checkpoint is step 4: steps 5-6 are trained again, and
    # MLflow already holds them (its history only appends).
    (out / "checkpoints" / "step_6.pt").unlink()
    (out / "checkpoints" / "last.pt").unlink()
    os.link(out / "checkpoints" / "step_4.pt", out / "checkpoints" / "last.pt")
    # And killed after step 6's metrics reached the store but before its grid did (CI's server test
    # once lost a grid so: the resumed step's metrics were not fresh, so its grid was never sent).
    artifacts = Path(client_for(store).get_run(first.info.run_id).info.artifact_uri.removeprefix("file://"))
    (artifacts / "samples" / "step_6.png").unlink()
    train({}, resume=out / "checkpoints" / "last.pt", progress=False)

    run = run_of(store, "resume")  # the same MLflow run, reopened
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    found = assert_every_step_once(store, run.info.run_id, out)
    assert [s for s, _ in found["train/images_per_s"]] == list(range(1, 9))
    assert [s for s, _ in found["val/psnr"]] == [2, 4, 6, 8]
    grids = {a.path for a in client_for(store).list_artifacts(run.info.run_id, "samples")}
    assert grids == {f"samples/step_{s}.png" for s in (2, 4, 6, 8)}
    # Steps 5 and 6 keep the values first sent: the resumed run's losses are bitwise the same.
    again = {line["step"]: line for line in metrics_lines(out) if "loss_rec" in line}
    for step in (5, 6):
        assert dict(found["joint/loss_rec"])[step] == again[step]["loss_rec"]
        assert dict(found["joint/loss_adv"])[step] == again[step]["loss_adv"]


def test_a_run_tracked_only_from_its_resume_gets_its_earlier_steps_from_the_run_folder(store, here):
    out = here / "run"
    train(tiny_train_config(out=str(out), checkpoint_every=2, sample_every=2), stop_after=4, progress=False)
    assert not (out / "mlflow.json").exists()
    train({"mlflow": store, "mlflow_experiment": "late"}, resume=out, progress=False)
    run = run_of(store, "late")
    assert run.info.status == "FINISHED"
    found = assert_every_step_once(store, run.info.run_id, out)
    assert [s for s, _ in found["train/images_per_s"]] == list(range(1, 9))
    grids = {a.path for a in client_for(store).list_artifacts(run.info.run_id, "samples")}
    assert grids == {f"samples/step_{s}.png" for s in (2, 4, 6, 8)}


def test_a_failed_run_ends_failed_and_an_untrained_start_leaves_no_mlflow_run(store, here, monkeypatch):
    real_mse = steps_module.hole_mse
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        value = real_mse(*args)
        return value * float("nan") if calls["n"] > 3 else value

    monkeypatch.setattr(steps_module, "hole_mse", poisoned)
    with pytest.raises(TrainingError, match="non-finite"):
        train(tiny_train_config(out=str(here / "bad"), mlflow=store, mlflow_experiment="failed",
                                checkpoint_every=2), progress=False)  # fmt: skip
    assert run_of(store, "failed").info.status == "FAILED"
    monkeypatch.undo()

    # A stop before the first step removes the new run folder, and the MLflow run made for it.
    stop = StopFlag()
    stop.requested = True
    result = train(tiny_train_config(out=str(here / "none"), mlflow=store, mlflow_experiment="untrained"),
                   progress=False, stop=stop)  # fmt: skip
    assert result.run_dir is None and not (here / "none").exists()
    assert [r.info.lifecycle_stage for r in runs_of(store, "untrained", deleted=True)] == ["deleted"]


def one_line_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_a_bad_or_unreachable_store_is_one_line_before_any_folder(here):
    from mlflow_helpers import free_port

    out = here / "run"
    started = time.monotonic()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    line = one_line_error(CliRunner().invoke(cli, ["train", "--out", str(out), *TINY_ARGS, "--mlflow", dead]))
    assert dead in line and "connection refused" in line
    assert time.monotonic() - started < 30  # bounded retries, not MLflow's minutes
    line = one_line_error(CliRunner().invoke(cli, ["train", "--out", str(out), *TINY_ARGS, "--mlflow", "abc"]))
    assert "mlflow = 'abc'" in line and "scheme" in line
    line = one_line_error(CliRunner().invoke(cli, ["train", "--out", str(out), *TINY_ARGS, "--mlflow", "foo://x"]))
    assert "foo://x" in line and "cannot use this MLflow tracking store" in line
    toml = here / "t.toml"
    toml.write_text("mlflow = 3\n")
    line = one_line_error(CliRunner().invoke(cli, ["train", "--out", str(out), *TINY_ARGS, "--config", str(toml),
                                                   "--mlflow", "sqlite:///x.db"]))  # fmt: skip
    assert "mlflow = 3" in line and str(toml) in line
    line = one_line_error(CliRunner().invoke(cli, ["train", "--out", str(out), *TINY_ARGS, "--mlflow-checkpoints"]))
    assert "needs mlflow" in line
    assert sorted(p.name for p in here.iterdir()) == ["t.toml"]  # no run folder, no store


def test_without_the_extra_mlflow_is_one_line_naming_it(here, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: importing it fails
    with pytest.raises(InputError, match=r'pip install "gantool\[mlflow\]"'):
        train(tiny_train_config(out=str(here / "run"), mlflow="sqlite:///m.db"), progress=False)
    line = one_line_error(CliRunner().invoke(cli, ["train", "--out", "run", *TINY_ARGS, "--mlflow"]))
    assert MLFLOW_INSTALL in line
    assert list(here.iterdir()) == []


def test_gantool_runs_names_the_mlflow_run(store, here):
    train(tiny_train_config(out=str(here / "runs" / "tracked"), mlflow=store, mlflow_experiment="listed",
                            steps_g=1, steps_d=0, steps_joint=1), progress=False)  # fmt: skip
    train(tiny_train_config(out=str(here / "runs" / "plain"), steps_g=1, steps_d=0, steps_joint=1), progress=False)
    run_id = run_of(store, "listed").info.run_id
    table = CliRunner().invoke(cli, ["runs", str(here / "runs")])
    assert table.exit_code == 0, table.output
    header, plain, tracked = table.output.splitlines()
    assert "mlflow run" in header and run_id in tracked and run_id not in plain
    report = CliRunner().invoke(cli, ["runs", str(here / "runs" / "tracked")]).output
    assert f"mlflow:      run {run_id} in {store} (experiment listed)" in report


def test_importing_the_training_modules_does_not_import_mlflow(subprocess_env):
    code = "import sys, gantool.training.loop, gantool.training.runs, gantool.cli; print('mlflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True,
                            check=True)  # fmt: skip
    assert result.stdout.strip() == "False"


# ------------------------------------------------------------------ slow: processes, a real server, DDP


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real ``mlflow server`` (SQLite backend, artifact upload) on a loopback port, for the module."""
    from mlflow_helpers import start_mlflow_server

    started = start_mlflow_server(tmp_path_factory.mktemp("server"))
    yield started
    started.stop()


LONG_RUN = [*TINY_ARGS, "--steps-g", "100000", "--steps-d", "0", "--steps-joint", "0", "--log-every", "1",
            "--sample-every", "4", "--no-keep-checkpoints"]  # fmt: skip


def start_training(args: list[str], cwd: Path) -> subprocess.Popen:
    from conftest import TOOLKIT

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(TOOLKIT), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.Popen([sys.executable, "-m", "gantool", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def logged_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 180, after: int = 0) -> None:
    """Until ``proc`` logs ``step`` in metrics.jsonl, past its first ``after`` lines (an earlier
    process's: the file only grows)."""
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        lines = path.read_text().splitlines()[after:] if path.exists() else []
        if any(json.loads(line).get("step", 0) >= step for line in lines if line.strip().endswith("}")):
            return
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"training did not reach step {step} within {timeout} s")


@pytest.mark.slow  # three training processes against a real server
def test_a_server_tracked_run_killed_with_sigkill_then_sigterm_resumes_with_every_step_once(server, tmp_path):
    import signal

    out = tmp_path / "run"
    first = start_training(["--out", str(out), *LONG_RUN, "--checkpoint-every", "5", "--mlflow", server.url,
                            "--mlflow-experiment", "killed"], tmp_path)  # fmt: skip
    wait_for_step(first, out, 8)
    time.sleep(1.0)  # the sender catches up: the server holds steps past the step-5 checkpoint
    first.kill()  # SIGKILL: no handler runs
    first.communicate(timeout=60)
    run_id = json.loads((out / "mlflow.json").read_text())["run_id"]
    assert client_for(server.url).get_run(run_id).info.status == "RUNNING"  # as a killed process leaves it
    sent = max(step for step, _ in histories(server.url, run_id)["train/images_per_s"])
    assert sent > 5  # steps after the last checkpoint reached the store, and will be trained again

    # The killed process logged past `sent` itself: only the resumed process's lines count (CI once
    # sent SIGTERM while it was still starting, before its handlers: -15, not 143).
    earlier = logged_lines(out)
    second = start_training(["--resume", str(out)], tmp_path)
    wait_for_step(second, out, sent + 3, after=earlier)
    second.send_signal(signal.SIGTERM)
    _, stderr = second.communicate(timeout=120)
    assert second.returncode == 143, stderr
    assert "MLflow" not in stderr  # no warning: the store answered throughout
    assert client_for(server.url).get_run(run_id).info.status == "KILLED"

    result = train({"steps_g": json.loads((out / "status.json").read_text())["step"] + 2}, resume=out, progress=False)
    run = run_of(server.url, "killed")
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    found = assert_every_step_once(server.url, run_id, out)
    assert [s for s, _ in found["train/images_per_s"]] == list(range(1, result.step + 1))
    grids = {a.path for a in client_for(server.url).list_artifacts(run_id, "samples")}
    assert grids == {f"samples/step_{s}.png" for s in range(4, result.step + 1, 4)} | {f"samples/step_{result.step}.png"}
    uploaded = server.folder / "artifacts"
    assert any(uploaded.rglob("step_4.png"))  # through the server's artifact upload, into its folder


@pytest.mark.slow  # a server of its own, killed while a training process sends to it
def test_a_server_killed_mid_run_is_one_warning_and_the_run_goes_on(tmp_path):
    from mlflow_helpers import start_mlflow_server

    doomed = start_mlflow_server(tmp_path / "doomed")
    try:
        out = tmp_path / "run"
        proc = start_training(["--out", str(out), *TINY_ARGS, "--steps-g", "60", "--steps-d", "0", "--steps-joint",
                               "0", "--log-every", "1", "--checkpoint-every", "20", "--sample-every", "20",
                               "--mlflow", doomed.url, "--mlflow-experiment", "doomed"], tmp_path)  # fmt: skip
        wait_for_step(proc, out, 5)
        doomed.stop()  # SIGKILL to the server and its workers
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        doomed.stop()
    assert proc.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if "MLflow" in line]
    assert len(warnings) == 1 and doomed.url in warnings[0] and "training goes on" in warnings[0], stderr
    assert "Traceback" not in stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(steps)) == list(range(1, 61))  # the run folder keeps everything
    assert json.loads((out / "status.json").read_text())["state"] == "finished"
    assert {p.name for p in (out / "samples").iterdir()} == {"step_20.png", "step_40.png", "step_60.png"}


@pytest.mark.slow  # torchrun: two processes
def test_two_ddp_processes_make_one_mlflow_run(tmp_path, subprocess_env):
    from test_distributed import TINY_ARGS as DDP_ARGS
    from test_distributed import run_to_end

    uri = sqlite_uri(tmp_path / "ddp.db")
    out = tmp_path / "run"
    run_to_end([*DDP_ARGS, "--out", str(out), "--steps-g", "2", "--steps-d", "1", "--steps-joint", "2",
                "--sample-every", "5", "--mlflow", uri, "--mlflow-experiment", "ddp"], tmp_path, subprocess_env)  # fmt: skip
    run = run_of(uri, "ddp")  # one run: rank 1 never touched the store
    assert run.info.status == "FINISHED" and run.data.tags["gantool.world_size"] == "2"
    found = assert_every_step_once(uri, run.info.run_id, out)
    assert [s for s, _ in found["train/images_per_s"]] == [1, 2, 3, 4, 5]

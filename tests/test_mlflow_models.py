"""Exports as MLflow models: logged and registered (``gantool export --mlflow --register``), loaded with
``mlflow.pyfunc``, served by ``mlflow models serve``, and ``models:/``/``runs:/`` URIs as ``--model``.

Real stores only: a SQLite store for the module's fast tests (the session's tiny export logged once),
and in the slow tier the whole path through a real ``mlflow server`` process: a tracked run,
interrupted and resumed, exported, registered, then inpainted through ``gantool inpaint --model
models:/NAME/1``, ``mlflow.pyfunc`` and ``mlflow models serve``, byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from gantool.cli import cli
from gantool.core.errors import InputError
from inpaint_helpers import box_mask_image, exported_model, textured_rgb  # noqa: F401 (a fixture)
from mlflow_helpers import client_for, free_port, run_of, sqlite_uri, start_mlflow_server

pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def registry(tmp_path_factory, exported_model):
    """A SQLite store holding the session's tiny export as the registered model ``tiny`` version 1
    (alias ``champion``), and a cache folder for the URIs."""
    from gantool.inference.mlflow_model import log_export

    folder = tmp_path_factory.mktemp("registry")
    uri = sqlite_uri(folder / "mlflow.db")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # a SQLite store's artifacts go to ./mlruns
        logged = log_export(exported_model.folder, uri, "models", register="tiny")
    assert logged.registered == ("tiny", "1") and logged.run_id is None
    client_for(uri).set_registered_model_alias("tiny", "champion", "1")
    return {"uri": uri, "cache": folder / "cache", "logged": logged, "export": exported_model.folder}


@pytest.fixture
def store_env(registry, monkeypatch, tmp_path):
    """MLflow's store and gantool's cache as a user would set them, from the test's own folder."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry["uri"])
    monkeypatch.setenv("GANTOOL_CACHE", str(registry["cache"]))
    monkeypatch.chdir(tmp_path)
    return registry


def picture(folder: Path, height: int = 40, width: int = 44) -> tuple[Path, Path]:
    image, mask = folder / "photo.png", folder / "hole.png"
    Image.fromarray(textured_rgb(height, width, seed=5)).save(image)
    box_mask_image(height, width, 8, 10, 30, 28).save(mask)
    return image, mask


def inpaint(model: str, image: Path, mask: Path, out: Path) -> bytes:
    result = CliRunner().invoke(cli, ["inpaint", str(image), "-m", str(mask), "--model", model, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out.read_bytes()


def test_models_uris_inpaint_byte_identical_to_the_folder_and_through_pyfunc(store_env, tmp_path):
    import mlflow

    image, mask = picture(tmp_path)
    by_path = inpaint(str(store_env["export"]), image, mask, tmp_path / "path.png")
    assert inpaint("models:/tiny/1", image, mask, tmp_path / "v1.png") == by_path
    assert inpaint("models:/tiny@champion", image, mask, tmp_path / "alias.png") == by_path
    assert inpaint(store_env["logged"].model_uri, image, mask, tmp_path / "id.png") == by_path  # models:/m-<id>

    model = mlflow.pyfunc.load_model("models:/tiny/1")
    pixels, hole = np.asarray(Image.open(image).convert("RGB")), np.asarray(Image.open(mask))
    out = model.predict({"image": np.stack([pixels, pixels]), "mask": np.stack([hole, hole // 255])})
    expected = np.asarray(Image.open(tmp_path / "path.png").convert("RGB"))
    assert out.dtype == np.uint8 and out.shape == (2, *pixels.shape)
    assert np.array_equal(out[0], expected) and np.array_equal(out[1], expected)  # 255 or 1: a hole
    raw = model.predict({"image": pixels[None], "mask": hole[None]}, params={"blend": "none"})
    assert not np.array_equal(raw[0], expected)  # the params reach the inpainter


def test_a_cached_pinned_uri_needs_no_mlflow_and_no_download(store_env, tmp_path, monkeypatch):
    from gantool.runtime.model_uri import local_model

    first = Path(str(local_model("models:/tiny/1")))  # downloaded here, or by an earlier test
    stamp = first.stat().st_mtime_ns
    monkeypatch.setitem(sys.modules, "mlflow", None)  # importing MLflow now fails: none is needed
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    assert Path(str(local_model("models:/tiny/1"))) == first and first.stat().st_mtime_ns == stamp
    image, mask = picture(tmp_path)
    assert inpaint("models:/tiny/1", image, mask, tmp_path / "a.png") == inpaint(
        str(store_env["export"]), image, mask, tmp_path / "b.png"
    )
    with pytest.raises(InputError, match=r'pip install "gantool\[mlflow\]"'):  # an alias asks the registry
        local_model("models:/tiny@champion")


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("models:/tiny/9", "Model Version (name=tiny, version=9) not found"),
        ("models:/nobody/1", "nobody"),
        ("models:/tiny@nobody", "nobody"),
        ("models:/tiny/newest", "expected models:/NAME/VERSION"),
    ],
)
def test_a_missing_name_version_or_alias_is_one_line(store_env, tmp_path, uri, fragment):
    image, mask = picture(tmp_path)
    for command in (["inpaint", str(image), "-m", str(mask), "--model", uri], ["info", uri]):
        result = CliRunner().invoke(cli, command)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and len(lines) == 1, result.output
        assert uri in lines[0] and fragment in lines[0] and "Traceback" not in result.output
    leftovers = [p.name for p in store_env["cache"].glob("mlflow/*") if p.name.startswith(".gantool-tmp")]
    assert leftovers == []  # a failed download leaves no staging folder


def test_runs_uri_and_info(store_env, tmp_path):
    client = client_for(store_env["uri"])
    experiment = client.get_experiment_by_name("models").experiment_id
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(store_env["export"]), "export")
    client.set_terminated(run.info.run_id)
    image, mask = picture(tmp_path)
    uri = f"runs:/{run.info.run_id}/export"
    assert inpaint(uri, image, mask, tmp_path / "r.png") == inpaint(
        str(store_env["export"]), image, mask, tmp_path / "p.png"
    )
    info = CliRunner().invoke(cli, ["info", "models:/tiny/1"])
    assert info.exit_code == 0 and "generator.onnx: onnx" in info.output and str(store_env["cache"]) in info.output


def test_the_logged_model_has_a_signature_an_example_and_pinned_requirements(store_env):
    import mlflow

    import gantool

    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri="models:/tiny/1"))
    assert f"gantool=={gantool.__version__}" in (folder / "requirements.txt").read_text().splitlines()
    info = mlflow.models.get_model_info("models:/tiny/1")
    inputs = info.signature.inputs.to_dict()
    assert [(i["name"], i["tensor-spec"]["dtype"], i["tensor-spec"]["shape"]) for i in inputs] == [
        ("image", "uint8", (-1, -1, -1, 3)), ("mask", "uint8", (-1, -1, -1))]  # fmt: skip
    assert {p.name: p.default for p in info.signature.params.params} == {"strategy": "auto", "blend": "poisson"}
    assert (folder / "input_example.json").is_file() and info.flavors["python_function"]["loader_module"]


def test_export_refuses_a_bad_store_before_exporting(tmp_path, exported_model):
    out = tmp_path / "out"
    dead = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["export", str(exported_model.checkpoint), "--onnx", "-o", str(out),
                                      "--mlflow", dead, "--register", "x"])  # fmt: skip
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and dead in lines[0] and "connection refused" in lines[0]
    assert not out.exists()  # nothing exported: the store was checked first


# ------------------------------------------------------------------ slow: the whole path through a server


def wait_for(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"{url} did not answer within {timeout} s")


@pytest.mark.slow  # a server, a tracked run resumed, an export, then mlflow models serve (about a minute)
def test_a_tracked_run_resumed_exported_and_registered_inpaints_the_same_everywhere(tmp_path, monkeypatch):
    from gantool.training.loop import train
    from mlflow_helpers import assert_every_step_once
    from tiny import tiny_train_config

    server = start_mlflow_server(tmp_path / "server")
    serving = None
    try:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("GANTOOL_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        out = tmp_path / "run"
        cfg = tiny_train_config(out=str(out), mlflow=server.url, mlflow_experiment="done", checkpoint_every=3)
        train(cfg, stop_after=5, progress=False)  # interrupted
        train({}, resume=out, progress=False)  # and resumed
        run = run_of(server.url, "done")
        assert run.info.status == "FINISHED"
        assert_every_step_once(server.url, run.info.run_id, out)

        result = CliRunner().invoke(cli, ["export", str(out / "checkpoints" / "last.pt"), "--onnx", "--mlflow",
                                          "--register", "glcic"])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "registered glcic version 1" in result.output and run.info.run_id in result.output
        version = client_for(server.url).get_model_version("glcic", "1")
        model_id = version.model_id or version.source.removeprefix("models:/")  # over REST: in the source
        logged = client_for(server.url).get_logged_model(model_id)
        assert logged.source_run_id == run.info.run_id and logged.experiment_id == run.info.experiment_id

        image, mask = picture(tmp_path)
        by_path = inpaint(str(out / "export"), image, mask, tmp_path / "path.png")
        assert inpaint("models:/glcic/1", image, mask, tmp_path / "uri.png") == by_path
        expected = np.asarray(Image.open(tmp_path / "path.png").convert("RGB"))
        pixels, hole = np.asarray(Image.open(image).convert("RGB")), np.asarray(Image.open(mask))
        import mlflow

        predicted = mlflow.pyfunc.load_model("models:/glcic/1").predict({"image": pixels[None], "mask": hole[None]})
        assert np.array_equal(predicted[0], expected)

        port = free_port()
        serving = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/glcic/1", "--env-manager", "local",
             "-h", "127.0.0.1", "-p", str(port)],
            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(f"http://127.0.0.1:{port}/ping", serving)
        body = json.dumps({"inputs": {"image": pixels[None].tolist(), "mask": hole[None].tolist()}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", body,
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as answer:
            served = np.asarray(json.loads(answer.read())["predictions"], np.uint8)
        assert np.array_equal(served[0], expected)
    finally:
        if serving is not None and serving.poll() is None:
            os.killpg(serving.pid, signal.SIGTERM)
            serving.wait(timeout=60)
        server.stop()

"""The training run: folder layout, checkpoints, exact resume, failure paths, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import gantool.train as train_module
from gantool.checkpoint import generator_from_checkpoint, load_checkpoint
from gantool.cli import cli
from gantool.config import TrainConfig, read_toml
from gantool.errors import InputError, TrainingError
from gantool.train import train
from tiny import TINY_MODEL, tiny_train_config

TINY_ARGS = ["--size", "32", "--local-size", "16", "--width", "4", "--disc-width", "2", "--disc-fc", "8",
             "--batch-size", "4", "--workers", "0", "--quiet"]


def test_run_folder_has_checkpoints_samples_metrics_and_config(tmp_path):
    out = tmp_path / "run"
    result = train(tiny_train_config(out=str(out)), progress=False)
    assert result.step == 8 and result.phase == "joint"
    assert {p.name for p in (out / "checkpoints").iterdir()} == {"last.pt", "step_4.pt", "step_8.pt"}
    assert {p.name for p in (out / "samples").iterdir()} == {"step_4.png", "step_8.png"}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if "images_per_s" in r]
    assert [r["step"] for r in losses] == list(range(1, 9))
    assert [r["phase"] for r in losses] == ["g", "g", "d", "d", "joint", "joint", "joint", "joint"]
    assert all("loss_rec" in r for r in losses if r["phase"] != "d")
    assert all({"loss_d", "loss_adv"} <= set(r) for r in losses if r["phase"] == "joint")
    val = [r for r in records if "val_psnr" in r]
    assert [r["step"] for r in val] == [4, 8]
    assert all(0 < r["val_ssim"] <= 1 and r["val_l1_hole"] >= 0 for r in val)
    saved = TrainConfig.from_dict(read_toml(out / "config.toml"))
    assert saved.steps_joint == 4 and saved.size == 32 and saved.out == str(out)
    from PIL import Image

    with Image.open(out / "samples" / "step_8.png") as grid:
        assert grid.size == (3 * 32, 2 * 32)  # masked | output | real, one row per validation image


def test_checkpoint_is_complete_and_loads_weights_only(tmp_path):
    out = tmp_path / "run"
    train(tiny_train_config(out=str(out)), progress=False)
    raw = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    for key in ("generator", "discriminator", "opt_g", "opt_d", "step", "phase", "rng", "model_config", "train_config"):
        assert key in raw
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    generator = generator_from_checkpoint(state)  # rebuilt from the file alone
    image, mask = torch.rand(1, 3, 32, 40), torch.zeros(1, 1, 32, 40)
    mask[..., 8:20, 8:24] = 1
    with torch.no_grad():
        out_img = generator(image, mask)
    keep = mask.expand_as(image) == 0
    assert torch.equal(out_img[keep], image[keep])
    # step_4 is a separate snapshot: its weights differ from the final ones
    early = load_checkpoint(out / "checkpoints" / "step_4.pt")
    assert early["step"] == 4
    assert not torch.equal(early["generator"]["body.0.0.weight"], state["generator"]["body.0.0.weight"])


def test_resume_is_bitwise_exact(tmp_path):
    cfg = tiny_train_config(steps_g=2, steps_d=2, steps_joint=4, checkpoint_every=100, sample_every=100)
    straight = train(cfg.replace(out=str(tmp_path / "a")), progress=False)
    half = train(cfg.replace(out=str(tmp_path / "b")), stop_after=4, progress=False)
    assert half.step == 4
    resumed = train({}, resume=half.last_checkpoint, progress=False)
    assert resumed.step == 8 and resumed.run_dir == (tmp_path / "b").resolve()
    a = load_checkpoint(straight.last_checkpoint)
    b = load_checkpoint(resumed.last_checkpoint)
    for name in ("generator", "discriminator"):
        for key, tensor in a[name].items():
            assert torch.equal(tensor, b[name][key]), f"{name}.{key} differs after resume"


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_mse = train_module.hole_mse
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        value = real_mse(*args)
        return value * float("nan") if calls["n"] > 5 else value

    monkeypatch.setattr(train_module, "hole_mse", poisoned)
    cfg = tiny_train_config(out=str(out), steps_g=8, steps_d=0, steps_joint=0, checkpoint_every=2, sample_every=100)
    with pytest.raises(TrainingError, match="non-finite loss_rec at step 6"):
        train(cfg, progress=False)
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["step"] == 4
    assert all(torch.isfinite(t).all() for t in state["generator"].values() if t.is_floating_point())


def test_existing_run_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    train(tiny_train_config(out=str(out)), progress=False)
    before = (out / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(InputError, match="already holds a run"):
        train(tiny_train_config(out=str(out)), progress=False)
    assert (out / "checkpoints" / "last.pt").read_bytes() == before


def test_image_folder_training_skips_unreadable_files(tmp_path, caplog):
    from PIL import Image

    data = tmp_path / "data" / "nested"
    data.mkdir(parents=True)
    for i in range(5):
        Image.new("RGB", (48, 40), (40 * i, 100, 200)).save(data / f"img{i}.png")
    (data / "broken.jpg").write_bytes(b"not a jpeg at all")
    result = train(tiny_train_config(data=str(tmp_path / "data"), out=str(tmp_path / "run"), val_images=1),
                   progress=False)
    assert result.step == 8
    assert any("skipped 1 unreadable" in r.message for r in caplog.records)


# ------------------------------------------------------------------------------- the CLI


def run_cli(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def assert_one_line_error(result, fragment: str):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], result.output


def test_cli_trains_with_config_file_and_options_override(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text('steps_g = 1\nsteps_d = 1\nsteps_joint = 1\nsize = 40\nmask = "free"\n')
    out = tmp_path / "run"
    result = run_cli("train", "--config", str(config), "--out", str(out), "--size", "32", *TINY_ARGS[2:])
    assert result.exit_code == 0, result.output
    saved = read_toml(out / "config.toml")
    assert saved["size"] == 32 and saved["mask"] == "free" and saved["steps_joint"] == 1
    assert "done: step 3" in result.output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--data", "/no/such/folder"], "data folder not found"),
        (["--size", "30"], "multiple of 4"),
        (["--size", "16", "--local-size", "16"], "must be larger than --local-size"),
        (["--mask", "box", "--steps-g", "0", "--steps-d", "0", "--steps-joint", "0"], "nothing to train"),
    ],
)
def test_cli_bad_options_fail_in_one_line(tmp_path, args, fragment):
    result = run_cli("train", "--out", str(tmp_path / "run"), *TINY_ARGS, *args)
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "run").exists()


def test_cli_empty_folder_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    result = run_cli("train", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "run"), *TINY_ARGS)
    assert_one_line_error(result, "no readable images")


def test_cli_resume_rejects_files_that_are_not_checkpoints(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    for path, fragment in ((text, "not a readable gantool checkpoint"), (foreign, "not a gantool checkpoint"),
                           (tmp_path / "missing.pt", "checkpoint not found")):
        before = path.read_bytes() if path.exists() else None
        result = run_cli("train", "--resume", str(path), "--quiet")
        assert_one_line_error(result, fragment)
        if before is not None:
            assert path.read_bytes() == before


def test_cli_out_under_a_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run_cli("train", "--out", str(blocker / "run"), *TINY_ARGS, "--steps-g", "1", "--steps-d", "0",
                     "--steps-joint", "0")
    assert_one_line_error(result, "output")
    assert blocker.read_text() == "x"


def test_cli_resume_with_conflicting_model_option_fails(tmp_path):
    out = tmp_path / "run"
    train(tiny_train_config(out=str(out)), progress=False)
    result = run_cli("train", "--resume", str(out / "checkpoints" / "last.pt"), "--width", "8", "--quiet")
    assert_one_line_error(result, "width")


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    toolkit = str(Path(__file__).resolve().parents[1] / "toolkit")
    env["PYTHONPATH"] = toolkit + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gantool", "train", "--out", str(out), *TINY_ARGS, "--steps-g", "100000",
           "--steps-d", "0", "--steps-joint", "0", "--log-every", "1", "--checkpoint-every", "100000"]
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted at step" in stderr and "--resume" in stderr
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["step"] >= 3


def test_console_help_lists_train_options():
    result = run_cli("train", "--help")
    assert result.exit_code == 0
    for option in ("--steps-g", "--steps-d", "--steps-joint", "--resume", "--config", "--mask", "--amp"):
        assert option in result.output


def test_tiny_model_constants_match_config():
    assert tiny_train_config().model_config().size == TINY_MODEL["size"]

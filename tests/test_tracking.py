"""TensorBoard logging, D's outputs in the metrics and D's health warning.

Event files are read back with TensorBoard's own reader (EventAccumulator), as
TensorBoard itself would show them.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # the dev extra has it

from gantool.cli import cli
from gantool.core.errors import InputError
from gantool.nn.networks import crop_local
from gantool.training.loop import _postfix, build_optimizers, train, train_step
from gantool.training.tracking import (
    D_WIN_FAKE,
    D_WIN_MIN_RECORDS,
    D_WIN_REAL,
    D_WIN_SPAN,
    STATUS_FILE,
    TENSORBOARD_DIR,
    TENSORBOARD_INSTALL,
    DiscriminatorHealth,
)
from tiny import TINY_ARGS, no_autocast, tiny_batch, tiny_networks, tiny_train_config

LOSS_TAGS = {"g": {"loss_rec"}, "d": {"loss_d", "d_real", "d_fake"},
             "joint": {"loss_rec", "loss_adv", "loss_d", "d_real", "d_fake"}}
VAL_TAGS = {"val/psnr", "val/psnr_hole", "val/ssim", "val/l1", "val/l1_hole"}
TRAIN_TAGS = {"train/images_per_s", "train/data_wait", "train/lr_g", "train/lr_d"}


def read_events(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def steps_of(events: EventAccumulator, tag: str) -> list[int]:
    return [e.step for e in events.Scalars(tag)]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_event_files_hold_every_scalar_the_grid_and_the_config(tmp_path):
    out = tmp_path / "run"
    train(tiny_train_config(out=str(out), tensorboard=True, lr_d=1e-4), progress=False)  # g 1-2, d 3-4, joint 5-8
    events = read_events(out)
    expected = {f"{phase}/{key}" for phase, keys in LOSS_TAGS.items() for key in keys} | VAL_TAGS | TRAIN_TAGS
    assert set(events.Tags()["scalars"]) == expected
    assert steps_of(events, "g/loss_rec") == [1, 2]
    assert all(steps_of(events, f"d/{key}") == [3, 4] for key in LOSS_TAGS["d"])
    assert all(steps_of(events, f"joint/{key}") == [5, 6, 7, 8] for key in LOSS_TAGS["joint"])
    assert all(steps_of(events, tag) == list(range(1, 9)) for tag in TRAIN_TAGS)
    assert all(steps_of(events, tag) == [4, 8] for tag in VAL_TAGS)
    assert [e.value for e in events.Scalars("train/lr_g")] == pytest.approx([2e-4] * 8)
    assert [e.value for e in events.Scalars("train/lr_d")] == pytest.approx([1e-4] * 8)

    # The same numbers as metrics.jsonl (float32 in the event file).
    records = {(r["step"], "val" if "val_psnr" in r else "train"): r for r in read_metrics(out)}
    for e in events.Scalars("joint/d_fake"):
        assert e.value == pytest.approx(records[(e.step, "train")]["d_fake"], rel=1e-6)
    for e in events.Scalars("val/psnr_hole"):
        assert e.value == pytest.approx(records[(e.step, "val")]["val_psnr_hole"], rel=1e-6)

    # The validation grid is the sample PNG itself.
    from PIL import Image

    images = events.Images("val/samples")
    assert [e.step for e in images] == [4, 8]
    with Image.open(out / "samples" / "step_8.png") as png:
        saved = np.asarray(png.convert("RGB"))
    import io

    with Image.open(io.BytesIO(images[-1].encoded_image_string)) as logged:
        assert np.array_equal(np.asarray(logged.convert("RGB")), saved)

    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "steps_joint = 4" in text and "tensorboard = true" in text


def test_resume_continues_the_curves_without_duplicate_steps(tmp_path):
    out = tmp_path / "run"
    cfg = tiny_train_config(out=str(out), tensorboard=True, checkpoint_every=2, sample_every=2)
    train(cfg, stop_after=6, progress=False)
    # As after a kill -9 at step 6 whose last good checkpoint is step 4 (the step-6 checkpoint never made it):
    # steps 5-6 are trained (and logged) again.
    (out / "checkpoints" / "step_6.pt").unlink()
    shutil.copy(out / "checkpoints" / "step_4.pt", out / "checkpoints" / "last.pt")
    train({}, resume=out / "checkpoints" / "last.pt", progress=False)
    assert len(list((out / TENSORBOARD_DIR).iterdir())) == 2  # one event file per process, in one folder
    events = read_events(out)
    for tag in events.Tags()["scalars"]:
        steps = steps_of(events, tag)
        assert steps == sorted(set(steps)), tag  # no step twice, in order
    assert steps_of(events, "train/images_per_s") == list(range(1, 9))
    assert steps_of(events, "val/psnr") == [2, 4, 6, 8]
    assert [e.step for e in events.Images("val/samples")] == [2, 4, 6, 8]
    # Steps 5 and 6 show the resumed run's values: images/s differs between the two runs.
    last_speed = {r["step"]: r["images_per_s"] for r in read_metrics(out) if "images_per_s" in r}
    shown = {e.step: e.value for e in events.Scalars("train/images_per_s")}
    assert shown[5] == pytest.approx(last_speed[5], rel=1e-6) and shown[6] == pytest.approx(last_speed[6], rel=1e-6)


def test_without_tensorboard_no_event_files(tmp_path):
    out = tmp_path / "run"
    train(tiny_train_config(out=str(out), steps_g=1, steps_d=1, steps_joint=1), progress=False)
    assert not (out / TENSORBOARD_DIR).exists()
    assert json.loads((out / STATUS_FILE).read_text())["state"] == "finished"


@pytest.fixture
def tensorboard_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """As without the extra: importing tensorboard (and torch's wrapper) raises ImportError."""
    for name in ("tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)


def test_missing_extra_fails_before_any_folder_with_the_install_command(tmp_path, tensorboard_missing):
    out = tmp_path / "run"
    with pytest.raises(InputError, match=r'pip install "gantool\[tensorboard\]"'):
        train(tiny_train_config(out=str(out), tensorboard=True), progress=False)
    assert not out.exists()
    result = CliRunner().invoke(cli, ["train", "--out", str(out), *TINY_ARGS, "--tensorboard"])
    assert result.exit_code == 1 and result.exception is not None
    assert TENSORBOARD_INSTALL in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_toml_key_turns_tensorboard_on(tmp_path):
    config = tmp_path / "train.toml"
    config.write_text("tensorboard = true\nsteps_g = 1\nsteps_d = 1\nsteps_joint = 1\nlog_every = 1\n")
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["train", "--config", str(config), "--out", str(out), *TINY_ARGS])
    assert result.exit_code == 0, result.output
    assert steps_of(read_events(out), "train/lr_g") == [1, 2, 3]
    assert "--tensorboard" in CliRunner().invoke(cli, ["train", "--help"]).output


# ------------------------------------------------------------------ D's outputs in the metrics


@pytest.mark.parametrize("phase", ["d", "joint"])
def test_d_real_and_d_fake_are_the_mean_sigmoid_outputs_before_the_d_step(phase):
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    real, mask, corners = batch = tiny_batch(cfg)
    before_g, before_d = copy.deepcopy(nets.generator), copy.deepcopy(nets.discriminator)
    losses = train_step(phase, nets, opt_g, opt_d, batch, cfg, no_autocast())
    with torch.no_grad():
        fake = before_g(real, mask)
        d_real = torch.sigmoid(before_d(crop_local(real, corners, cfg.local_size), real)).mean()
        d_fake = torch.sigmoid(before_d(crop_local(fake, corners, cfg.local_size), fake)).mean()
    assert float(losses["d_real"]) == pytest.approx(float(d_real), rel=1e-5)
    assert float(losses["d_fake"]) == pytest.approx(float(d_fake), rel=1e-5)
    assert "d_real" not in train_step("g", nets, opt_g, opt_d, batch, cfg, no_autocast())


def test_metrics_hold_d_outputs_where_d_runs_and_the_bar_shows_them(tmp_path):
    out = tmp_path / "run"
    result = train(tiny_train_config(out=str(out), steps_g=1, steps_d=1, steps_joint=1), progress=False)
    logged = [r for r in read_metrics(out) if "images_per_s" in r]
    assert [("d_real" in r, "d_fake" in r) for r in logged] == [(False, False), (True, True), (True, True)]
    assert all(0 < r[k] < 1 for r in logged[1:] for k in ("d_real", "d_fake"))
    bar = _postfix(result.history[-2])  # the joint step's record (the last one is validation)
    assert bar.startswith("joint ") and "rec=" in bar and "adv=" in bar and "d=" in bar
    assert f"D(real)={logged[-1]['d_real']:.3f}" in bar and f"D(fake)={logged[-1]['d_fake']:.3f}" in bar


# ------------------------------------------------------------------ D's health


def winning(step: int, phase: str = "joint") -> dict:
    return {"step": step, "phase": phase, "d_real": D_WIN_REAL + 0.04, "d_fake": D_WIN_FAKE - 0.04}


def test_health_warns_once_after_a_sustained_stretch(caplog):
    health = DiscriminatorHealth()
    every = D_WIN_SPAN // 6
    assert D_WIN_SPAN // every + 1 >= D_WIN_MIN_RECORDS  # so the span, not the record count, decides
    steps = range(every, every * 20, every)
    with caplog.at_level(logging.WARNING, logger="gantool.training.tracking"):
        fired = [step for step in steps if health.observe(winning(step))]
    assert fired == [steps[0] + D_WIN_SPAN]
    assert len(caplog.records) == 1 and "wins outright" in caplog.text and f"{D_WIN_REAL:.2f}" in caplog.text


def test_health_needs_an_unbroken_stretch_in_the_joint_phase():
    health = DiscriminatorHealth()
    balanced = {"step": 0, "phase": "joint", "d_real": 0.6, "d_fake": 0.4}
    for step in range(10, 10 * 60, 10):
        record = winning(step) if step % 200 else dict(balanced, step=step)  # a healthy record every 200 steps
        assert not health.observe(record)
    # The discriminator phase (G frozen) may saturate: not a warning.
    assert not any(health.observe(winning(step, "d")) for step in range(1000, 3000, 10))
    # Few records far apart are not "sustained": at least D_WIN_MIN_RECORDS logged steps.
    sparse = DiscriminatorHealth()
    assert not any(sparse.observe(winning(step)) for step in range(0, D_WIN_SPAN * (D_WIN_MIN_RECORDS - 1), D_WIN_SPAN))


# ------------------------------------------------------------------ torchrun: rank 0 only


@pytest.mark.slow  # a torchrun run of two processes
def test_only_rank_zero_writes_event_files(tmp_path, subprocess_env):
    from test_distributed import TINY_ARGS as DDP_ARGS
    from test_distributed import run_to_end

    out = tmp_path / "run"
    run_to_end([*DDP_ARGS, "--out", str(out), "--steps-g", "1", "--steps-d", "1", "--steps-joint", "1",
                "--tensorboard"], tmp_path, subprocess_env)
    files = list((out / TENSORBOARD_DIR).iterdir())
    assert len(files) == 1, files
    rank0_pid = json.loads((out / STATUS_FILE).read_text())["pid"]  # status.json is rank 0's own record
    assert files[0].name.rsplit(".", 2)[1] == str(rank0_pid)  # events.out.tfevents.<time>.<host>.<pid>.<n>
    assert [p for p in tmp_path.rglob("events.out.tfevents.*")] == files
    assert steps_of(read_events(out), "train/images_per_s") == [1, 2, 3]


def test_run_tracker_is_quiet_on_other_ranks(tmp_path):
    from gantool.training.tracking import RunTracker

    cfg = tiny_train_config(tensorboard=True)
    with RunTracker(cfg, tmp_path, 0, "g", enabled=False) as tracker:
        tracker.log_train({"step": 1, "phase": "g", "loss_rec": 0.1, "images_per_s": 1.0}, 1e-4, 1e-4)
        tracker.checkpointed(1)
        tracker.finish(1, "g", interrupted=False)
    assert list(tmp_path.iterdir()) == []


def test_module_import_does_not_import_tensorboard(subprocess_env):
    code = "import sys, gantool.training.loop, gantool.training.runs; print('tensorboard' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"

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

import gantool.training.steps as train_module
from gantool.cli import cli
from gantool.core.config import TrainConfig, read_toml
from gantool.core.errors import InputError, TrainingError
from gantool.training.checkpoint import generator_from_checkpoint, load_checkpoint
from gantool.training.loop import train
from tiny import TINY_ARGS, TINY_MODEL, tiny_train_config


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


def test_multi_scale_crops_of_a_photo_folder_are_recorded_and_resume_bitwise(tmp_path):
    import numpy as np
    from PIL import Image

    data = tmp_path / "photos"
    data.mkdir()
    for i in range(4):
        noise = np.random.default_rng(i).integers(0, 256, (90, 120, 3), dtype=np.uint8)
        Image.fromarray(noise).save(data / f"p{i}.png")
    common = ["--data", str(data), *TINY_ARGS, "--scale-min", "1.5", "--scale-max", "2.5", "--val-images", "1",
              "--steps-g", "2", "--steps-d", "1", "--steps-joint", "1", "--checkpoint-every", "2", "--channel-shuffle"]
    straight = run_cli("train", *common, "--out", str(tmp_path / "a"))
    assert straight.exit_code == 0, straight.output
    recorded = read_toml(tmp_path / "a" / "config.toml")
    assert (recorded["scale_min"], recorded["scale_max"], recorded["channel_shuffle"]) == (1.5, 2.5, True)
    fill = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")["model_config"]["fill"]
    assert fill[0] == fill[1] == fill[2]  # shuffled channels: the mean pixel the network sees is a grey
    half = train(TrainConfig.from_dict({**recorded, "out": str(tmp_path / "b")}), stop_after=2, progress=False)
    resumed = train({}, resume=half.last_checkpoint, progress=False)
    a, b = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt"), load_checkpoint(resumed.last_checkpoint)
    assert resumed.step == 4 and a["step"] == 4
    for key, tensor in a["generator"].items():
        assert torch.equal(tensor, b["generator"][key]), key
    # and the crops are what the run trained on: without the scales the weights differ
    plain = {k: v for k, v in recorded.items() if not k.startswith("scale_")}
    other = train(TrainConfig.from_dict({**plain, "out": str(tmp_path / "c")}), stop_after=2, progress=False)
    first = load_checkpoint(tmp_path / "a" / "checkpoints" / "step_2.pt")["generator"]
    assert any(not torch.equal(t, load_checkpoint(other.last_checkpoint)["generator"][k]) for k, t in first.items())
    # and the shuffled colours too: the same fill without the shuffle trains other weights
    unshuffled = {**recorded, "channel_shuffle": False, "fill": fill, "out": str(tmp_path / "d")}
    other = train(TrainConfig.from_dict(unshuffled), stop_after=2, progress=False)
    assert any(not torch.equal(t, load_checkpoint(other.last_checkpoint)["generator"][k]) for k, t in first.items())


def test_hole_fill_is_recorded_kept_on_resume_and_adopted_by_init_from(tmp_path):
    common = [*TINY_ARGS, "--steps-g", "2", "--steps-d", "1", "--steps-joint", "1", "--checkpoint-every", "2",
              "--val-images", "2"]  # fmt: skip
    result = run_cli("train", *common, "--hole-fill", "push-pull", "--out", str(tmp_path / "a"))
    assert result.exit_code == 0, result.output
    recorded = read_toml(tmp_path / "a" / "config.toml")
    assert recorded["hole_fill"] == "push-pull"
    final = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    assert final["model_config"]["hole_fill"] == "push-pull"
    half = train(TrainConfig.from_dict({**recorded, "out": str(tmp_path / "b")}), stop_after=2, progress=False)
    resumed = load_checkpoint(train({}, resume=half.last_checkpoint, progress=False).last_checkpoint)
    assert resumed["model_config"] == final["model_config"]
    for key, tensor in final["generator"].items():
        assert torch.equal(tensor, resumed["generator"][key]), key
    # the fill is part of the model: the same seed with the mean pixel trains other weights
    other = train(TrainConfig.from_dict({**recorded, "hole_fill": "mean-pixel", "out": str(tmp_path / "c")}),
                  stop_after=2, progress=False)  # fmt: skip
    first = load_checkpoint(tmp_path / "a" / "checkpoints" / "step_2.pt")["generator"]
    assert any(not torch.equal(t, load_checkpoint(other.last_checkpoint)["generator"][k]) for k, t in first.items())
    # --init-from takes the checkpoint's fill, and refuses another one given explicitly
    started = run_cli("train", *common, "--init-from", str(tmp_path / "a"), "--out", str(tmp_path / "d"))
    assert started.exit_code == 0, started.output
    assert load_checkpoint(tmp_path / "d" / "checkpoints" / "last.pt")["model_config"]["hole_fill"] == "push-pull"
    clash = run_cli("train", *common, "--init-from", str(tmp_path / "a"), "--hole-fill", "mean-pixel",
                    "--out", str(tmp_path / "e"))  # fmt: skip
    assert_one_line_error(clash, "hole_fill (checkpoint: push-pull) differ")
    assert_one_line_error(run_cli("train", *common, "--hole-fill", "blur", "--out", str(tmp_path / "f")), "blur")
    assert not (tmp_path / "e").exists() and not (tmp_path / "f").exists()


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


def test_resume_of_a_run_folder_continues_from_its_newest_checkpoint(tmp_path):
    """--resume RUN takes RUN's last.pt, else its highest step_N.pt (last.pt deleted), and both
    continue bitwise; a folder that is no run, or a run without checkpoints, is one line.
    Before: click's "'RUN' is a directory"."""
    cfg = tiny_train_config(steps_g=2, steps_d=2, steps_joint=4, checkpoint_every=2, sample_every=100)
    straight = train(cfg.replace(out=str(tmp_path / "a")), progress=False)
    run = train(cfg.replace(out=str(tmp_path / "b")), stop_after=4, progress=False).run_dir
    result = run_cli("train", "--resume", str(run), "--steps-joint", "6", "--quiet")
    assert result.exit_code == 0, result.output
    (run / "checkpoints" / "last.pt").unlink()  # a deleted last.pt: step_10.pt is the newest
    result = run_cli("train", "--resume", str(run), "--steps-joint", "8", "--quiet")
    assert result.exit_code == 0, result.output
    longer = train({"steps_joint": 8}, resume=straight.last_checkpoint, progress=False)
    a, b = load_checkpoint(longer.last_checkpoint), load_checkpoint(run / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 12
    for key, tensor in a["generator"].items():
        assert torch.equal(tensor, b["generator"][key]), key
    assert_one_line_error(run_cli("train", "--resume", str(tmp_path), "--quiet"), "not a gantool run")
    for name in list((run / "checkpoints").iterdir()):
        name.unlink()
    assert_one_line_error(run_cli("train", "--resume", str(run), "--quiet"), "the run has no checkpoint")


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


# ------------------------------------------------------------------ run folders are owned


def run_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def metric_steps(run: Path) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if "images_per_s" in json.loads(line)]


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    from datetime import datetime

    from gantool.training.runfolder import RUN_FILE, RunPlan, claim_run_folder

    monkeypatch.chdir(tmp_path)
    now = datetime(2026, 1, 2, 3, 4, 5)
    first = claim_run_folder(RunPlan(None, True), now=now)
    second = claim_run_folder(RunPlan(None, True), now=now)
    assert first.name == "20260102-030405" and second.name == "20260102-030405-2"
    assert (first / RUN_FILE).is_file() and (second / RUN_FILE).is_file()


def test_two_claims_of_one_out_folder_racing_past_the_check_let_only_one_win(tmp_path, monkeypatch):
    """Both processes saw an empty --out (the race); the run file's O_EXCL decides."""
    import gantool.training.runfolder as runfolder
    from gantool.core.errors import InputError

    monkeypatch.setattr(runfolder, "_check_new_folder", lambda folder: None)  # both passed the check
    out = tmp_path / "shared"
    runfolder.claim_run_folder(runfolder.RunPlan(out, True))
    with pytest.raises(InputError, match="another process claimed it"):
        runfolder.claim_run_folder(runfolder.RunPlan(out, True))


def test_two_default_runs_at_once_never_share_a_folder(tmp_path, monkeypatch):
    """Two whole training runs without --out, the clock frozen to one second."""
    from datetime import datetime

    import gantool.training.runfolder as runs_module

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(runs_module, "datetime", FrozenClock)
    monkeypatch.chdir(tmp_path)
    cfg = tiny_train_config(steps_g=2, steps_d=0, steps_joint=0, checkpoint_every=2, sample_every=2)
    a, b = train(cfg, progress=False), train(cfg, progress=False)
    assert a.run_dir != b.run_dir and a.run_dir.parent == b.run_dir.parent == (tmp_path / "runs").resolve()
    for run in (a.run_dir, b.run_dir):
        assert metric_steps(run) == [1, 2]
        assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 2


def test_a_folder_that_is_not_a_run_is_never_written_into(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.toml").write_text("my own settings\n")
    with pytest.raises(InputError, match="not a gantool run folder"):
        train(tiny_train_config(out=str(folder)), progress=False)
    assert run_files(folder) == {"config.toml": b"my own settings\n"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert train(tiny_train_config(out=str(empty), steps_g=1, steps_d=0, steps_joint=0), progress=False).step == 1


def test_resume_into_another_run_is_refused(tmp_path):
    cfg = tiny_train_config(steps_g=2, steps_d=0, steps_joint=2, checkpoint_every=2, sample_every=100)
    a = train(cfg.replace(out=str(tmp_path / "a")), progress=False)
    b = train(cfg.replace(out=str(tmp_path / "b")), progress=False)
    before = run_files(b.run_dir)
    result = run_cli("train", "--resume", str(a.last_checkpoint), "--out", str(b.run_dir), "--steps-joint", "4",
                     "--quiet")
    assert_one_line_error(result, "already holds a run")
    assert run_files(b.run_dir) == before


def test_resume_from_an_older_checkpoint_refuses_or_branches_with_out(tmp_path):
    cfg = tiny_train_config(steps_g=2, steps_d=2, steps_joint=4, checkpoint_every=4, sample_every=100)
    run = train(cfg.replace(out=str(tmp_path / "a")), progress=False).run_dir
    before = run_files(run)
    older = run / "checkpoints" / "step_4.pt"
    result = run_cli("train", "--resume", str(older), "--quiet")
    assert_one_line_error(result, "newer state (step 8)")
    assert "--out" in result.output
    branch = train({"out": str(tmp_path / "branch"), "steps_joint": 6}, resume=older, progress=False)
    assert branch.step == 10 and branch.run_dir == (tmp_path / "branch").resolve()
    assert run_files(run) == before  # the original run is untouched
    from gantool.training.runfolder import read_run_file

    assert read_run_file(branch.run_dir)["parent"] == {"checkpoint": str(older.resolve()), "step": 4}
    assert metric_steps(branch.run_dir) == list(range(5, 11))


def test_resume_of_a_checkpoint_outside_a_run_never_writes_beside_it(tmp_path, monkeypatch):
    run = train(tiny_train_config(out=str(tmp_path / "a"), steps_g=2, steps_d=0, steps_joint=0, checkpoint_every=2),
                progress=False)
    folder = tmp_path / "some" / "folder"
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(run.last_checkpoint.read_bytes())
    (folder / "config.toml").write_text("a user's file\n")
    before = run_files(tmp_path / "some")
    monkeypatch.chdir(tmp_path)
    resumed = train({"steps_g": 4}, resume=folder / "model.pt", progress=False)
    assert resumed.step == 4 and resumed.run_dir.parent == (tmp_path / "runs").resolve()
    assert run_files(tmp_path / "some") == before


def test_kill_9_then_resume_logs_every_step_once(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "gantool", "train", "--out", str(out), *TINY_ARGS, "--steps-g", "100000",
           "--steps-d", "0", "--steps-joint", "0", "--log-every", "1", "--checkpoint-every", "3",
           "--sample-every", "100000", "--no-keep-checkpoints"]
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_lines(proc, out / "metrics.jsonl", 5)
    proc.kill()  # SIGKILL: no handler runs
    proc.communicate(timeout=60)
    logged = metric_steps(out)
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["step"] % 3 == 0 and state["step"] >= 3
    resumed = train({"steps_g": max(logged) + 2}, resume=out / "checkpoints" / "last.pt", progress=False)
    steps = metric_steps(out)
    assert steps == list(range(1, resumed.step + 1)), steps


def wait_for_lines(proc, path: Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (not path.exists() or len(path.read_text().splitlines()) < count):
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.2)


def test_sigterm_saves_a_checkpoint_and_exits_143_and_sigusr1_checkpoints_and_continues(tmp_path):
    out = tmp_path / "run"
    last = out / "checkpoints" / "last.pt"
    cmd = [sys.executable, "-m", "gantool", "train", "--out", str(out), *TINY_ARGS, "--steps-g", "100000",
           "--steps-d", "0", "--steps-joint", "0", "--log-every", "1", "--checkpoint-every", "100000"]
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_lines(proc, out / "metrics.jsonl", 3)
    assert not last.exists()
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not last.exists():
        assert proc.poll() is None
        time.sleep(0.1)
    first = load_checkpoint(last)["step"]
    lines = len((out / "metrics.jsonl").read_text().splitlines())
    wait_for_lines(proc, out / "metrics.jsonl", lines + 2)  # it kept training
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert "SIGTERM" in stderr and "--resume" in stderr
    assert load_checkpoint(last)["step"] > first >= 3


def test_full_disk_during_a_checkpoint_ends_the_run_in_one_line(tmp_path, monkeypatch):
    import errno

    out = tmp_path / "run"
    real_save = torch.save
    calls = {"n": 0}

    def save_or_fail(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1:
            f.write(b"partial bytes")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_or_fail)
    result = run_cli("train", "--out", str(out), *TINY_ARGS, "--steps-g", "8", "--steps-d", "0", "--steps-joint", "0",
                     "--checkpoint-every", "4", "--sample-every", "100")
    assert_one_line_error(result, "No space left on device")
    assert "last.pt" in result.output
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(out / "checkpoints" / "last.pt")["step"] == 4
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".gantool-tmp-")]


def test_a_file_that_is_not_a_checkpoint_keeps_its_cause(tmp_path):
    import numpy as np

    foreign = tmp_path / "numpy.pt"
    torch.save({"format": "gantool-checkpoint", "weights": np.zeros(3)}, foreign)
    with pytest.raises(Exception, match="Unsupported global: GLOBAL numpy") as info:
        load_checkpoint(foreign)
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)
    with pytest.raises(Exception, match=r"not a gantool checkpoint \(keys: weights\)"):
        torch.save({"weights": torch.zeros(3)}, foreign)
        load_checkpoint(foreign)


def test_resume_drops_metrics_lines_past_the_checkpoint(tmp_path):
    """What a kill -9 after step 6 of a run checkpointed at step 4 leaves: lines 5, 6 and a torn one."""
    cfg = tiny_train_config(out=str(tmp_path / "run"), steps_g=8, steps_d=0, steps_joint=0, checkpoint_every=4,
                            sample_every=100)
    half = train(cfg, stop_after=4, progress=False)
    with (half.run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 5, "phase": "g", "loss_rec": 1.0, "images_per_s": 1.0}) + "\n")
        f.write(json.dumps({"step": 6, "phase": "g", "loss_rec": 1.0, "images_per_s": 1.0}) + "\n")
        f.write('{"step": 7, "pha')
    train({}, resume=half.last_checkpoint, progress=False)
    assert metric_steps(half.run_dir) == list(range(1, 9))


def test_a_run_in_use_is_not_resumed_twice_and_a_dead_holders_lock_is_taken_over(tmp_path):
    import socket

    from gantool.training.runfolder import LOCK_FILE

    cfg = tiny_train_config(out=str(tmp_path / "run"), steps_g=4, steps_d=0, steps_joint=0, checkpoint_every=2,
                            sample_every=100)
    half = train(cfg, stop_after=2, progress=False)
    lock = half.run_dir / LOCK_FILE
    assert not lock.exists()  # released when the run ended
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(f"{socket.gethostname()} {sleeper.pid}\n")  # a live training process holds the run
        before = run_files(half.run_dir)
        with pytest.raises(InputError, match="in use by another training process"):
            train({}, resume=half.last_checkpoint, progress=False)
        assert run_files(half.run_dir) == before
    finally:
        sleeper.kill()
        sleeper.wait()
    # The holder is gone (as after kill -9): its lock is stale and the resume goes on.
    assert train({}, resume=half.last_checkpoint, progress=False).step == 4
    assert not lock.exists()

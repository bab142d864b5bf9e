"""``gantool runs``: a folder mixing finished, stopped, failed, killed and broken runs; summaries; plots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import gantool.training.steps as train_module
from gantool.cli import cli
from gantool.core.errors import InputError, TrainingError
from gantool.training.loop import train
from gantool.training.runs import PLOT_GROUPS, find_runs, plot_run, read_metrics, runs_table, summarize_run
from gantool.training.tracking import STATUS_FILE, TENSORBOARD_INSTALL
from tiny import TINY_ARGS, tiny_train_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def poisoned_mse(after: int, action):
    """hole_mse that calls ``action(value)`` from its ``after``-th call on."""
    real_mse = train_module.hole_mse
    calls = {"n": 0}

    def wrapped(*args):
        calls["n"] += 1
        value = real_mse(*args)
        return action(value) if calls["n"] > after else value

    return wrapped


def sigint_once(value):
    if not getattr(sigint_once, "sent", False):
        sigint_once.sent = True  # type: ignore[attr-defined]
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: the loop's handler stops it at the step's end
    return value


def kill_9_while_training(out: Path, env: dict[str, str]) -> None:
    """A real ``gantool train`` process, SIGKILLed once it has logged a few steps past a checkpoint."""
    cmd = [sys.executable, "-m", "gantool", "train", "--out", str(out), *TINY_ARGS, "--steps-g", "100000",
           "--steps-d", "0", "--steps-joint", "0", "--log-every", "1", "--checkpoint-every", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "checkpoints" / "step_2.pt").exists() and metrics.exists() and \
                    len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("runs")
    cfg = tiny_train_config(checkpoint_every=2, sample_every=2)  # 8 steps: g 1-2, d 3-4, joint 5-8
    train(cfg.replace(out=str(root / "finished")), progress=False)
    train(cfg.replace(out=str(root / "early")), stop_after=4, progress=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_module, "hole_mse", poisoned_mse(2, sigint_once))
        signalled = train(cfg.replace(out=str(root / "signalled")), progress=False)
    assert signalled.interrupted
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_module, "hole_mse", poisoned_mse(2, lambda v: v * float("nan")))
        with pytest.raises(TrainingError, match="non-finite"):
            train(cfg.replace(out=str(root / "nonfinite")), progress=False)
    kill_9_while_training(root / "killed", subprocess_env)
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.toml").write_text("steps_g = [\n")
    (broken / "metrics.jsonl").write_text('{"step": 1, "phase": "g", "loss_rec": 0.1, "images_per_s": 3}\n')
    old = root / "old"  # an older gantool's run: no status.json
    train(cfg.replace(out=str(old)), stop_after=6, progress=False)
    (old / STATUS_FILE).unlink()
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("not a run\n")
    return SimpleNamespace(root=root, signalled_step=signalled.step)


def test_listing_tells_every_kind_of_run_apart(runs_root):
    infos = {info.name: info for info in find_runs(runs_root.root)}
    assert set(infos) == {"finished", "early", "signalled", "nonfinite", "killed", "broken", "old"}  # not notes/
    labels = {name: info.label for name, info in infos.items()}
    assert labels == {"finished": "finished", "early": "stopped (early stop)", "signalled": "stopped (signal)",
                      "nonfinite": "failed (non-finite)", "killed": "killed", "broken": "broken",
                      "old": "incomplete"}
    assert (infos["finished"].step, infos["finished"].total_steps, infos["finished"].phase) == (8, 8, "joint")
    assert (infos["early"].step, infos["early"].phase, infos["early"].checkpoint_step) == (4, "d", 4)
    assert infos["signalled"].step == runs_root.signalled_step < 8
    assert infos["nonfinite"].step == 4 and "non-finite loss_rec at step 5" in infos["nonfinite"].message
    assert infos["nonfinite"].checkpoint_step == 4
    assert infos["killed"].step >= 3 and infos["killed"].total_steps == 100000
    assert infos["killed"].checkpoint_step is not None and infos["killed"].checkpoint_step % 2 == 0
    assert "is gone" in infos["killed"].message
    assert "not valid TOML" in infos["broken"].message
    assert (infos["old"].step, infos["old"].checkpoint_step) == (6, 6)  # from the files alone
    assert infos["finished"].val_psnr is not None and infos["finished"].val_psnr > 0
    assert infos["finished"].checkpoint == runs_root.root / "finished" / "checkpoints" / "last.pt"

    table = runs_table(list(infos.values())).splitlines()
    assert table[0].split() == ["run", "status", "step", "phase", "val", "PSNR", "checkpoint"]
    row = next(line for line in table if line.startswith("finished "))
    assert row.split()[1:5] == ["finished", "8/8", "joint", f"{infos['finished'].val_psnr:.2f}"]
    assert row.endswith("checkpoints/last.pt (step 8)")


def test_cli_lists_a_folder_and_summarises_one_run(runs_root):
    runner = CliRunner()
    listing = runner.invoke(cli, ["runs", str(runs_root.root)])
    assert listing.exit_code == 0, listing.output
    assert len(listing.output.splitlines()) == 1 + 7 and "notes" not in listing.output
    summary = runner.invoke(cli, ["runs", str(runs_root.root / "nonfinite")])
    assert summary.exit_code == 0, summary.output
    assert "failed (non-finite)" in summary.output and "non-finite loss_rec at step 5" in summary.output
    assert "checkpoints/last.pt (step 4)" in summary.output
    finished = runner.invoke(cli, ["runs", str(runs_root.root / "finished")]).output
    assert "8/8 (joint phase)" in finished and "validation:  step 8: PSNR" in finished
    broken = runner.invoke(cli, ["runs", str(runs_root.root / "broken")])
    assert broken.exit_code == 0 and "broken" in broken.output and "Traceback" not in broken.output


@pytest.mark.parametrize("where", ["notes", "missing", "notes/todo.txt"])
def test_a_non_run_path_is_one_line(runs_root, where):
    result = CliRunner().invoke(cli, ["runs", str(runs_root.root / where)])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert str(runs_root.root / where) in result.output


def test_default_folder_is_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "runs does not exist" in CliRunner().invoke(cli, ["runs"]).output
    train(tiny_train_config(out=str(tmp_path / "runs" / "a"), steps_g=1, steps_d=0, steps_joint=0), progress=False)
    result = CliRunner().invoke(cli, ["runs"])
    assert result.exit_code == 0 and result.output.splitlines()[1].split()[:3] == ["a", "finished", "1/1"]


def test_plot_has_one_axis_per_group_and_is_a_png(runs_root, tmp_path):
    pytest.importorskip("matplotlib", reason='pip install "gantool[tensorboard]"')
    from PIL import Image

    out = tmp_path / "curves.png"
    fig = plot_run(summarize_run(runs_root.root / "finished"), out)
    assert len(fig.axes) == len(PLOT_GROUPS) == 3
    assert [ax.get_title(loc="left") for ax in fig.axes] == list(PLOT_GROUPS)
    labels = [{line.get_label() for line in ax.lines if not line.get_label().startswith("_")} for ax in fig.axes]
    assert labels == [{"loss_rec", "loss_d", "loss_adv"}, {"d_real", "d_fake"}, {"val_psnr", "val_psnr_hole"}]
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(out) as png:
        png.verify()
    with Image.open(out) as png:
        assert png.size == (800, 750)


def test_cli_plot_refuses_to_overwrite_and_needs_one_run(runs_root, tmp_path):
    pytest.importorskip("matplotlib", reason='pip install "gantool[tensorboard]"')
    out = tmp_path / "early.png"
    runner = CliRunner()
    first = runner.invoke(cli, ["runs", str(runs_root.root / "early"), "--plot", str(out)])
    assert first.exit_code == 0, first.output
    assert out.read_bytes()[:8] == PNG_SIGNATURE and f"plot:        {out}" in first.output
    out.write_bytes(b"the user's file")
    again = runner.invoke(cli, ["runs", str(runs_root.root / "early"), "--plot", str(out)])
    assert again.exit_code == 1 and "--overwrite" in again.output and "status:" not in again.output
    assert out.read_bytes() == b"the user's file"
    assert runner.invoke(cli, ["runs", str(runs_root.root / "early"), "--plot", str(out), "--overwrite"]).exit_code == 0
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    folder = runner.invoke(cli, ["runs", str(runs_root.root), "--plot", str(tmp_path / "all.png")])
    assert folder.exit_code == 1 and "not a run folder" in folder.output


def test_plot_without_matplotlib_names_the_extra(runs_root, monkeypatch, tmp_path):
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(InputError, match=TENSORBOARD_INSTALL.replace("[", r"\[").replace("]", r"\]")):
        plot_run(summarize_run(runs_root.root / "finished"), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_read_metrics_skips_torn_lines_and_keeps_the_newest_timeline(tmp_path):
    def line(step: int, value: float, **extra) -> str:
        return json.dumps({"step": step, "phase": "g", "loss_rec": value, "images_per_s": 1.0, **extra}) + "\n"

    path = tmp_path / "metrics.jsonl"
    # steps 1-6 and a validation at 6, killed mid-write; resumed from step 4's checkpoint, now at step 5.
    text = "".join(line(s, 1.0) for s in range(1, 7)) + json.dumps({"step": 6, "phase": "g", "val_psnr": 20.0})
    text += "\n" + '{"step": 7, "phase": "g", "loss_r' + "\n" + line(5, 2.0)
    path.write_text(text)
    train, validation, skipped = read_metrics(path)
    assert [(r["step"], r["loss_rec"]) for r in train] == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 2.0)]
    assert validation == [] and skipped == 1


def test_help_lists_the_runs_options():
    result = CliRunner().invoke(cli, ["runs", "--help"])
    assert result.exit_code == 0
    assert "--plot" in result.output and "--overwrite" in result.output and "PATH" in result.output
    assert "runs" in CliRunner().invoke(cli, ["--help"]).output

"""Paths, as a property of the CLI: every command's every path option, given relative to another
working directory, in three layouts: plain names, a component with a space and non-ASCII
characters, and a symlinked folder. Whatever a command records for later (the run's data path,
the resume checkpoint) is absolute and normalised, and a later command from yet another directory
finds it. (AOTInductor's relative, spaced output is the slow tier's case in test_export_filesystems.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from gantool.cli import cli
from gantool.core.config import read_toml
from glcic_oracle import make_model_cn, write_glcic_files
from tiny import TINY_MODEL_ARGS

LAYOUTS = ["plain", "space and non-ASCII", "symlinked folder"]


def _images(folder: Path, count: int, size: int = 40) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(count)
    for i in range(count):
        Image.fromarray((rng.random((size, size + 8, 3)) * 255).astype(np.uint8)).save(folder / f"p{i}.png")


def _ok(*args: object) -> str:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, f"gantool {' '.join(map(str, args))}\n{result.output}"
    return result.output


@pytest.fixture(params=LAYOUTS)
def tree(request, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """(the project folder as the commands will name it, relative to the cwd; the real folder).

    The working directory is ``tmp_path/elsewhere/deeper``; the project is reached through ``..``."""
    if request.param == "symlinked folder" and not hasattr(os, "symlink"):
        pytest.skip("needs symlinks")
    name = {"plain": "proj", "space and non-ASCII": "prö jekt ü"}.get(request.param, "real")
    real = tmp_path / name
    real.mkdir()
    if request.param == "symlinked folder":
        (tmp_path / "linked").symlink_to(real, target_is_directory=True)
        name = "linked"
    cwd = tmp_path / "elsewhere" / "deeper"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    _images(real / "data", 3)
    mask = np.zeros((40, 48), np.uint8)
    mask[10:20, 12:26] = 255
    (real / "masks").mkdir()
    for i in range(3):
        Image.fromarray(mask).save(real / "masks" / f"p{i}.png")
    (real / "train.toml").write_text('workers = 0\nval_images = 1\nsteps_d = 0\n', encoding="utf-8")
    return Path("..") / ".." / name, real


def test_every_path_option_works_relative_to_another_directory(tree: tuple[Path, Path]) -> None:
    p, real = tree
    tiny = [*TINY_MODEL_ARGS, "--batch-size", "2", "--quiet"]
    # train: --data, --out, --config; then --resume (a run folder) and --init-from (a checkpoint)
    _ok("train", "--data", p / "data", "--out", p / "runs" / "a", "--config", p / "train.toml", *tiny,
        "--steps-g", "1", "--steps-joint", "0")  # fmt: skip
    config = read_toml(real / "runs" / "a" / "config.toml")
    assert config["data"] == str((real / "data").resolve()), config["data"]  # absolute, normalised
    _ok("train", "--resume", p / "runs" / "a", "--steps-joint", "1", "--quiet")
    state = torch.load(real / "runs" / "a" / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 2 and state["data"]["path"] == str((real / "data").resolve())
    _ok("train", "--init-from", p / "runs" / "a" / "checkpoints" / "last.pt", "--data", p / "data",
        "--out", p / "runs" / "b", "--config", p / "train.toml", "--batch-size", "2", "--steps-g", "1",
        "--steps-joint", "0", "--quiet")  # fmt: skip
    # data pack: SOURCE, -o; data check: DATA (shards, a list); train --data: a shard pattern, a list file
    _ok("data", "pack", p / "data", "-o", p / "shards", "--quiet")
    assert "ok" in _ok("data", "check", p / "shards", "--quiet")
    (real / "list.txt").write_text("data/p0.png\ndata/p2.png\n", encoding="utf-8")
    _ok("data", "check", p / "list.txt", "--quiet")
    for data, run in ((p / "shards" / "train-{000000..000000}.tar", "s"), (p / "list.txt", "l")):
        _ok("train", "--data", data, "--out", p / "runs" / run, "--config", p / "train.toml", *tiny, "--steps-g", "1",
            "--steps-joint", "0")  # fmt: skip
    recorded = read_toml(real / "runs" / "s" / "config.toml")["data"]
    assert recorded == str((real / "shards").resolve() / "train-{000000..000000}.tar"), recorded
    assert read_toml(real / "runs" / "l" / "config.toml")["data"] == str((real / "list.txt").resolve())
    # runs: a folder of runs and one run, --plot
    listing = _ok("runs", p / "runs")
    assert "a" in listing and "b" in listing
    _ok("runs", p / "runs" / "a", "--plot", p / "plot.png")
    assert (real / "plot.png").stat().st_size > 0
    # export: CHECKPOINT, -o, --calib; every fast format
    _ok("export", p / "runs" / "a" / "checkpoints" / "last.pt", "-o", p / "ex", "--onnx", "--pt2",
        "--torchscript", "--fp16", "--int8", "--calib", p / "data", "--int8-min-psnr", "1")  # fmt: skip
    names = sorted(f.name for f in (real / "ex").iterdir())
    for expected in ("generator.onnx", "generator_fp16.onnx", "generator_int8.onnx", "generator.pt2",
                     "generator.torchscript.pt", "generator.safetensors", "export_report.json"):  # fmt: skip
        assert expected in names, names
    report = (real / "ex" / "export_report.json").read_text(encoding="utf-8")
    assert str(real) not in report and str(Path.cwd()) not in report  # nothing of this machine's paths
    _ok("export", p / "runs" / "a")  # a run folder: its checkpoint, into <run>/export
    assert (real / "runs" / "a" / "export" / "generator.onnx").is_file()
    # info: a file and a folder
    assert "onnx" in _ok("info", p / "ex" / "generator.onnx")
    _ok("info", p / "ex")
    # inpaint: an image, --mask, --model, -o; then folders for all three
    for backend in ("onnx", "pt2", "torchscript", "eager"):
        out = p / f"out_{backend}.png"
        _ok("inpaint", p / "data" / "p0.png", "--mask", p / "masks" / "p0.png", "--model", p / "ex",
            "--backend", backend, "--provider", "cpu", "-o", out)  # fmt: skip
        assert (real / f"out_{backend}.png").is_file()
    _ok("inpaint", p / "data", "--mask", p / "masks", "--model", p / "ex" / "generator.onnx", "-o", p / "filled",
        "--provider", "cpu")  # fmt: skip
    assert (real / "filled" / "p0.inpainted.png").is_file()
    # eval: MODEL, --data, --grid
    _ok("eval", p / "ex", "--data", p / "data", "--size", "32", "--local-size", "16", "--count", "2",
        "--grid", p / "grid.png", "--provider", "cpu")  # fmt: skip
    assert (real / "grid.png").is_file()
    # bench inpaint: MODEL
    _ok("bench", "inpaint", p / "ex", "--sizes", "32", "--batch", "1", "--backends", "onnx", "--providers", "cpu",
        "--repeats", "1", "--warmup", "0", "--e2e-images", "0", "--no-crop-check", "--blend", "none")  # fmt: skip
    # import: MODEL_CN, CONFIG_JSON, --discriminator's absence, -o
    model_cn, config_json = write_glcic_files(real / "glcic", make_model_cn(8, seed=0), [0.5, 0.5, 0.5], 64, 32)
    _ok("import", "glcic-pytorch", p / "glcic" / model_cn.name, p / "glcic" / config_json.name, "-o", p / "imported")
    assert (real / "imported" / "checkpoint.pt").is_file()


@pytest.mark.parametrize("tree", ["space and non-ASCII"], indirect=True)  # one layout: a server start is seconds
def test_serve_opens_a_relative_model_from_another_directory(tree: tuple[Path, Path], subprocess_env) -> None:
    from serve_helpers import get_json, serve_process, wait_ready

    p, real = tree
    _ok("train", "--data", "synthetic", "--out", p / "run", *TINY_MODEL_ARGS, "--batch-size", "2", "--steps-g", "1",
        "--steps-d", "0", "--steps-joint", "0", "--workers", "0", "--val-images", "1", "--quiet")  # fmt: skip
    _ok("export", p / "run", "--onnx")
    with serve_process(["--model", str(p / "run" / "export"), "--provider", "cpu"], subprocess_env, Path.cwd()) as (
        url,
        lines,
        _,
    ):
        wait_ready(url)
        status, info = get_json(url + "/v1/model")
    assert status == 200 and json.dumps(info)
    assert any("generator.onnx" in line for line in lines), lines

"""examples/train_default_gpu.sh, exercised on the CPU (its TRAIN_GPU_DEVICE=cpu dry run).

The GPU run itself cannot happen here; these tests check what a lent GPU machine's one call
relies on: the budget's SIGINT ends training with a consistent checkpoint, the checkpoint comes
back in parts that reassemble to the recorded sha256, and it resumes on another machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO_ROOT
from gantool.training.loop import train

SCRIPT = REPO_ROOT / "examples" / "train_default_gpu.sh"
PART_LIMIT = 15_000_000  # the device tool brings back files of up to 16 MiB

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")


def photos(folder: Path, count: int = 4) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray((rng.random((72, 88, 3)) * 255).astype(np.uint8)).save(folder / f"p{i}.png")
    return folder


def run_script(tmp_path: Path, subprocess_env: dict[str, str], *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(subprocess_env, TRAIN_GPU_PYTHON=sys.executable, TRAIN_GPU_OUT=str(tmp_path / "out"), **env)
    full_env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=full_env, capture_output=True, text=True,
                          timeout=300)


def test_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("env, message", [
    ({"TRAIN_GPU_DEVICE": "tpu"}, "TRAIN_GPU_DEVICE must be cuda or cpu"),
    ({"TRAIN_GPU_DEVICE": "cpu", "TRAIN_GPU_BUDGET_S": "soon"}, "TRAIN_GPU_BUDGET_S must be a number"),
])
def test_bad_settings_are_one_line_errors(tmp_path, subprocess_env, env, message):
    result = run_script(tmp_path, subprocess_env, str(photos(tmp_path / "data")), **env)
    assert result.returncode == 2 and result.stderr.strip() == result.stderr.strip().splitlines()[0]
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_data_folder_says_how_to_make_it(tmp_path, subprocess_env):
    result = run_script(tmp_path, subprocess_env, "nowhere", TRAIN_GPU_DEVICE="cpu")
    assert result.returncode == 2 and "make_default_data.py" in result.stderr


@pytest.mark.slow  # a real training run until its 20 s budget, then a resume (~35 s)
def test_the_budget_ends_with_a_checkpoint_in_parts_that_resumes(tmp_path, subprocess_env):
    data = photos(tmp_path / "data")
    result = run_script(tmp_path, subprocess_env, str(data), TRAIN_GPU_DEVICE="cpu", TRAIN_GPU_BUDGET_S="20",
                        TRAIN_GPU_ARGS="--size 32 --local-size 16 --width 4 --disc-width 4 --disc-fc 8 --batch-size 8 "
                                       "--workers 1 --checkpoint-every 100000 --sample-every 100000 --val-images 1")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    summary = json.loads((out / "train_gpu.json").read_text())
    assert summary["train_exit_code"] == 124 and summary["phase"] == "g" and summary["step"] > 0  # the SIGINT's
    parts = sorted(out.glob("last.pt.part*"))
    assert parts and all(p.stat().st_size <= PART_LIMIT for p in parts)
    checkpoint = tmp_path / "last.pt"
    checkpoint.write_bytes(b"".join(p.read_bytes() for p in parts))
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == summary["checkpoint_sha256"]
    state = torch.load(checkpoint, weights_only=True)
    assert state["step"] == summary["step"]
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back
    assert (out / "metrics.jsonl").read_text().count("\n") >= 1
    # Another machine continues it: the config's schedule, this data folder, one more step.
    more = {"steps_g": state["step"] + 1, "steps_d": 0, "steps_joint": 0}
    resumed = train({"data": str(data), **more, "out": str(tmp_path / "continued")},
                    resume=checkpoint, progress=False, allow_data_change=True)
    assert resumed.step == state["step"] + 1

"""examples/gpu_check.sh, exercised on the CPU (its GPU_CHECK_DEVICE=cpu dry run).

The GPU stages themselves cannot run here; these tests check the script's
machinery: every stage recorded with its exit status, a failing stage not
stopping the others, the time budget enforced with `timeout`, and the JSON
summary written where $OUT says.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "examples" / "gpu_check.sh"
STAGES = ["install", "env", "pytest_cuda", "train_bf16", "export", "ort_cuda", "formats", "bench_train",
          "bench_inpaint", "bench_ray"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")


def run_check(tmp_path: Path, subprocess_env: dict[str, str], **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    out.mkdir()
    full_env = dict(subprocess_env, OUT=str(out), GPU_CHECK_DEVICE="cpu", GPU_CHECK_WORK=str(tmp_path / "work"), **env)
    result = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=full_env, capture_output=True, text=True,
                            timeout=600)
    summary = json.loads((out / "gpu_check.json").read_text())
    assert (out / "gpu_check.log").exists()
    return result, summary


def statuses(summary: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in summary["stages"]}


def fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


@pytest.mark.slow  # a real tiny training run, exports and benchmarks on the CPU (~40 s)
def test_dry_run_on_the_cpu_passes_every_stage_it_can_run(tmp_path, subprocess_env):
    # pytest_cuda is left out here only because it would run pytest inside pytest (~40 s more).
    result, summary = run_check(tmp_path, subprocess_env, GPU_CHECK_PYTHON=sys.executable,
                                GPU_CHECK_SKIP="pytest_cuda")
    assert result.returncode == 0, result.stderr[-3000:]
    assert statuses(summary) == {"install": "skip", "env": "pass", "pytest_cuda": "skip", "train_bf16": "pass",
                                 "export": "pass", "ort_cuda": "skip", "formats": "skip", "bench_train": "pass",
                                 "bench_inpaint": "pass", "bench_ray": "skip"}
    assert summary["ok"] and summary["dry_run"] and summary["device"] == "cpu"
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["ort_cuda"]["reason"] == stages["formats"]["reason"] == "dry run on the CPU"
    assert stages["bench_ray"]["reason"] == "dry run on the CPU"
    assert stages["env"]["result"]["cuda_available"] is False
    train = stages["train_bf16"]["result"]
    assert train["finite"] and train["steps"] == 5
    assert all(math.isfinite(v) for k, v in train["last"].items() if k.startswith("loss_"))
    assert stages["bench_train"]["result"]["device"] == "cpu"
    assert stages["bench_inpaint"]["result"]
    assert all(s["exit_code"] in (0, 77) and s["seconds"] <= s["limit_s"] + 10 for s in summary["stages"])


def test_a_broken_interpreter_fails_every_stage_but_all_are_recorded(tmp_path, subprocess_env):
    broken = fake_python(tmp_path, "echo 'this python is broken' >&2; exit 3")
    result, summary = run_check(tmp_path, subprocess_env, GPU_CHECK_PYTHON=broken)
    assert result.returncode == 1
    assert [s["name"] for s in summary["stages"]] == STAGES
    got = statuses(summary)
    assert [name for name, status in got.items() if status == "fail"] == [
        "env", "pytest_cuda", "train_bf16", "bench_train"]
    # the stages that depend on an earlier one's output skip, naming it
    assert got["export"] == "skip" and "train_bf16 did not finish" in summary["stages"][4]["reason"]
    assert summary["stages"][1]["reason"] == "this python is broken"
    assert summary["counts"]["fail"] == 4 and not summary["ok"]


@pytest.mark.slow  # developer tooling (not gantool itself), and it waits out a 7 s budget
def test_the_budget_stops_a_hung_stage_and_skips_the_rest(tmp_path, subprocess_env):
    hung = fake_python(tmp_path, "exec sleep 120")
    result, summary = run_check(tmp_path, subprocess_env, GPU_CHECK_PYTHON=hung, GPU_CHECK_BUDGET_S="7")
    assert result.returncode == 1
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["env"]["status"] == "timeout" and stages["env"]["exit_code"] in (124, 137)
    assert stages["env"]["limit_s"] <= 7
    after = [stages[name] for name in STAGES[2:]]
    assert all(s["status"] == "skip" and s["reason"].startswith("budget spent") for s in after)


def test_summary_goes_to_the_working_folder_without_out(tmp_path, subprocess_env):
    env = {k: v for k, v in subprocess_env.items() if k != "OUT"}
    env.update(GPU_CHECK_DEVICE="cpu", GPU_CHECK_BUDGET_S="0", GPU_CHECK_PYTHON=sys.executable,
               GPU_CHECK_WORK=str(tmp_path / "work"))
    result = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result.returncode == 0  # everything skipped: nothing failed
    assert [s["status"] for s in summary["stages"]] == ["skip"] * len(STAGES)


@pytest.mark.parametrize("env, message", [
    ({"GPU_CHECK_DEVICE": "tpu"}, "GPU_CHECK_DEVICE must be cuda or cpu"),
    ({"GPU_CHECK_BUDGET_S": "soon"}, "GPU_CHECK_BUDGET_S must be a number"),
])
def test_bad_settings_are_one_line_errors(tmp_path, subprocess_env, env, message):
    result = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=dict(subprocess_env, **env),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == result.stderr.strip().splitlines()[0] and message in result.stderr
    assert not (tmp_path / "gpu_check.json").exists()

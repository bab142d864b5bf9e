"""`gantool bench train`: runs, reports medians and the ratio (no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from gantool.cli import cli
from gantool.core.config import TrainConfig
from gantool.training.loop import amp_supported


def test_bench_train_json_reports_both_loops_and_their_ratio():
    result = CliRunner().invoke(cli, ["bench", "train", "--size", "32", "--local-size", "16", "--batch-size", "2",
                                      "--width", "4", "--steps", "2", "--device", "cpu", "--no-amp", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    names = [row["name"] for row in report["rows"]]
    assert names[0] == "gantool" and names[1].startswith("reference")
    for row in report["rows"]:
        assert row["median_s_per_iter"] > 0 and row["min_s"] <= row["median_s_per_iter"] <= row["max_s"]
        assert abs(row["images_per_s"] - 2 / row["median_s_per_iter"]) < 1e-9
    # the two loops alternate step by step; the speed-up is the median of the paired steps' ratios
    gantool, reference = (row["times_s"] for row in report["rows"])
    assert len(gantool) == len(reference) == 2
    ratios = sorted(r / g for r, g in zip(reference, gantool))
    paired = report["speedup_paired"]
    assert paired["rounds"] == 2 and paired["min"] == ratios[0] and paired["max"] == ratios[1]
    assert report["speedup_vs_reference"] == pytest.approx(sum(ratios) / 2)


def test_bench_train_table_and_bad_size():
    runner = CliRunner()
    ok = runner.invoke(cli, ["bench", "train", "--size", "32", "--local-size", "16", "--batch-size", "1",
                             "--width", "4", "--steps", "1", "--no-reference", "--device", "cpu"])
    assert ok.exit_code == 0 and "| gantool |" in ok.output and "speed-up" not in ok.output
    bad = runner.invoke(cli, ["bench", "train", "--size", "30", "--device", "cpu"])
    assert bad.exit_code != 0 and "multiple of 4" in bad.output and "Traceback" not in bad.output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--steps", "0"], "--steps must be an integer in 1..1000000"),
        (["--steps", "-3"], "--steps"),
        (["--size", "0"], "size = 0"),
        (["--size", "-32"], "size = -32"),
        (["--size", "34"], "multiple of 4"),
        (["--size", "32", "--local-size", "32"], "must be larger than --local-size"),
        (["--size", "32", "--local-size", "0"], "local_size = 0"),
        (["--batch-size", "0"], "batch_size = 0"),
        (["--width", "-1"], "width = -1"),
        (["--width", "10000000000"], "width = 10000000000"),
        (["--device", "gpu"], "device = 'gpu'"),
    ],
)
def test_bench_train_degenerate_options_are_one_line(args, fragment):
    result = CliRunner().invoke(cli, ["bench", "train", *args], catch_exceptions=False)
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code != 0 and len(lines) == 1 and fragment in lines[0], result.output


def test_bench_train_times_the_default_training_setup_on_the_cpu():
    result = CliRunner().invoke(cli, ["bench", "train", "--size", "32", "--local-size", "16", "--batch-size", "1",
                                      "--width", "4", "--steps", "1", "--no-reference", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)["rows"][0]
    # gantool train on the CPU: --amp auto, bf16 autocast + channels_last only where bf16 is native
    native = amp_supported(torch.device("cpu"))
    assert row["amp_bf16"] is native and row["channels_last"] is native
    help_text = CliRunner().invoke(cli, ["bench", "train", "--help"], terminal_width=200).output
    assert f"[default: {TrainConfig.size}]" in help_text and f"[default: {TrainConfig.local_size}]" in help_text

"""`gantool bench train`: runs, reports medians and the ratio (no timing assertions)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gantool.cli import cli


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
    ratio = report["rows"][1]["median_s_per_iter"] / report["rows"][0]["median_s_per_iter"]
    assert abs(report["speedup_vs_reference"] - ratio) < 1e-12


def test_bench_train_table_and_bad_size():
    runner = CliRunner()
    ok = runner.invoke(cli, ["bench", "train", "--size", "32", "--local-size", "16", "--batch-size", "1",
                             "--width", "4", "--steps", "1", "--no-reference", "--device", "cpu"])
    assert ok.exit_code == 0 and "| gantool |" in ok.output and "speed-up" not in ok.output
    bad = runner.invoke(cli, ["bench", "train", "--size", "30", "--device", "cpu"])
    assert bad.exit_code != 0 and "multiple of 4" in bad.output and "Traceback" not in bad.output

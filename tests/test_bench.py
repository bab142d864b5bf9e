"""gantool bench inpaint on a tiny model: the JSON schema, FLOP counting, the
in-memory TorchScript fallback, the memory probe and the goal measurements.
Nothing here asserts a speed: timings are only checked to be positive."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gantool.cli import cli
from gantool.core.config import ModelConfig
from gantool.core.errors import InputError
from gantool.runtime.backends import load_backend
from gantool.tools.bench_inpaint import (
    bench_inpaint,
    count_generator_flops,
    fastest_passing,
    open_inpaint_backend,
    parse_path,
    speed_goals,
)
from gantool.tools.bench_pipeline import _TimedBackend, bench_crop, bench_end_to_end
from gantool.tools.interleave import PeakMemory
from inpaint_helpers import GPU_ONLY, exported_model  # noqa: F401 (fixture)

ROW_KEYS = {
    "backend", "precision", "provider", "size", "batch", "note", "median_ms_per_batch", "median_ms_per_image",
    "min_ms_per_batch", "max_ms_per_batch", "images_per_s", "gflop_per_image", "achieved_gflop_per_s",
    "peak_rss_mb", "peak_rss_exact", "peak_cuda_mb", "runs", "psnr_hole_vs_fp32", "passes_gate", "times_ms",
    "fraction_of_peak",
}


def test_flops_scale_with_pixels_and_batch():
    config = ModelConfig(width=4, disc_width=2, disc_fc=8, size=32, local_size=16)
    base = count_generator_flops(config, 32, 1)
    assert base > 0
    assert count_generator_flops(config, 64, 1) == 4 * base  # fully convolutional
    assert count_generator_flops(config, 32, 3) == 3 * base
    # The first conv alone (5x5, 4 -> width channels, 2 FLOPs per multiply-add) is a lower bound.
    assert base > 2 * 5 * 5 * 4 * config.width * 32 * 32


def test_bench_inpaint_json_schema(exported_model):
    result = bench_inpaint(exported_model.folder, sizes=[32], batches=[1, 2], providers=["cpu"], repeats=1,
                           warmup=0, e2e_images=2, e2e_size=32, crop_check=False,
                           backends=["eager", "torchscript", "onnx"])
    json.dumps(result)  # serialisable as is
    assert result["benchmark"] == "inpaint"
    rows = result["rows"]
    assert [(r["backend"], r["batch"]) for r in rows] == [
        ("eager", 1), ("eager", 2), ("torchscript", 1), ("torchscript", 2), ("onnx", 1), ("onnx", 2)]
    for row in rows:
        assert set(row) == ROW_KEYS, row
        assert row["median_ms_per_image"] > 0 and row["images_per_s"] > 0 and row["achieved_gflop_per_s"] > 0
        assert row["median_ms_per_image"] == pytest.approx(row["median_ms_per_batch"] / row["batch"])
        assert row["peak_rss_mb"] is not None and row["peak_rss_mb"] >= 0
        assert row["min_ms_per_batch"] <= row["median_ms_per_batch"] <= row["max_ms_per_batch"]
        assert row["precision"] == "fp32" and row["passes_gate"] and row["psnr_hole_vs_fp32"] > 40
    assert rows[0]["psnr_hole_vs_fp32"] == float("inf")  # eager fp32 is the reference itself
    assert {r["provider"] for r in rows if r["backend"] == "onnx"} == {"CPUExecutionProvider"}
    # FLOPs per image do not depend on the batch.
    assert rows[0]["gflop_per_image"] == pytest.approx(rows[1]["gflop_per_image"])
    e2e = result["goals"]["end_to_end_outside_model"]
    assert e2e["failed"] == 0 and e2e["run_calls"] >= 1
    assert 0 <= e2e["outside_model_fraction"] <= 1 and e2e["met"] == (e2e["outside_model_fraction"] <= 0.15)
    assert "crop_2048_vs_256" not in result["goals"]
    # the post-processing's cost, beside the model's, at 512 px with a 128 px hole
    assert [r["strategy"] for r in result["blend_rows"]] == ["full", "auto"]
    for row in result["blend_rows"]:
        assert row["blend"] == "poisson" and row["model_ms"] > 0 and row["blend_ms"] > 0
        assert row["blend_vs_model"] == pytest.approx(row["blend_ms"] / row["model_ms"])
    assert result["blend_rows"][0]["windows"] == [[512, 512]] and len(result["blend_rows"][1]["windows"]) == 1
    goal = result["goals"]["blend_vs_model_512"]
    assert goal["strategy"] == "full" and goal["met"] == (goal["blend_vs_model"] <= 0.15)
    assert e2e["blend"] == "poisson"


def test_precision_paths_get_a_hole_psnr_and_a_gate(exported_model):
    result = bench_inpaint(exported_model.folder, sizes=[32], batches=[1], providers=["cpu"], repeats=2, warmup=0,
                           e2e_images=0, crop_check=False, backends=["onnx", "onnx:fp16", "eager:bf16", "pt2"])
    rows = {(r["backend"], r["precision"]): r for r in result["rows"]}
    fp16 = rows[("onnx", "fp16")]
    assert fp16["passes_gate"] and fp16["psnr_hole_vs_fp32"] >= 40  # inf: the same uint8 pixels
    assert "generator.pt2" in rows[("pt2", "fp32")]["error"]  # this folder has no pt2 export: an error row
    bf16 = rows[("eager", "bf16")]
    assert "error" in bf16 or (bf16["psnr_hole_vs_fp32"] >= 35 and bf16["passes_gate"])
    best = result["fastest_passing"]["cpu 32px batch 1"]
    passing = [r for r in result["rows"] if "error" not in r and r["passes_gate"]]
    assert best["median_ms_per_image"] == min(r["median_ms_per_image"] for r in passing)
    with pytest.raises(InputError, match="unknown path"):
        parse_path("onnx:bf16")
    assert parse_path("pt2:bf16") == ("pt2", "bf16") and parse_path("aoti") == ("aoti", "fp32")


def test_fastest_passing_skips_rows_that_fail_their_gate():
    def row(backend, precision, ms, passes, provider="cpu"):  # the same load in every round
        return {"backend": backend, "precision": precision, "provider": provider, "size": 512, "batch": 1,
                "median_ms_per_image": ms, "passes_gate": passes, "psnr_hole_vs_fp32": 40.0,
                "times_ms": [ms * 0.9, ms, ms * 1.5]}

    ort_cpu = "CPUExecutionProvider"
    rows = [row("onnx", "int8", 100.0, False, ort_cpu), row("eager", "bf16", 300.0, True),
            row("onnx", "fp32", 200.0, True, ort_cpu), row("onnx", "fp32", 50.0, True, "CUDAExecutionProvider"),
            {"backend": "aoti", "error": "x"}]
    best = fastest_passing(rows)
    assert best["cpu 512px batch 1"]["path"] == "onnx" and best["cpu 512px batch 1"]["median_ms_per_image"] == 200.0
    assert best["cuda 512px batch 1"]["provider"] == "CUDAExecutionProvider"
    rows = [*rows, row("eager", "fp32", 400.0, True), row("onnx", "int8", 150.0, True, ort_cpu)]
    goals = speed_goals(rows)
    # ORT fp32 against eager fp32, even though an int8 ONNX row follows the fp32 one
    assert goals["ort_cpu_vs_eager_512_b1"]["speedup"] == pytest.approx(400.0 / 200.0)
    bf16 = goals["fastest_vs_torch_bf16_512_b1"]
    assert bf16["fastest"] == "onnx:int8" and bf16["speedup"] == pytest.approx(300.0 / 150.0) and bf16["met"]
    assert speed_goals([r for r in rows if r.get("precision") != "bf16"]).keys() == {"ort_cpu_vs_eager_512_b1"}


def test_torchscript_is_traced_in_memory_when_the_folder_has_none(exported_model, tmp_path: Path):
    folder = tmp_path / "shipped"
    folder.mkdir()
    for name in ("generator.onnx", "generator.safetensors"):  # what models/ ships
        shutil.copy(exported_model.folder / name, folder / name)
    traced, note = open_inpaint_backend(folder, "torchscript", "cpu")
    assert "traced in memory" in note
    eager = load_backend(folder, "cpu", "eager")
    rng = np.random.default_rng(0)
    image = rng.random((2, 3, 32, 48), dtype=np.float32)
    mask = np.zeros((2, 1, 32, 48), np.float32)
    mask[..., 8:20, 10:30] = 1
    np.testing.assert_allclose(traced.run(image, mask), eager.run(image, mask), atol=1e-5)
    with pytest.raises(Exception, match="no model"):
        open_inpaint_backend(tmp_path, "onnx", "cpu")


def test_peak_memory_sees_native_allocations():
    with PeakMemory() as memory:
        block = torch.ones(64 * 2**20 // 4)  # 64 MB allocated by torch, invisible to tracemalloc
        block += 1
        del block
    assert memory.peak_mb is not None
    if memory.exact:
        assert memory.peak_mb >= 50


def test_timed_backend_sums_run_time_and_delegates(exported_model):
    backend = _TimedBackend(load_backend(exported_model.onnx, "cpu", "onnx"))
    image, mask = np.zeros((1, 3, 32, 32), np.float32), np.zeros((1, 1, 32, 32), np.float32)
    backend.run(image, mask)
    backend.run(image, mask)
    assert backend.calls == 2 and backend.run_seconds > 0
    assert backend.size_multiple == 4 and backend.provider == "CPUExecutionProvider"


def test_end_to_end_and_crop_measurements(exported_model):
    e2e = bench_end_to_end(exported_model.onnx, images=3, size=48, provider="cpu", strategy="full", batch_size=2)
    assert e2e["failed"] == 0 and e2e["run_calls"] == 2  # batches of 2: 2 + 1
    assert 0 < e2e["model_run_s"] <= e2e["wall_s"]
    crop = bench_crop(exported_model.onnx, "cpu", large=256, small=64, hole=16, repeats=1)
    assert crop["ratio"] == pytest.approx(crop["large_crop_s"] / crop["small_full_s"])


def test_bad_options_raise_input_errors(exported_model):
    with pytest.raises(InputError, match="unknown backend"):
        bench_inpaint(exported_model.folder, backends=["tensorflow"])
    with pytest.raises(InputError, match="unknown path"):
        bench_inpaint(exported_model.folder, backends=["aoti:int8"])
    with pytest.raises(InputError):
        bench_inpaint(exported_model.folder, sizes=[], batches=[1])


def test_unavailable_provider_becomes_an_error_row(exported_model):
    rows = bench_inpaint(exported_model.folder, sizes=[32], batches=[1], backends=["eager"], providers=["tensorrt"],
                         repeats=1, warmup=0, e2e_images=0, crop_check=False, blend_check=False)["rows"]
    assert len(rows) == 1 and "tensorrt" in rows[0]["error"]


def test_cli_json_and_errors(exported_model, tmp_path: Path):
    runner = CliRunner()
    args = ["bench", "inpaint", str(exported_model.folder), "--sizes", "32", "--batch", "1", "--backends", "onnx",
            "--providers", "cpu", "--repeats", "1", "--warmup", "0", "--e2e-images", "0", "--no-crop-check"]
    result = runner.invoke(cli, [*args, "--blend", "none", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data["rows"]) == 1 and set(data["rows"][0]) == ROW_KEYS
    assert "blend_rows" not in data and "blend_vs_model_512" not in data["goals"]  # --blend none: nothing to time
    result = runner.invoke(cli, args)
    assert result.exit_code == 0 and "| onnx | fp32 | CPUExecutionProvider | 32 | 1 |" in result.output
    assert "fastest path passing its gate (cpu 32px batch 1): onnx on CPUExecutionProvider" in result.output
    assert "| poisson | full | 512 | 128 | 512x512 |" in result.output
    assert "goal poisson blending <= 15% on top of the model at 512 px" in result.output
    result = runner.invoke(cli, ["bench", "inpaint", str(exported_model.folder), "--sizes", "a,b"])
    assert result.exit_code == 2 and "comma-separated integers" in result.output
    result = runner.invoke(cli, ["bench", "inpaint", str(tmp_path / "missing"), "--e2e-images", "0"])
    assert result.exit_code == 1 and "not found" in result.output and "Traceback" not in result.output


def test_console_entry_runs_bench_inpaint(exported_model, subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-m", "gantool", "bench", "inpaint", str(exported_model.onnx), "--sizes", "32", "--batch", "1",
         "--backends", "onnx", "--providers", "cpu", "--repeats", "1", "--e2e-images", "0", "--no-crop-check",
         "--no-blend-check", "--json"],
        capture_output=True, text=True, env=subprocess_env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"][0]["backend"] == "onnx"


@GPU_ONLY
def test_cuda_rows_on_a_gpu_machine(exported_model):
    rows = bench_inpaint(exported_model.folder, sizes=[32], batches=[1], backends=["onnx"], providers=["cuda"],
                         repeats=1, warmup=1, e2e_images=0, crop_check=False, blend_check=False)["rows"]
    assert rows[0].get("provider") == "CUDAExecutionProvider", rows[0]


def _strict(text: str):
    """json.loads that rejects Infinity and NaN, as strict parsers (JSON.parse, jq, serde) do."""

    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json(exported_model):
    # Before the fix: eager against the eager reference has an infinite hole PSNR, printed as Infinity.
    args = ["bench", "inpaint", str(exported_model.folder), "--sizes", "32", "--batch", "1", "--backends", "eager",
            "--providers", "cpu", "--repeats", "1", "--warmup", "0", "--e2e-images", "0", "--no-crop-check",
            "--no-blend-check", "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    row = _strict(result.output)["rows"][0]
    assert row["psnr_hole_vs_fp32"] is None and row["passes_gate"] is True  # identical: infinite PSNR


def test_option_faults_are_one_line_and_only_error_rows_exit_1(exported_model):
    base = ["bench", "inpaint", str(exported_model.folder), "--batch", "1", "--backends", "onnx", "--repeats", "1",
            "--warmup", "0", "--no-crop-check", "--no-blend-check"]  # fmt: skip
    # Before the fix: ValueError: cannot write empty image (a traceback).
    result = CliRunner().invoke(cli, [*base, "--sizes", "32", "--providers", "cpu", "--e2e-size", "0"])
    assert result.exit_code == 1 and "--e2e-size must be at least 4 px" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    # Before the fix: exit 0 with a table of error rows only.
    result = CliRunner().invoke(cli, [*base, "--sizes", "32", "--providers", "gpu", "--e2e-images", "0"])
    assert result.exit_code == 1 and "gpu" in result.output.splitlines()[-1]
    result = CliRunner().invoke(cli, [*base, "--sizes", "30", "--providers", "cpu", "--e2e-images", "0"])
    assert result.exit_code == 1 and "size must be a multiple of 4" in result.output
    assert result.output.strip().splitlines()[-1] == "Error: no row could be measured: every one failed (see its error)"
    result = CliRunner().invoke(cli, [*base, "--sizes", "30", "--providers", "cpu", "--e2e-images", "0", "--json"])
    assert result.exit_code == 1 and _strict(result.output.split("\nError:")[0])["measured_rows"] == 0


# ------------------------------------------------------------- rows interleaved, ratios from paired rounds


def test_interleaved_runs_one_call_of_each_row_per_round_alternating_the_order():
    from gantool.tools.interleave import interleaved

    calls: list[str] = []
    steps = [lambda: calls.append("A"), lambda: calls.append("B"), lambda: calls.append("C")]
    times = interleaved(steps, rounds=3, warmup=1)
    assert calls == ["A", "B", "C", "A", "B", "C", "C", "B", "A", "A", "B", "C"]  # warm-up, then A B C / C B A / ...
    assert [len(t) for t in times] == [3, 3, 3] and all(v >= 0 for t in times for v in t)


def test_paired_ratio_cancels_load_that_hits_one_round():
    from gantool.tools.interleave import paired_ratio, spread_text

    # B is 2x faster in every round; a neighbour slowed round 3 for A and rounds 2-3 for B.
    slow, fast = [100.0, 100.0, 300.0], [50.0, 150.0, 150.0]
    assert statistics.median(slow) / statistics.median(fast) == pytest.approx(2 / 3)  # medians mislead
    ratio = paired_ratio(slow, fast)
    assert ratio["median"] == pytest.approx(2.0) and ratio["min"] == pytest.approx(2 / 3) and ratio["max"] == 2.0
    assert ratio["rounds"] == 3 and spread_text(ratio) == "2.00x (0.67-2.00 over 3 paired rounds)"
    assert paired_ratio([], [])["median"] is None and spread_text(paired_ratio([], [])) == "n/a"


def test_speed_goals_take_the_median_of_paired_rounds():
    def row(backend, precision, times, provider="cpu"):
        return {"backend": backend, "precision": precision, "provider": provider, "size": 512, "batch": 1,
                "median_ms_per_image": statistics.median(times), "passes_gate": True, "psnr_hole_vs_fp32": 40.0,
                "times_ms": times}

    rows = [row("eager", "bf16", [600.0, 600.0, 1800.0]), row("openvino", "int8", [300.0, 900.0, 300.0]),
            row("onnx", "fp32", [1200.0, 1200.0, 3600.0], "CPUExecutionProvider")]
    goals = speed_goals(rows, default_path="openvino:int8")
    fastest = goals["fastest_vs_torch_bf16_512_b1"]
    assert fastest["fastest"] == "openvino:int8" and fastest["speedup"] == pytest.approx(2.0) and fastest["met"]
    assert fastest["spread"]["min"] == pytest.approx(600 / 900)
    default = goals["default_vs_ort_fp32_512_b1"]
    assert default["default"] == "openvino:int8" and default["speedup"] == pytest.approx(4.0) and default["met"]


def test_cpu_peak_from_cpuinfo_text():
    from gantool.tools.interleave import cpu_peak

    zen4 = "vendor_id\t: AuthenticAMD\ncpu MHz\t\t: 3500.000\nflags\t\t: fma avx2 avx512f avx512_bf16 avx512_vnni\n"
    peak = cpu_peak(zen4, cores=2)
    # Zen 4: 512-bit work on 256-bit halves: 32 fp32 FLOP/cycle, bf16 2x, int8 (VNNI) 4x.
    assert peak["gops"] == pytest.approx({"fp32": 2 * 3.5 * 32, "bf16": 2 * 3.5 * 64, "int8": 2 * 3.5 * 128})
    intel = "vendor_id\t: GenuineIntel\ncpu MHz\t\t: 2000.000\nflags\t\t: fma avx2 avx512f amx_bf16 amx_int8\n"
    assert cpu_peak(intel, cores=4)["gops"] == pytest.approx({"fp32": 4 * 2 * 64, "bf16": 4 * 2 * 1024,
                                                              "int8": 4 * 2 * 2048})
    avx2 = "vendor_id\t: AuthenticAMD\ncpu MHz\t\t: 2000.000\nflags\t\t: fma avx2\n"
    assert cpu_peak(avx2, cores=2)["gops"]["bf16"] is None  # no native bf16: no peak claimed
    assert cpu_peak("", cores=2)["gops"] == {"fp32": None, "bf16": None, "int8": None}
    assert "estimated" in peak["how"]


def test_bench_inpaint_times_openvino_rows_beside_onnx_runtime(exported_model):
    from gantool.runtime.openvino import openvino_available

    if not openvino_available():
        pytest.skip("openvino is not installed")
    result = bench_inpaint(exported_model.folder, sizes=[32], batches=[1], providers=["cpu"], repeats=3, warmup=0,
                           e2e_images=0, crop_check=False, blend_check=False,
                           backends=["onnx", "openvino", "openvino:int8"])
    rows = {(r["backend"], r["precision"]): r for r in result["rows"]}
    ov = rows[("openvino", "fp32")]
    assert ov["provider"] == "CPU" and ov["passes_gate"] and len(ov["times_ms"]) == 3
    assert ov["median_ms_per_batch"] == pytest.approx(statistics.median(ov["times_ms"]))
    peak = result["cpu_peak"]["gops"]["fp32"]
    if peak:
        assert ov["fraction_of_peak"] == pytest.approx(ov["achieved_gflop_per_s"] / peak)
    assert "generator_int8.onnx" in rows[("openvino", "int8")]["error"]  # no int8 export in this folder
    from gantool.core.constants import AUTO_OPENVINO_PRECISIONS

    # what `gantool inpaint` runs with default options: an fp32 model on ONNX Runtime (OpenVINO only at int8, bf16)
    assert result["default_path"] == ("openvino" if "fp32" in AUTO_OPENVINO_PRECISIONS else "onnx")

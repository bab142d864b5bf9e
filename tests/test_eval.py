"""gantool eval: metrics on known images, the classical baselines, seeded holes,
the comparison grid, and the command's failure paths."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from gantool.cli import cli
from gantool.core.errors import InputError
from gantool.tools.evaluate import (
    METRICS,
    comparison_grid,
    evaluate,
    image_metrics,
    mean_fill,
    opencv_inpaint,
    seeded_mask,
    square_resize,
)
from inpaint_helpers import exported_model, textured_rgb  # noqa: F401 (fixture)

cv2 = pytest.importorskip("cv2", reason="the eval extra (opencv-python-headless) is not installed")


def smooth_image(size: int = 32, seed: int = 0) -> np.ndarray:
    """Float H x W x 3 in [0.2, 0.8]: room for a +0.1 offset without clipping."""
    return 0.2 + 0.6 * textured_rgb(size, size, seed).astype(np.float32) / 255.0


def box(size: int, top: int, left: int, side: int) -> np.ndarray:
    mask = np.zeros((size, size), np.float32)
    mask[top : top + side, left : left + side] = 1.0
    return mask


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "truth"
    folder.mkdir()
    for i, (h, w) in enumerate([(40, 56), (48, 48), (60, 36)]):
        Image.fromarray(textured_rgb(h, w, seed=i)).save(folder / f"img{i}.png")
    return folder


# ------------------------------------------------------------------------------ metrics


def test_identical_images_give_infinite_psnr_ssim_one_and_zero_l1():
    image = smooth_image()
    m = image_metrics(image, image, box(32, 8, 8, 12))
    assert math.isinf(m["psnr"]) and m["psnr"] > 0
    assert math.isinf(m["psnr_hole"]) and m["psnr_hole"] > 0
    assert m["ssim"] == pytest.approx(1.0, abs=1e-6)
    assert m["ssim_hole"] == pytest.approx(1.0, abs=1e-6)
    assert m["l1"] == 0.0 and m["l1_hole"] == 0.0


def test_a_constant_offset_of_0_1_gives_20_db_and_l1_0_1():
    truth = smooth_image()
    m = image_metrics(truth + 0.1, truth, box(32, 4, 4, 10))
    # MSE = 0.01 everywhere: PSNR = 10 log10(1 / 0.01) = 20 dB, in the hole and overall.
    assert m["psnr"] == pytest.approx(20.0, abs=1e-3)
    assert m["psnr_hole"] == pytest.approx(20.0, abs=1e-3)
    assert m["l1"] == pytest.approx(0.1, abs=1e-5)
    assert m["l1_hole"] == pytest.approx(0.1, abs=1e-5)
    assert m["ssim"] < 1.0


def test_an_error_only_in_the_hole_dilutes_over_the_whole_image():
    truth = smooth_image()
    mask = box(32, 8, 8, 16)  # a quarter of the image
    prediction = np.where(mask[..., None] > 0.5, truth + 0.1, truth)
    m = image_metrics(prediction, truth, mask)
    assert m["psnr_hole"] == pytest.approx(20.0, abs=1e-3)
    assert m["psnr"] == pytest.approx(20.0 + 10 * math.log10(4), abs=1e-3)
    assert m["l1"] == pytest.approx(0.025, abs=1e-5)


# ----------------------------------------------------------------------------- methods


def test_mean_fill_fills_the_hole_with_the_known_mean_and_keeps_the_rest():
    truth = smooth_image()
    mask = box(32, 10, 12, 8)
    out = mean_fill(truth, mask)
    hole = mask > 0.5
    np.testing.assert_array_equal(out[~hole], truth[~hole])
    np.testing.assert_allclose(out[hole], np.broadcast_to(truth[~hole].mean(axis=0), out[hole].shape), atol=1e-6)


@pytest.mark.parametrize("method", ["telea", "ns"])
def test_opencv_methods_change_only_the_hole_and_fill_flat_colour(method: str):
    truth = (np.rint(smooth_image() * 255) / 255).astype(np.float32)  # 8-bit values
    mask = box(32, 10, 12, 8)
    out = opencv_inpaint(truth, mask, method)
    hole = mask > 0.5
    np.testing.assert_array_equal(out[~hole], truth[~hole])
    assert not np.array_equal(out[hole], truth[hole])
    flat = np.full((32, 32, 3), 100 / 255, np.float32)
    # Telea's weighting can land a couple of grey levels off.
    np.testing.assert_allclose(opencv_inpaint(flat, mask, method), flat, atol=3 / 255)


def test_missing_opencv_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, image_folder: Path):
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 now raises ImportError
    with pytest.raises(InputError, match="pip install opencv-python-headless"):
        opencv_inpaint(smooth_image(), box(32, 4, 4, 8), "telea")
    result = CliRunner().invoke(cli, ["eval", "--data", str(image_folder), "--size", "32", "--no-grid"])
    assert result.exit_code == 1
    assert "pip install opencv-python-headless" in result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------------ data and masks


def test_seeded_masks_repeat_per_seed_and_index_and_differ_otherwise():
    a = seeded_mask("box", 0, 3, 64, 32)
    np.testing.assert_array_equal(a, seeded_mask("box", 0, 3, 64, 32))
    assert not np.array_equal(a, seeded_mask("box", 1, 3, 64, 32))
    assert not np.array_equal(a, seeded_mask("box", 0, 4, 64, 32))
    free = seeded_mask("free", 0, 0, 64, 32)
    assert set(np.unique(free)) <= {0.0, 1.0} and free.sum() > 0
    with pytest.raises(InputError):
        seeded_mask("blob", 0, 0, 64, 32)


def test_square_resize_centre_crops_and_quantizes():
    image = np.zeros((20, 40, 3), np.float32)
    image[:, 10:30] = 1.0  # the centre square is all white
    out = square_resize(image, 16)
    assert out.shape == (16, 16, 3)
    np.testing.assert_allclose(out, 1.0)
    np.testing.assert_array_equal(out * 255, np.rint(out * 255))


def test_comparison_grid_layout():
    rows = [{name: np.full((8, 8, 3), v, np.float32) for v, name in enumerate(["a", "b", "c"])}] * 2
    grid = comparison_grid(rows, ["a", "b", "c"])
    assert grid.shape == (8 * 2 + 2, 8 * 3 + 2 * 2, 3) and grid.dtype == np.uint8
    assert (grid[:8, :8] == 0).all() and (grid[:8, 10:18] == 255).all()


# --------------------------------------------------------------------------- evaluate


def test_evaluate_scores_every_method_and_known_pixels_stay_exact(exported_model, image_folder: Path, tmp_path: Path):
    grid = tmp_path / "grid.png"
    result = evaluate(exported_model.onnx, image_folder, masks="box", size=32, seed=5, grid=grid)
    assert result.methods == ["mean", "telea", "ns", "gantool", "gantool_poisson"]  # raw and blended
    assert result.settings["blend"] == "poisson"
    assert result.images == ["img0.png", "img1.png", "img2.png"]
    assert result.settings["provider"] == "CPUExecutionProvider"
    for method in result.methods:
        for metric in METRICS:
            values = result.per_image[method][metric]
            assert len(values) == 3 and all(math.isfinite(v) for v in values)
        # Every method changes hole pixels only: the whole-image MSE is the hole MSE
        # times the hole fraction, so the two PSNRs differ by exactly -10 log10(fraction).
        for index in range(3):
            fraction = seeded_mask("box", 5, index, 32, 16).mean()
            gap = result.per_image[method]["psnr"][index] - result.per_image[method]["psnr_hole"][index]
            assert gap == pytest.approx(-10 * math.log10(fraction), abs=1e-3)
    with Image.open(grid) as picture:
        assert picture.size == (6 * 32 + 5 * 2, 3 * 32 + 2 * 2)
    # Seeded: a second run gives the same numbers; more holes per image extend them.
    again = evaluate(exported_model.onnx, image_folder, masks="box", size=32, seed=5)
    assert again.per_image == result.per_image
    more = evaluate(exported_model.onnx, image_folder, masks="box", size=32, seed=5, masks_per_image=2)
    assert more.images[:2] == ["img0.png#0", "img0.png#1"] and len(more.images) == 6
    assert more.per_image["gantool"]["psnr"][::2] == result.per_image["gantool"]["psnr"]
    # blend="none": the raw output alone, with the same numbers as beside the blended row
    raw = evaluate(exported_model.onnx, image_folder, masks="box", size=32, seed=5, blend="none")
    assert raw.methods == ["mean", "telea", "ns", "gantool"]
    assert raw.per_image["gantool"] == result.per_image["gantool"]
    assert raw.per_image["gantool"] != result.per_image["gantool_poisson"]
    with pytest.raises(InputError, match="unknown blend mode"):
        evaluate(exported_model.onnx, image_folder, size=32, blend="soft")


def test_evaluate_refuses_bad_options_before_any_work(exported_model, image_folder: Path, tmp_path: Path):
    with pytest.raises(InputError, match="local-size"):
        evaluate(exported_model.onnx, image_folder, size=32, local_size=32)
    with pytest.raises(InputError, match="not found"):
        evaluate(exported_model.onnx, tmp_path / "missing", size=32)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no images"):
        evaluate(exported_model.onnx, tmp_path / "empty", size=32)
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    with pytest.raises(InputError):
        evaluate(exported_model.onnx, image_folder, size=32, grid=blocker / "grid.png")


# -------------------------------------------------------------------------------- CLI


def test_cli_json_table_and_no_overwrite(exported_model, image_folder: Path, tmp_path: Path):
    runner = CliRunner()
    grid = tmp_path / "out" / "grid.png"
    args = ["eval", str(exported_model.folder), "--data", str(image_folder), "--size", "32", "--masks", "free",
            "--grid", str(grid)]
    result = runner.invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data["mean"]) == {"mean", "telea", "ns", "gantool", "gantool_poisson"}
    assert set(data["mean"]["gantool"]) == set(METRICS)
    assert data["settings"]["masks"] == "free" and data["grid"] == str(grid)
    before = grid.read_bytes()

    result = runner.invoke(cli, args)  # the grid exists: refused, file untouched
    assert result.exit_code == 1
    assert "exists" in result.output and "Traceback" not in result.output
    assert grid.read_bytes() == before

    result = runner.invoke(cli, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert "| OpenCV Telea |" in result.output and "| gantool (raw output) |" in result.output
    assert "| gantool + Poisson blend |" in result.output
    result = runner.invoke(cli, [*args, "--no-grid", "--blend", "none", "--json"])
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.output)["mean"]) == {"mean", "telea", "ns", "gantool"}


def test_cli_errors_are_one_line(exported_model, tmp_path: Path):
    runner = CliRunner()
    result = runner.invoke(cli, ["eval", str(exported_model.onnx), "--data", str(tmp_path / "nope"), "--no-grid"])
    assert result.exit_code == 1 and "not found" in result.output and "Traceback" not in result.output
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    (tmp_path / "imgs").mkdir()
    Image.fromarray(textured_rgb(32, 32)).save(tmp_path / "imgs" / "a.png")
    result = runner.invoke(cli, ["eval", str(bad), "--data", str(tmp_path / "imgs"), "--size", "32", "--no-grid"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    result = runner.invoke(cli, ["eval", "--data", str(tmp_path / "imgs"), "--masks", "blob"])
    assert result.exit_code == 2


def test_console_entry_runs_eval(exported_model, image_folder: Path, tmp_path: Path, subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-m", "gantool", "eval", str(exported_model.onnx), "--data", str(image_folder),
         "--size", "32", "--count", "2", "--grid", str(tmp_path / "g.png")],
        capture_output=True, text=True, env=subprocess_env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 image(s) x 1 hole(s)" in proc.stdout and "| gantool + Poisson blend |" in proc.stdout
    assert (tmp_path / "g.png").is_file()


# ------------------------------------------------------------- never touches its data


def test_eval_never_writes_inside_data_even_with_overwrite(exported_model, image_folder: Path):
    before = {p.name: p.read_bytes() for p in image_folder.iterdir()}
    runner = CliRunner()
    for grid in (image_folder / "img0.png", image_folder / "grid.png", image_folder / "sub" / "g.png"):
        result = runner.invoke(cli, ["eval", str(exported_model.onnx), "--data", str(image_folder), "--size", "32",
                                     "--grid", str(grid), "--overwrite"])
        assert result.exit_code == 1 and "inside --data" in result.output and "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in image_folder.iterdir()} == before


def test_eval_does_not_score_its_own_grids(exported_model, image_folder: Path, tmp_path: Path):
    grid = tmp_path / "elsewhere" / "cmp.png"
    evaluate(exported_model.onnx, image_folder, size=32, grid=grid)
    # A user copies grids into the data folder (under another name, and an old default-named one).
    (image_folder / "copied.png").write_bytes(grid.read_bytes())
    (image_folder / "eval_grid.png").write_bytes(grid.read_bytes())
    result = evaluate(exported_model.onnx, image_folder, size=32)
    assert result.images == ["img0.png", "img1.png", "img2.png"]


def test_eval_warns_on_images_smaller_than_the_evaluation_size(exported_model, image_folder: Path, caplog):
    evaluate(exported_model.onnx, image_folder, size=48, local_size=24, classical=False)
    warnings = [r.message for r in caplog.records if "smaller than --size 48" in r.message]
    assert len(warnings) == 1 and "2 image(s)" in warnings[0]  # 40x56 and 60x36; 48x48 is not smaller


def test_infinite_psnr_is_shown_as_inf_and_not_ranked_best():
    from gantool.tools.evaluate import EvalResult

    per_image = {
        "mean": {k: [1.0] if not k.startswith("psnr") else [math.inf] for k in METRICS},
        "gantool": {k: [0.5] if not k.startswith("psnr") else [30.0] for k in METRICS},
    }
    table = EvalResult({}, ["a.png"], per_image).markdown()
    mean_row = next(line for line in table.splitlines() if line.startswith("| mean-pixel fill"))
    gantool_row = next(line for line in table.splitlines() if line.startswith("| gantool"))
    assert "| inf |" in mean_row and "**inf**" not in table
    assert "**30.00**" in gantool_row
    data = EvalResult({}, ["a.png"], per_image).to_dict()
    assert data["mean"]["mean"]["psnr"] == "inf"


def test_the_grid_is_written_in_the_format_its_name_says(exported_model, image_folder: Path, tmp_path: Path):
    # Before the fix: --grid out.jpg held PNG bytes.
    runner = CliRunner()
    base = ["eval", str(exported_model.onnx), "--data", str(image_folder), "--size", "32", "--count", "1",
            "--blend", "none"]  # fmt: skip
    for name, magic in (("out.jpg", b"\xff\xd8\xff"), ("out.webp", b"RIFF")):
        result = runner.invoke(cli, [*base, "--grid", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert (tmp_path / name).read_bytes().startswith(magic)
    with Image.open(tmp_path / "out.jpg") as grid:
        assert grid.format == "JPEG"
    result = runner.invoke(cli, [*base, "--grid", str(tmp_path / "out.gif")])  # refused before any work
    assert result.exit_code == 1 and "--grid" in result.output and "the suffix picks the format" in result.output
    assert not (tmp_path / "out.gif").exists()


def test_the_model_cards_eval_script_tabulates_evaluate_per_seed(
    exported_model, image_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    """examples/eval_default.py (the model card's tables): each seed's cell is evaluate()'s mean hole
    PSNR for that seed, and the margin line is the blended row minus Telea's, seed by seed."""
    import runpy

    script = Path(__file__).resolve().parents[1] / "examples" / "eval_default.py"
    argv = [str(script), str(exported_model.onnx), "--data", str(image_folder), "--seeds", "0", "1",
            "--masks-per-image", "2", "--sizes", "32", "--masks", "box"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out
    expected = [evaluate(exported_model.onnx, image_folder, masks="box", size=32, seed=seed, masks_per_image=2)
                for seed in (0, 1)]
    telea = [r.mean("telea", "psnr_hole") for r in expected]
    blended = [r.mean("gantool_poisson", "psnr_hole") for r in expected]
    assert f"| OpenCV Telea | {telea[0]:.2f} | {telea[1]:.2f} | {(telea[0] + telea[1]) / 2:.2f} |" in printed, printed
    margins = ", ".join(f"{b - t:+.2f}" for b, t in zip(blended, telea))
    assert f"minus OpenCV Telea: mean {(blended[0] + blended[1] - telea[0] - telea[1]) / 2:+.2f} dB (per seed {margins})" \
        in printed, printed
    assert "**32 px, box holes**" in printed and "free-form" not in printed

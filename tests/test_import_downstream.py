"""An imported GLCIC-PyTorch model through `serve`, `eval`, `bench inpaint` and `info`
(`inpaint --ray` is in test_ray_inpaint.py), each against the independent oracle
(tests/glcic_oracle.py): the model is imported from a GLCIC-PyTorch-format state_dict with
random weights and non-trivial BatchNorm statistics, and exported once per session."""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cli_helpers import invoke
from glcic_oracle import cn_layers
from import_helpers import (
    LOCAL,
    MPV,
    SIZE,
    WIDTH,
    ImportedModel,
    assert_matches_oracle,
    exported_glcic,  # noqa: F401 (fixture)
    imported_glcic,  # noqa: F401 (fixture)
    imported_model,
    oracle_pixels,
    photo,
    rounding_may_differ,
)
from inpaint_helpers import exported_model  # noqa: F401 (fixture: gantool's own tiny model)
from serve_helpers import decode, encode, live_server, multipart, serve_process, wait_ready

# ------------------------------------------------------------------ serve


def post_inpaint(url: str, pixels: np.ndarray, hole: np.ndarray, **fields: str) -> tuple[int, bytes]:
    parts = [("image", "image.png", encode(pixels)), ("mask", "mask.png", encode(hole.astype(np.uint8) * 255))]
    parts += [(name, None, value.encode()) for name, value in fields.items()]
    body, content_type = multipart(parts)
    request = urllib.request.Request(url + "/v1/inpaint", data=body, headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, response.read()


def test_the_server_answers_an_imported_model_as_the_oracle(imported_glcic: ImportedModel):
    from gantool import Inpainter
    from gantool.serving.app import build_app
    from gantool.serving.settings import ServeSettings

    inpainter = Inpainter(imported_glcic.imported, "cpu", "auto", blend="none")
    with live_server(build_app(inpainter, ServeSettings())) as url:
        wait_ready(url)
        with urllib.request.urlopen(url + "/v1/model", timeout=30) as response:
            assert json.loads(response.read())["backend"] == "eager"  # generator.safetensors
        for seed, (height, width) in enumerate([(40, 48), (52, 44)]):
            pixels, hole = photo(height, width, seed)
            status, body = post_inpaint(url, pixels, hole)
            assert status == 200
            assert_matches_oracle(np.asarray(decode(body).convert("RGB")), pixels, hole, imported_glcic)


@pytest.mark.slow  # an export, and a `gantool serve` process per backend (start-up imports torch and ONNX Runtime)
@pytest.mark.parametrize("backend", ["onnx", "pt2"])
def test_gantool_serve_answers_an_imported_models_export_as_the_oracle(
    exported_glcic: ImportedModel,
    subprocess_env: dict[str, str],
    backend: str,
):
    args = ["--model", str(exported_glcic.export), "--provider", "cpu", "--backend", backend, "--blend", "poisson"]
    with serve_process(args, subprocess_env) as (url, lines, _):
        wait_ready(url)
        pixels, hole = photo(44, 40, 7)
        status, body = post_inpaint(url, pixels, hole, blend="none")  # the request's blend beats the default
        assert status == 200
        assert_matches_oracle(np.asarray(decode(body).convert("RGB")), pixels, hole, exported_glcic)
    assert lines[1].startswith(f"backend: {backend}; ")


# ------------------------------------------------------------------ eval


def psnr_bounds(expected: np.ndarray, tol: float, truth: np.ndarray, hole: np.ndarray) -> tuple[float, float]:
    """The hole PSNR (dB) that eval may report for 8-bit outputs within the oracle's tolerance:
    each value is the oracle's, rounded, or (within ``tol`` of a rounding boundary) the other
    neighbouring level; a float32 sum over n values adds a relative error of about n eps."""
    inside = np.broadcast_to(hole[..., None], expected.shape)
    e, t = expected[inside], truth[inside]
    rounded = np.clip(np.rint(e), 0, 255)
    other = np.clip(np.where(rounded > e, np.floor(e), np.ceil(e)), 0, 255)
    flip = rounding_may_differ(e, tol)
    err_a, err_b = (rounded - t) ** 2, np.where(flip, (other - t) ** 2, (rounded - t) ** 2)
    mse_low, mse_high = np.minimum(err_a, err_b).mean() / 255**2, np.maximum(err_a, err_b).mean() / 255**2
    slack = 10 * math.log10(1 + 4 * e.size * torch.finfo(torch.float32).eps)
    return -10 * math.log10(mse_high) - slack, -10 * math.log10(mse_low) + slack


def test_eval_scores_an_imported_model_as_the_oracle_does(imported_glcic: ImportedModel, tmp_path: Path):
    check_eval(imported_glcic, imported_glcic.imported, "eager", tmp_path)


@pytest.mark.slow  # the session's export of the imported model
def test_eval_scores_an_imported_models_onnx_export_as_the_oracle_does(
    exported_glcic: ImportedModel,
    tmp_path: Path,
):
    assert exported_glcic.export is not None
    check_eval(exported_glcic, exported_glcic.export, "onnx", tmp_path)


def check_eval(imported: ImportedModel, model: Path, backend: str, tmp_path: Path) -> None:
    """eval's hole PSNR of each image, against the one the oracle's output gets (8-bit, composited)."""
    from gantool.tools.evaluate import seeded_mask

    size, seed = 48, 3
    data = tmp_path / "truth"
    data.mkdir()
    truths = []
    for i in range(2):
        pixels = np.random.default_rng(40 + i).integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(data / f"img{i}.png")
        truths.append(pixels)  # already size x size: eval's centre crop and resize keep it
    result = invoke("eval", model, "--data", data, "--size", size, "--seed", seed,
                    "--provider", "cpu", "--blend", "none", "--no-grid", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["settings"]["backend"] == backend and report["images"] == ["img0.png", "img1.png"]
    for i, truth in enumerate(truths):
        hole = seeded_mask("box", seed, i, size, size // 2) > 0.5
        expected, tol = oracle_pixels(imported, truth, hole)
        low, high = psnr_bounds(expected, tol, truth.astype(np.float64), hole)
        got = report["per_image"]["gantool"]["psnr_hole"][i]
        assert low <= got <= high, (i, low, got, high)
        assert report["per_image"]["gantool"]["l1"][i] > 0  # the hole was filled, not copied


# ------------------------------------------------------------------ bench inpaint


def oracle_flops(width: int, size: int) -> int:
    """2 FLOPs per multiply-add of every convolution (a transposed one: per input pixel), from the layer list."""
    total, side = 0, size
    for _, kind, cin, cout, k, stride, _ in cn_layers(width):
        if kind == "deconv":
            total += 2 * cin * cout * k * k * side * side
            side *= stride
        else:
            side //= stride
            total += 2 * cin * cout * k * k * side * side
    return total


def bench_rows(model: Path, backends: str, size: int) -> dict[str, dict]:
    result = invoke("bench", "inpaint", model, "--sizes", size, "--batch", 1, "--backends", backends,
                    "--providers", "cpu", "--repeats", 1, "--warmup", 0, "--e2e-images", 0, "--no-crop-check",
                    "--no-blend-check", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {row["backend"]: row for row in json.loads(result.output)["rows"]}
    assert set(rows) == set(backends.split(","))
    for backend, row in rows.items():
        assert row["median_ms_per_image"] > 0 and (row["size"], row["batch"], row["runs"]) == (size, 1, 1), row
        assert row["gflop_per_image"] == pytest.approx(oracle_flops(WIDTH, size) / 1e9, rel=1e-12), backend
        assert row["passes_gate"] is not False, row  # eager is the reference (no gate); the others pass theirs
    return rows


def test_bench_inpaint_times_an_imported_model(imported_glcic: ImportedModel):
    rows = bench_rows(imported_glcic.imported, "eager", 32)
    assert rows["eager"]["provider"] == "cpu"


@pytest.mark.slow  # the session's export, and TorchScript traced in memory
def test_bench_inpaint_times_every_format_of_an_imported_models_export(exported_glcic: ImportedModel):
    assert exported_glcic.export is not None
    rows = bench_rows(exported_glcic.export, "eager,pt2,torchscript,onnx", 32)
    assert all(rows[b]["passes_gate"] for b in ("pt2", "torchscript", "onnx"))
    assert "traced in memory" in rows["torchscript"]["note"]


# ------------------------------------------------------------------ info


EXPECTED_ARCHITECTURE = {
    "width": WIDTH,
    "block_order": "conv-relu-bn",
    "conv_bias": True,
    "fill": MPV,
    "hole_fill": "mean-pixel",
    "train_size": SIZE,
    "local_size": LOCAL,
    "imported": True,
}


def check_info_architecture(path: Path) -> None:
    text = invoke("info", path)
    assert text.exit_code == 0, text.output
    line = next(line for line in text.output.splitlines() if line.startswith("architecture: "))
    fill = ", ".join(f"{v:.4f}" for v in MPV)
    assert line == (
        f"architecture: width {WIDTH}, conv -> ReLU -> BN blocks with conv biases (GLCIC-PyTorch's), "
        f"fill {fill}, training size {SIZE} px (local {LOCAL} px); imported"
    )
    assert json.loads(invoke("info", path, "--json").output)["architecture"] == EXPECTED_ARCHITECTURE


def test_info_shows_the_architecture_variant_of_an_imported_models_weights(imported_glcic: ImportedModel):
    check_info_architecture(imported_glcic.imported / "generator.safetensors")


@pytest.mark.slow  # the session's export of the imported model
@pytest.mark.parametrize("name", ["generator.onnx", "generator.pt2", "generator.safetensors"])
def test_info_shows_the_architecture_variant_of_an_imported_models_export(
    exported_glcic: ImportedModel,
    name: str,
):
    assert exported_glcic.export is not None
    check_info_architecture(exported_glcic.export / name)


def test_info_shows_the_architecture_of_an_imported_checkpoint_and_of_gantools_own(
    imported_glcic: ImportedModel,
    exported_model,
):
    text = invoke("info", imported_glcic.imported / "checkpoint.pt")
    assert text.exit_code == 0, text.output
    assert "architecture: width 8, conv -> ReLU -> BN blocks with conv biases (GLCIC-PyTorch's)" in text.output
    assert "imported from: glcic-pytorch" in text.output
    own = invoke("info", exported_model.onnx)
    line = next(line for line in own.output.splitlines() if line.startswith("architecture: "))
    assert "conv -> BN -> ReLU blocks without conv biases (gantool's)" in line and not line.endswith("imported")


# ------------------------------------------------------------------ full width (GLCIC-PyTorch's shapes)


@pytest.mark.slow  # a full-width export and a `gantool serve` process: minutes on 2 loaded cores
def test_full_width_imported_model_serves_and_evaluates_as_the_oracle(
    tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str], tmp_path: Path
):
    model = imported_model(tmp_path_factory.mktemp("full_width"), width=64, formats=("onnx",))
    assert model.export is not None
    args = ["--model", str(model.export), "--provider", "cpu", "--blend", "none"]
    with serve_process(args, subprocess_env) as (url, _, _):
        wait_ready(url, timeout=300)
        pixels, hole = photo(40, 36, 9)
        status, body = post_inpaint(url, pixels, hole)
        assert status == 200
        assert_matches_oracle(np.asarray(decode(body).convert("RGB")), pixels, hole, model)
    check_eval(model, model.export, "onnx", tmp_path)

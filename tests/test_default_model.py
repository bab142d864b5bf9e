"""The shipped default model (models/): present, small, documented, the ONNX file
matching the safetensors weights, found by default from a checkout and from an
installed wheel, and the examples/ image and mask it is demonstrated on."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from gantool.cli import cli
from gantool.core.artifacts import default_model_dir, read_model_metadata, resolve_model
from gantool.export.provenance import find_machine_traces
from gantool.inference.inpainter import Inpainter
from gantool.runtime.backends import OnnxBackend
from gantool.runtime.choice import auto_choice
from gantool.runtime.openvino import openvino_available
from gantool.training.checkpoint import load_generator_weights, weights_sha256

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
ONNX, WEIGHTS, CARD = MODELS / "generator.onnx", MODELS / "generator.safetensors", MODELS / "README.md"
EXAMPLE_IMAGE, EXAMPLE_MASK = REPO / "examples" / "chelsea.png", REPO / "examples" / "chelsea_mask.png"
MAX_BYTES = 20 * 1024 * 1024


def _data_script():
    spec = importlib.util.spec_from_file_location("make_default_data", REPO / "examples" / "make_default_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_models_folder_is_complete_and_at_most_20_mb():
    for path in (ONNX, WEIGHTS, CARD):
        assert path.is_file(), f"{path} is missing"
    total = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert total <= MAX_BYTES, f"models/ holds {total / 2**20:.1f} MB (limit 20 MB)"
    assert not (MODELS / "generator.onnx.data").exists()  # one self-contained ONNX file


def test_both_files_carry_the_same_weights_and_config():
    onnx_meta, weights_meta = read_model_metadata(ONNX), read_model_metadata(WEIGHTS)
    for key in ("gantool.model_config", "gantool.weights_sha256", "gantool.train_step", "gantool.processing"):
        assert onnx_meta[key] == weights_meta[key], key
    generator, _ = load_generator_weights(WEIGHTS)
    assert weights_sha256(generator.state_dict()) == onnx_meta["gantool.weights_sha256"]
    assert onnx_meta["gantool.precision"] == "fp32"


def test_shipped_models_carry_no_trace_of_the_machine_that_built_them():
    # Every file in models/ (a stale generator_int8.onnx once shipped 41 stack traces and a temp folder).
    shipped = sorted(p for p in MODELS.iterdir() if p.is_file())
    assert {ONNX, WEIGHTS, MODELS / "generator_int8.onnx"} <= set(shipped)
    for path in shipped:
        assert find_machine_traces(path) == [], path.name
        assert b'File "/' not in path.read_bytes(), path.name
        if path.suffix == ".onnx":
            annotated = [p.key for node in onnx.load(str(path)).graph.node for p in node.metadata_props]
            assert annotated == [], path.name  # no pkg.torch.onnx.stack_trace and friends


def test_int8_model_passes_its_gate_against_the_fp32_model():
    int8_path = MODELS / "generator_int8.onnx"
    if not int8_path.is_file():
        pytest.skip("models/generator_int8.onnx is not shipped (it did not pass its gate)")
    from gantool.export.parity import compare

    meta, fp32_meta = read_model_metadata(int8_path), read_model_metadata(ONNX)
    assert meta["gantool.precision"] == "int8"
    assert meta["gantool.weights_sha256"] == fp32_meta["gantool.weights_sha256"]
    int8, fp32 = OnnxBackend(ONNX, "cpu", precision="int8"), OnnxBackend(ONNX, "cpu")
    assert int8.path == int8_path and fp32.path == ONNX  # int8 only when asked for
    image = np.asarray(Image.open(EXAMPLE_IMAGE).convert("RGB"), np.float32).transpose(2, 0, 1)[None] / 255
    mask = (np.asarray(Image.open(EXAMPLE_MASK).convert("L")) > 127).astype(np.float32)[None, None]
    result = compare(int8.run(image, mask), fp32.run(image, mask), image, mask)
    assert result["known_exact"] and result["psnr_hole_uint8"] >= 35.0, result


@pytest.mark.parametrize("shape", [(1, 96, 96), (2, 64, 128)])
def test_onnx_matches_the_safetensors_generator_and_keeps_known_pixels(shape):
    batch, height, width = shape
    generator, _ = load_generator_weights(WEIGHTS)
    session = OnnxBackend(ONNX, provider="cpu")
    rng = np.random.default_rng(batch)
    image = rng.random((batch, 3, height, width), dtype=np.float32)
    mask = np.zeros((batch, 1, height, width), np.float32)
    mask[..., height // 4 : height // 2, width // 3 : width // 2] = 1.0
    with torch.no_grad():
        expected = generator(torch.from_numpy(image), torch.from_numpy(mask)).numpy()
    got = session.run(image, mask)
    assert np.abs(got - expected).max() <= 1e-4
    known = np.broadcast_to(mask < 0.5, image.shape)
    np.testing.assert_array_equal(got[known], image[known])  # composited in the graph: exact
    assert np.abs(got[~known] - image[~known]).max() > 1e-3  # and the hole was filled


def test_the_shipped_model_is_the_default():
    assert default_model_dir() == MODELS
    path, backend = resolve_model(None)
    assert (path, backend) == (ONNX, "onnx")


def test_model_card_documents_data_config_steps_time_and_evaluation():
    text = CARD.read_text(encoding="utf-8")
    script = _data_script()
    trained = set(script.DEBIAN_PHOTOS) - set(script.DEBIAN_HELDOUT)
    assert not trained & {*script.DEBIAN_HELDOUT, *script.HELDOUT_IMAGES}, "held-out images must never be trained on"
    for name in (*script.DEBIAN_PHOTOS, *script.HELDOUT_IMAGES):
        assert name in text, f"the model card does not list {name}"
    config = json.loads(read_model_metadata(ONNX)["gantool.model_config"])
    recipe = (REPO / "examples" / "default_photos.toml").read_text()
    for key in ("width", "size", "local_size"):
        assert re.search(rf"^{key} = {config[key]}\b", recipe, re.MULTILINE), key  # the recipe is the shipped model's
    assert re.search(rf'^hole_fill = "{config["hole_fill"]}"', recipe, re.MULTILINE)
    for needle in ("examples/default_photos.toml", "Wall time", "PSNR", "SSIM", "Telea", "Navier-Stokes", "Limitations"):
        assert needle in text, needle
    assert read_model_metadata(ONNX)["gantool.train_step"] in text  # the steps trained


def test_example_image_and_mask_run_through_gantool_inpaint(tmp_path: Path):
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["inpaint", str(EXAMPLE_IMAGE), "--mask", str(EXAMPLE_MASK), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(EXAMPLE_IMAGE) as src, Image.open(EXAMPLE_MASK) as m, Image.open(out) as dst:
        original, hole, filled = np.asarray(src.convert("RGB")), np.asarray(m.convert("L")) > 127, np.asarray(dst)
    assert original.shape == filled.shape and 0 < hole.mean() < 0.25
    np.testing.assert_array_equal(filled[~hole], original[~hole])
    assert np.abs(filled[hole].astype(int) - original[hole]).mean() > 1  # the hole was repainted


def test_python_api_uses_the_shipped_model():
    inpainter = Inpainter()  # no model: the shipped one
    # It prefers int8 (its gate: 73.7 dB): on the CPU OpenVINO runs generator_int8.onnx (ONNX Runtime
    # without OpenVINO); on a GPU, fp32 on CUDA.
    expected = auto_choice(MODELS)
    assert (inpainter.backend.name, inpainter.backend.precision) == (expected["backend"], expected["precision"])
    if "CUDA" not in inpainter.provider:
        assert inpainter.backend.precision == "int8" and inpainter.backend.path.name == "generator_int8.onnx"
        assert inpainter.provider == ("CPU" if openvino_available() else "CPUExecutionProvider")
    assert Path(inpainter.backend.path).parent == MODELS
    result = inpainter.inpaint(EXAMPLE_IMAGE, EXAMPLE_MASK)
    assert result.size == Image.open(EXAMPLE_IMAGE).size


def test_pyproject_lists_every_package_under_toolkit():
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO / "toolkit").parts) for p in (REPO / "toolkit").rglob("__init__.py")}
    listed = set(setuptools["packages"])
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
    assert setuptools["package-dir"]["gantool.models"] == "models"


@pytest.mark.slow
def test_an_installed_wheel_finds_the_shipped_model(tmp_path: Path):
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, source / name)
    if not (source / "README.md").exists():
        (source / "README.md").write_text("gantool\n")
    shutil.copytree(REPO / "toolkit" / "gantool", source / "toolkit" / "gantool",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(MODELS, source / "models")
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", str(wheels)], capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and "No module named pip" in build.stderr:
        pytest.skip("pip is not available to build a wheel")
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("gantool-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"gantool/models/generator.onnx", "gantool/models/generator.safetensors", "gantool/models/README.md"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install puts in site-packages
    probe = ("import gantool.core.artifacts as r; from pathlib import Path; d = r.default_model_dir(); "
             "print(d); print(r.resolve_model(None)[0])")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    folder, model = proc.stdout.split()
    assert Path(folder) == site / "gantool" / "models" and Path(model) == site / "gantool" / "models" / "generator.onnx"


def test_the_readmes_before_after_picture_is_the_shipped_models_quickstart_output(tmp_path: Path):
    """examples/quickstart.png (the README's picture) is [holes white | what the quickstart's first
    command writes]: its right half against a fresh `gantool inpaint` with the shipped model, so a
    new model without a new picture fails here. Within a level or so: other CPUs round differently."""
    spec = importlib.util.spec_from_file_location("quickstart_figure", REPO / "examples" / "quickstart_figure.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shipped = np.asarray(Image.open(REPO / "examples" / "quickstart.png").convert("RGB")).astype(int)
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["inpaint", str(EXAMPLE_IMAGE), "--mask", str(EXAMPLE_MASK), "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = np.asarray(Image.open(out)).astype(int)
    fresh = np.asarray(script.before_after()).astype(int)
    width = written.shape[1]
    np.testing.assert_array_equal(fresh[:, -width:], written)  # the script's right half is the command's output
    assert shipped.shape == fresh.shape and shipped.shape[1] == 2 * width + script.GAP
    hole = np.asarray(Image.open(EXAMPLE_MASK).convert("L")) > 127
    np.testing.assert_array_equal(shipped[:, :width][hole], 255)  # holes shown white
    assert np.abs(shipped - fresh).mean() < 0.05 and np.abs(shipped - fresh).max() <= 8
    assert "examples/quickstart.png" in (REPO / "README.md").read_text(encoding="utf-8")

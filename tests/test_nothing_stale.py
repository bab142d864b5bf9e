"""Issue #10, the deployment side: nothing stale, nothing silently wrong.

- 0/1 mask images are read as masks; images without holes are skipped, not "inpainted";
- a model that produces NaN/Inf fails the image, and nothing is written;
- images whose known pixels cannot be written back (mode F, out-of-range I,
  16-bit colour decoded as 8-bit) are refused, never silently changed;
- an export folder holds one model: a re-export removes the older files, and a
  folder that mixes exports is refused;
- non-finite weights are refused by export and reported by info;
- error messages keep their cause (FIFO, not a checkpoint, ONNX IR version).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner, Result
from onnx import numpy_helper
from PIL import Image

from conftest import TINY_CONFIG, briefly_trained_generator, write_checkpoint
from gantool.cli import cli
from gantool.core.artifacts import read_model_metadata
from gantool.core.errors import InputError, ModelError
from gantool.core.processing import mask_to_array, read_image
from gantool.export.exporter import export_generator
from gantool.inference.inpainter import Inpainter
from gantool.training.checkpoint import save_checkpoint
from inpaint_helpers import ExportedModel, exported_model, textured_rgb  # noqa: F401


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def inpaint(*args: str | Path) -> Result:
    return invoke("inpaint", *args)


def photo(tmp_path: Path, name: str = "photo.png", size: tuple[int, int] = (20, 28)) -> Path:
    path = tmp_path / name
    Image.fromarray(textured_rgb(*size)).save(path)
    return path


# ---------------------------------------------------------------------------- masks


@pytest.mark.parametrize("mode", ["L", "P", "I;16"])
def test_a_mask_whose_maximum_is_1_is_a_zero_one_mask(mode: str) -> None:
    values = np.zeros((6, 8), np.uint8)
    values[2:4, 3:6] = 1
    image = Image.fromarray(values).convert(mode) if mode != "I;16" else Image.fromarray(values.astype(np.uint16))
    assert np.array_equal(mask_to_array(image) > 0.5, values == 1)


def test_zero_one_mask_png_is_inpainted_through_the_cli(exported_model: ExportedModel, tmp_path: Path) -> None:
    image = photo(tmp_path)
    values = np.zeros((20, 28), np.uint8)
    values[5:12, 6:15] = 1  # the usual dataset mask: 1 = hole
    Image.fromarray(values).save(tmp_path / "mask01.png")
    result = inpaint(image, "--mask", tmp_path / "mask01.png", "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    before = np.asarray(Image.open(image))
    after = np.asarray(Image.open(tmp_path / "photo.inpainted.png"))
    changed = (before != after).any(axis=2)
    assert changed.any() and not changed[values == 0].any()


def test_images_without_holes_are_skipped_and_counted(exported_model: ExportedModel, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    photo(folder, "a.png")
    photo(folder, "b.png")
    masks = tmp_path / "masks"
    masks.mkdir()
    hole = np.zeros((20, 28), np.uint8)
    hole[4:10, 4:10] = 255
    Image.fromarray(hole).save(masks / "a.png")
    Image.fromarray(np.zeros_like(hole)).save(masks / "b.png")
    result = inpaint(folder, "--mask", masks, "-o", tmp_path / "out", "--model", exported_model.folder)
    assert result.exit_code == 0, result.output  # something was inpainted
    assert "1 inpainted, 1 skipped (no hole), 0 failed" in result.output
    assert (tmp_path / "out" / "a.inpainted.png").exists()
    assert not (tmp_path / "out" / "b.inpainted.png").exists()


# ------------------------------------------------------------------- broken models


def _poisoned_onnx(source: Path, target_dir: Path) -> Path:
    """A copy of ``source`` whose first convolution weights hold a NaN."""
    target_dir.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(source))
    weight = next(t for t in model.graph.initializer if numpy_helper.to_array(t).ndim == 4)
    array = numpy_helper.to_array(weight).copy()
    array.flat[0] = np.nan
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    path = target_dir / "generator.onnx"
    onnx.save(model, str(path))
    return path


def test_a_model_that_produces_nan_fails_the_image_and_writes_nothing(
    exported_model: ExportedModel, tmp_path: Path
) -> None:
    broken = _poisoned_onnx(exported_model.onnx, tmp_path / "broken")
    image = photo(tmp_path)
    result = inpaint(image, "--box", "4,4,8,8", "--model", broken)
    assert result.exit_code == 1
    assert "the model produced NaN/Inf" in result.output
    assert not (tmp_path / "photo.inpainted.png").exists()
    with pytest.raises(ModelError, match="NaN/Inf"):
        Inpainter(broken, provider="cpu").inpaint(textured_rgb(20, 28), np.ones((20, 28), np.uint8))


def test_export_refuses_and_info_reports_non_finite_weights(tmp_path: Path) -> None:
    generator = briefly_trained_generator(TINY_CONFIG, steps=1)
    state = {k: v.clone() for k, v in generator.state_dict().items()}
    name = next(k for k, v in state.items() if v.is_floating_point() and v.ndim == 4)
    state[name].view(-1)[0] = float("inf")
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    save_checkpoint(checkpoint, {"model_config": TINY_CONFIG.to_dict(), "generator": state, "step": 1, "phase": "g"})
    result = invoke("export", checkpoint, "--no-verify")
    assert result.exit_code == 1 and "non-finite weights" in result.output and name in result.output
    assert not (tmp_path / "run" / "export" / "generator.onnx").exists()
    info = invoke("info", checkpoint)
    assert info.exit_code == 0 and "warning: non-finite generator weights" in info.output


def test_info_reports_non_finite_weights_in_an_onnx_file(exported_model: ExportedModel, tmp_path: Path) -> None:
    broken = _poisoned_onnx(exported_model.onnx, tmp_path / "broken")
    info = invoke("info", broken)
    assert info.exit_code == 0 and "warning: non-finite weights" in info.output


# --------------------------------------------------------------------- image modes


def test_float_and_out_of_range_int_images_are_refused_not_changed(
    exported_model: ExportedModel, tmp_path: Path
) -> None:
    Image.fromarray(np.full((20, 28), 0.25, np.float32)).save(tmp_path / "float.tif")
    Image.fromarray(np.full((20, 28), 70000, np.int32)).save(tmp_path / "wide.tif")
    for name, why in (("float.tif", "32-bit float"), ("wide.tif", "outside the 16-bit range")):
        result = inpaint(tmp_path / name, "--box", "2,2,5,5", "--model", exported_model.folder)
        assert result.exit_code == 1 and why in result.output, result.output
        assert not list(tmp_path.glob("*.inpainted.png"))


def test_an_in_range_int_image_round_trips_its_known_pixels(exported_model: ExportedModel, tmp_path: Path) -> None:
    values = (np.arange(20 * 28).reshape(20, 28) * 97 % 65536).astype(np.int32)
    Image.fromarray(values).save(tmp_path / "int.tif")
    result = inpaint(tmp_path / "int.tif", "--box", "2,2,5,5", "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    out = np.asarray(Image.open(tmp_path / "int.inpainted.png")).astype(np.int64)
    known = np.ones_like(values, bool)
    known[2:7, 2:7] = False
    assert np.array_equal(out[known], values[known])


def test_sixteen_bit_colour_decoded_as_eight_bit_is_refused(tmp_path: Path) -> None:
    cv2 = pytest.importorskip("cv2")
    rgb16 = (np.arange(20 * 28 * 3).reshape(20, 28, 3) * 53 % 65536).astype(np.uint16)
    cv2.imwrite(str(tmp_path / "deep.png"), rgb16)
    if Image.open(tmp_path / "deep.png").mode not in ("RGB", "RGBA"):
        pytest.skip("this Pillow decodes 16-bit colour natively")
    with pytest.raises(InputError, match="16-bit colour"):
        read_image(tmp_path / "deep.png", lossless=True)
    assert read_image(tmp_path / "deep.png").mode == "RGB"  # reading for other uses still works


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_a_fifo_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    result = inpaint(fifo, "--box", "1,1,2,2")
    assert result.exit_code == 1 and "not a regular file" in result.output


# --------------------------------------------------------------------- whole exports


def test_re_export_removes_the_older_exports_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = write_checkpoint(run / "checkpoints" / "a.pt", briefly_trained_generator(TINY_CONFIG, seed=1, steps=1))
    second = write_checkpoint(run / "checkpoints" / "b.pt", briefly_trained_generator(TINY_CONFIG, seed=2, steps=1))
    out = tmp_path / "export"
    export_generator(first, out, formats=("onnx", "torchscript"), fp16=True, verify=False)
    with pytest.raises(InputError, match="refusing to overwrite"):
        export_generator(second, out, formats=("onnx",), verify=False)
    export_generator(second, out, formats=("onnx",), verify=False, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["export_report.json", "generator.onnx", "generator.safetensors"]
    hashes = {read_model_metadata(p)["gantool.weights_sha256"] for p in out.glob("generator.*")}
    assert len(hashes) == 1


def test_a_folder_that_mixes_exports_is_refused_naming_the_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = write_checkpoint(run / "checkpoints" / "a.pt", briefly_trained_generator(TINY_CONFIG, seed=1, steps=1))
    second = write_checkpoint(run / "checkpoints" / "b.pt", briefly_trained_generator(TINY_CONFIG, seed=2, steps=1))
    export_generator(first, tmp_path / "a", formats=("onnx", "torchscript"), verify=False)
    export_generator(second, tmp_path / "b", formats=("onnx",), verify=False)
    mixed = tmp_path / "mixed"
    shutil.copytree(tmp_path / "b", mixed)
    shutil.copy(tmp_path / "a" / "generator.torchscript.pt", mixed)
    with pytest.raises(ModelError, match=r"mixes files of different exports.*generator\.onnx.*generator\.torchscript\.pt"):
        Inpainter(mixed, provider="cpu", backend="torchscript")
    result = inpaint(photo(tmp_path), "--box", "1,1,4,4", "--model", mixed)
    assert result.exit_code == 1 and "mixes files of different exports" in result.output


# ---------------------------------------------------------------------- causes kept


def test_info_on_a_non_checkpoint_keeps_the_cause(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.pt"
    bogus.write_bytes(b"these are not the weights you are looking for")
    result = invoke("info", bogus)
    assert result.exit_code == 1
    assert "not a readable gantool checkpoint (" in result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output


def test_an_onnx_ir_version_too_new_names_the_versions(exported_model: ExportedModel, tmp_path: Path) -> None:
    model = onnx.load(str(exported_model.onnx))
    model.ir_version = 99
    future = tmp_path / "future" / "generator.onnx"
    future.parent.mkdir()
    future.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError) as caught:
        Inpainter(future, provider="cpu")
    message = str(caught.value)
    assert "99" in message and "IR version" in message  # the cause, not a cut-off fragment
    assert json.dumps(message)  # one printable line
    assert "\n" not in message


def test_torch_is_not_needed_to_inspect_an_onnx_folder(exported_model: ExportedModel) -> None:
    # Reading the folder's metadata for the consistency check must not import torch for the
    # safetensors header (an ONNX-only deployment should stay light).
    assert torch is not None  # this test process has torch; the subprocess below checks the module list
    import subprocess
    import sys

    code = (
        "import sys; from gantool.core.artifacts import check_export_folder; "
        f"check_export_folder({str(exported_model.folder)!r}); print('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "toolkit")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"

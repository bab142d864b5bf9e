"""A model file is what its name says: a file renamed into another precision's role is refused
in one line when it opens, and a folder that holds only another precision's file says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from gantool.cli import cli
from gantool.core.artifacts import META_PRECISION, resolve_model
from gantool.core.errors import ModelError
from inpaint_helpers import exported_model  # noqa: F401 (fixture)


def _with_precision(source: Path, target: Path, precision: str) -> Path:
    """``source`` saved as ``target`` with its recorded precision set to ``precision``."""
    model = onnx.load(str(source))
    for prop in model.metadata_props:
        if prop.key == META_PRECISION:
            prop.value = precision
            break
    else:
        model.metadata_props.add(key=META_PRECISION, value=precision)
    onnx.save_model(model, str(target))
    return target


@pytest.mark.parametrize(
    ("name", "recorded", "role"),
    [("generator.onnx", "int8", "fp32"), ("generator_int8.onnx", "fp16", "int8"), ("generator_fp16.onnx", "int8", "fp16")],
)
def test_a_renamed_model_file_is_refused_naming_the_mismatch(exported_model, tmp_path, name, recorded, role):
    # Before the fix an int8 file named generator.onnx ran under --precision fp32 as "int8 (as requested)".
    folder = tmp_path / "m"
    folder.mkdir()
    _with_precision(exported_model.onnx, folder / name, recorded)
    with pytest.raises(ModelError, match=rf"records precision {recorded}, but {name} is the {role} model's name"):
        resolve_model(folder / name)
    mask = tmp_path / "mask.png"
    image = tmp_path / "image.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (90, 120, 30)).save(image)
    Image.new("L", (32, 32), 255).save(mask)
    result = CliRunner().invoke(cli, ["inpaint", str(image), "--mask", str(mask), "--model", str(folder / name),
                                      "-o", str(tmp_path / "out.png")])  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"records precision {recorded}" in result.output and not (tmp_path / "out.png").exists()


def test_a_folder_with_only_another_precision_names_the_file_it_has(exported_model, tmp_path):
    # Before the fix: "no model in ...: expected generator.onnx or ..." without naming the int8 file there.
    folder = tmp_path / "only_int8"
    folder.mkdir()
    _with_precision(exported_model.onnx, folder / "generator_int8.onnx", "int8")
    with pytest.raises(ModelError, match=r"it holds generator_int8\.onnx"):
        resolve_model(folder, "auto", "fp32")
    assert resolve_model(folder, "auto", "int8")[0].name == "generator_int8.onnx"


def test_files_in_their_own_roles_open(exported_model, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(exported_model.folder, folder)
    for precision, name in (("fp32", "generator.onnx"), ("fp16", "generator_fp16.onnx")):
        assert resolve_model(folder, "onnx", precision)[0].name == name


def _edit_pt2(source: Path, target: Path, weights_from: Path) -> None:
    """``weights_from``'s program saved as ``target`` with ``source``'s metadata (ids and hashes)."""
    import json

    import torch

    from gantool.core.artifacts import PT2_METADATA_ENTRY

    extra = {PT2_METADATA_ENTRY: ""}
    with open(source, "rb") as f:
        torch.export.load(f, extra_files=extra)
    with open(weights_from, "rb") as f:
        program = torch.export.load(f)
    torch.export.save(program, target, extra_files={PT2_METADATA_ENTRY: extra[PT2_METADATA_ENTRY]})
    assert json.loads(extra[PT2_METADATA_ENTRY])["gantool.export_id"]


def test_a_pt2_whose_recorded_ids_were_edited_still_cannot_run_other_weights(checkpoint_factory, tmp_path):
    # Before the fix the recorded hash was trusted: another model's .pt2 with this folder's ids ran.
    from gantool.core.errors import GantoolError
    from gantool.export.exporter import export_generator
    from gantool.runtime.backends import load_backend

    ours = export_generator(checkpoint_factory("random", seed=1), tmp_path / "ours", formats=("pt2",), verify=False)
    theirs = export_generator(checkpoint_factory("random", seed=2), tmp_path / "theirs", formats=("pt2",), verify=False)
    assert load_backend(ours.out_dir, "cpu", "pt2").name == "pt2"  # its own weights open
    _edit_pt2(ours.out_dir / "generator.pt2", tmp_path / "forged.pt2", theirs.out_dir / "generator.pt2")
    shutil.copy(tmp_path / "forged.pt2", ours.out_dir / "generator.pt2")
    with pytest.raises(GantoolError, match="its weights do not match the hash it records"):
        load_backend(ours.out_dir, "cpu", "pt2")


def test_a_safetensors_whose_weights_were_swapped_is_refused(checkpoint_factory, tmp_path):
    import safetensors.torch

    from gantool.core.errors import GantoolError
    from gantool.export.exporter import export_generator
    from gantool.runtime.backends import load_backend

    ours = export_generator(checkpoint_factory("random", seed=1), tmp_path / "ours", formats=("onnx",), verify=False)
    path = ours.out_dir / "generator.safetensors"
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    first = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)
    tensors[first] = tensors[first] * 1.5  # other weights, the same recorded hash
    safetensors.torch.save_file(tensors, str(path), metadata=meta)
    with pytest.raises(GantoolError, match="its weights do not match the hash it records"):
        load_backend(ours.out_dir, "cpu", "eager")

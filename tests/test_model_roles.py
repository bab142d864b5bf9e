"""A model file is what its name says: a file renamed into another precision's role is refused
in one line when it opens, and a folder that holds only another precision's file says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from gantool.cli import cli
from gantool.core.artifacts import META_PRECISION, read_model_metadata, resolve_model
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


def _with_metadata_of(source: Path, weights_from: Path, target: Path) -> None:
    """``weights_from``'s model saved as ``target`` with ``source``'s metadata (its ids and hashes):
    what a user gets by editing one file's recorded ids to match another folder."""
    import zipfile

    import torch

    from gantool.core.artifacts import PT2_METADATA_ENTRY, TORCHSCRIPT_METADATA_ENTRY

    if source.suffix == ".onnx":
        model = onnx.load(str(weights_from))
        del model.metadata_props[:]
        model.metadata_props.extend(onnx.load(str(source)).metadata_props)
        onnx.save_model(model, str(target))
    elif source.name.endswith(".torchscript.pt"):
        extra = {TORCHSCRIPT_METADATA_ENTRY: ""}
        torch.jit.load(str(source), _extra_files=extra)
        torch.jit.save(torch.jit.load(str(weights_from)), str(target), _extra_files=extra)
    else:  # .pt2 and .aoti.pt2: a zip archive whose */extra/gantool_metadata.json is the metadata
        with zipfile.ZipFile(source) as ours:
            meta = next(ours.read(n) for n in ours.namelist() if n.endswith(f"/extra/{PT2_METADATA_ENTRY}"))
        with zipfile.ZipFile(weights_from) as theirs, zipfile.ZipFile(target, "w") as forged:
            for entry in theirs.infolist():
                data = meta if entry.filename.endswith(f"/extra/{PT2_METADATA_ENTRY}") else theirs.read(entry)
                forged.writestr(entry, data)
    assert read_model_metadata(target)["gantool.export_id"]  # the ids travelled


def _forged_folder(ours: Path, theirs: Path, name: str, tmp_path: Path) -> Path:
    """A copy of the export ``ours`` whose ``name`` holds ``theirs``'s weights under ``ours``'s metadata."""
    folder = tmp_path / "forged"
    shutil.copytree(ours, folder)
    _with_metadata_of(ours / name, theirs / name, tmp_path / name)
    shutil.copy(tmp_path / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def two_exports(tmp_path_factory):
    """Two exports (onnx, torchscript, pt2) of two differently seeded generators."""
    from conftest import random_generator, write_checkpoint
    from gantool.export.exporter import export_generator

    root = tmp_path_factory.mktemp("two_exports")
    return tuple(
        export_generator(
            write_checkpoint(root / f"seed{seed}.pt", random_generator(seed=seed)), root / f"export{seed}",
            formats=("onnx", "torchscript", "pt2"), verify=False,
        ).out_dir
        for seed in (1, 2)
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # the TorchScript case's load and save
@pytest.mark.parametrize(
    ("name", "backend"), [("generator.onnx", "onnx"), ("generator.onnx", "openvino"),
                          ("generator.torchscript.pt", "torchscript"), ("generator.pt2", "pt2")],
)  # fmt: skip
def test_a_file_whose_recorded_ids_were_edited_still_cannot_run_other_weights(two_exports, tmp_path, name, backend):
    # Before the fix the recorded ids were trusted: another model's file with this folder's ids ran
    # (only the .pt2 and the safetensors were checked against their content).
    from gantool.core.errors import GantoolError
    from gantool.runtime.backends import load_backend

    if backend == "openvino":
        pytest.importorskip("openvino", reason="the openvino extra is not installed")
    ours, theirs = two_exports
    assert load_backend(ours, "cpu", backend).name == backend  # its own weights open
    folder = _forged_folder(ours, theirs, name, tmp_path)
    with pytest.raises(GantoolError, match=r"its weights do not match the hash it records \(gantool\.file_weights_sha256\)"):
        load_backend(folder, "cpu", backend)


def test_every_model_file_of_an_export_records_its_own_weights_hash(two_exports):
    names = ("generator.onnx", "generator.torchscript.pt", "generator.pt2")
    ours, theirs = ({n: read_model_metadata(folder / n).get("gantool.file_weights_sha256", "") for n in names}
                    for folder in two_exports)  # fmt: skip
    assert all(len(h) == 64 for h in [*ours.values(), *theirs.values()]), (ours, theirs)
    assert all(ours[n] != theirs[n] for n in names), (ours, theirs)  # other weights, other hashes


def test_an_int8_file_whose_weights_were_edited_is_refused(modern_export, tmp_path):
    from onnx import numpy_helper

    from gantool.core.errors import GantoolError
    from gantool.runtime.backends import load_backend

    folder = tmp_path / "copy"
    shutil.copytree(modern_export.out_dir, folder)  # an export with generator_int8.onnx
    path = folder / "generator_int8.onnx"
    model = onnx.load(str(path))
    weight = next(t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 4)
    array = numpy_helper.to_array(weight).copy()
    array.flat[0] = array.flat[0] // 2 + 1  # one int8 weight changed, the recorded metadata kept
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    onnx.save_model(model, str(path))
    assert load_backend(modern_export.out_dir, "cpu", "onnx", precision="int8").precision == "int8"
    with pytest.raises(GantoolError, match="its weights do not match the hash it records"):
        load_backend(folder, "cpu", "onnx", precision="int8")


@pytest.mark.slow
def test_an_aoti_package_with_another_folders_ids_is_refused(checkpoint_factory, tmp_path):
    # AOTInductor compiles the weights into the package's library; the hash covers those constants.
    from gantool.core.errors import GantoolError
    from gantool.export.exporter import export_generator
    from gantool.runtime.backends import load_backend

    exports = [
        export_generator(
            checkpoint_factory("random", seed=seed), tmp_path / f"e{seed}", formats=("aoti",), verify=False
        ).out_dir
        for seed in (1, 2)
    ]
    assert load_backend(exports[0], "cpu", "aoti").name == "aoti"  # the recorded hash is its own, read back
    folder = _forged_folder(exports[0], exports[1], "generator.aoti.pt2", tmp_path)
    with pytest.raises(GantoolError, match="its weights do not match the hash it records"):
        load_backend(folder, "cpu", "aoti")


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

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
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner, Result
from onnx import numpy_helper
from PIL import Image

from conftest import TINY_CONFIG, briefly_trained_generator, rehashed, write_checkpoint
from gantool.cli import cli
from gantool.core.artifacts import META_EXPORT_ID, read_model_metadata
from gantool.core.errors import InputError, ModelError
from gantool.core.processing import mask_to_array, read_image
from gantool.export.exporter import export_generator
from gantool.inference.inpainter import Inpainter
from gantool.runtime.weights import file_weights_sha256, onnx_model_tensors
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


def _poisoned_onnx(source: Path, target_dir: Path, overflow: bool = False) -> Path:
    """A copy of ``source`` whose first convolution weights hold a NaN (or, with ``overflow``,
    are all finite but so large that the convolution's sums overflow to Inf)."""
    target_dir.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(source))
    weight = next(t for t in model.graph.initializer if numpy_helper.to_array(t).ndim == 4)
    array = numpy_helper.to_array(weight).copy()
    if overflow:
        array[...] = np.finfo(np.float32).max
    else:
        array.flat[0] = np.nan
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    own = next(p for p in model.metadata_props if p.key == "gantool.file_weights_sha256")
    own.value = file_weights_sha256(onnx_model_tensors(model))  # a consistent file: not a hash case
    path = target_dir / "generator.onnx"
    onnx.save(model, str(path))
    return path


def test_a_model_that_produces_nan_fails_the_image_and_writes_nothing(
    exported_model: ExportedModel, tmp_path: Path
) -> None:
    broken = _poisoned_onnx(exported_model.onnx, tmp_path / "broken", overflow=True)  # finite weights
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


def test_sixteen_bit_grey_with_alpha_is_called_what_it_is(tmp_path: Path) -> None:
    # Before the fix a 16-bit grey+alpha PNG was refused as "a 16-bit colour image".
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x12\x34\xff\xff" * 6 for _ in range(5))  # 6 x 5, grey 0x1234, opaque
    header = struct.pack(">IIBBBBB", 6, 5, 16, 4, 0, 0, 0)  # bit depth 16, colour type 4: grey + alpha
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    (tmp_path / "la16.png").write_bytes(png)
    if Image.open(tmp_path / "la16.png").mode not in ("RGB", "RGBA"):
        pytest.skip("this Pillow decodes 16-bit grey+alpha natively")
    with pytest.raises(InputError, match="a 16-bit grey image with an alpha channel") as refused:
        read_image(tmp_path / "la16.png", lossless=True)
    assert "colour" not in str(refused.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_a_fifo_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    result = inpaint(fifo, "--box", "1,1,2,2")
    assert result.exit_code == 1 and "not a regular file" in result.output


# --------------------------------------------------------------------- whole exports


# The module's exports, each made once, when a test first asks for it (a test run alone, as the
# mutation check does, pays only for its own): a: ONNX + fp16 + TorchScript of a.pt; b: ONNX of
# b.pt; c: ONNX of a.pt. The checkpoints are run/checkpoints/{a,b}.pt.
_EXPORTS = {
    "a": ("a.pt", ("onnx", "torchscript"), True),
    "b": ("b.pt", ("onnx",), False),
    "c": ("a.pt", ("onnx",), False),
}


@dataclass(frozen=True)
class SharedExports:
    """Exports shared by this module; a test that changes a folder works on a copy (``copy``)."""

    root: Path

    def get(self, name: str) -> Path:
        """Export ``name`` (made now if no test made it yet); read it, do not change it."""
        if not (self.root / name).is_dir():
            checkpoint, formats, fp16 = _EXPORTS[name]
            export_generator(self.root / "run" / "checkpoints" / checkpoint, self.root / name, formats=formats,
                             fp16=fp16, verify=False)  # fmt: skip
        return self.root / name

    def copy(self, tmp_path: Path, *names: str) -> list[Path]:
        """Fresh copies of the run (its checkpoints) and of the exports ``names`` under ``tmp_path``."""
        shutil.copytree(self.root / "run", tmp_path / "run")
        for name in names:
            shutil.copytree(self.get(name), tmp_path / name)
        return [tmp_path / name for name in names]


@pytest.fixture(scope="module")
def shared_exports(tmp_path_factory: pytest.TempPathFactory) -> SharedExports:
    """The checkpoints a.pt and b.pt of two briefly trained generators; their exports on demand."""
    root = tmp_path_factory.mktemp("shared_exports")
    run = root / "run"
    write_checkpoint(run / "checkpoints" / "a.pt", briefly_trained_generator(TINY_CONFIG, seed=1, steps=1))
    write_checkpoint(run / "checkpoints" / "b.pt", briefly_trained_generator(TINY_CONFIG, seed=2, steps=1))
    return SharedExports(root)


def test_re_export_removes_the_older_exports_files(shared_exports: SharedExports, tmp_path: Path) -> None:
    (out,) = shared_exports.copy(tmp_path, "a")  # export A: ONNX, fp16 and TorchScript
    assert {"generator_fp16.onnx", "generator.torchscript.pt"} <= {p.name for p in out.iterdir()}
    second = tmp_path / "run" / "checkpoints" / "b.pt"
    with pytest.raises(InputError, match="refusing to overwrite"):
        export_generator(second, out, formats=("onnx",), verify=False)
    export_generator(second, out, formats=("onnx",), verify=False, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["export_report.json", "generator.onnx", "generator.safetensors"]
    hashes = {read_model_metadata(p)["gantool.weights_sha256"] for p in out.glob("generator.*")}
    assert len(hashes) == 1


def test_a_folder_that_mixes_exports_is_refused_naming_the_files(shared_exports: SharedExports, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(shared_exports.get("b"), mixed)
    shutil.copy(shared_exports.get("a") / "generator.torchscript.pt", mixed)
    with pytest.raises(
        ModelError, match=r"mixes files of different exports.*generator\.onnx.*generator\.torchscript\.pt"
    ):
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


# ------------------------------------------------------- one model per folder (issue #23)


def test_every_file_of_an_export_carries_one_export_id_and_a_re_export_the_same(
    shared_exports: SharedExports, tmp_path: Path
) -> None:
    first = shared_exports.get("a")  # ONNX, fp16 and TorchScript of a.pt
    checkpoint = shared_exports.root / "run" / "checkpoints" / "a.pt"
    again = export_generator(checkpoint, tmp_path / "y", formats=("onnx", "torchscript"), fp16=True, verify=False)
    files = [p for p in first.iterdir() if p.suffix != ".json"]
    assert len(files) == 4  # generator.onnx, generator_fp16.onnx, generator.torchscript.pt, generator.safetensors
    ids = {read_model_metadata(p)[META_EXPORT_ID] for p in files}
    report = json.loads((first / "export_report.json").read_text())["metadata"][META_EXPORT_ID]
    assert len(ids) == 1 and ids == {report} and len(report) == 32
    assert again.metadata[META_EXPORT_ID] == report  # deterministic: equal exports, equal files
    other = read_model_metadata(shared_exports.get("c") / "generator.onnx")  # ONNX only, of a.pt
    assert other[META_EXPORT_ID] != report  # same weights, another export


def test_a_foreign_model_file_without_metadata_in_an_export_folder_is_refused_naming_it(
    shared_exports: SharedExports, tmp_path: Path
) -> None:
    a, b = shared_exports.copy(tmp_path, "a", "b")
    foreign = onnx.load(str(b / "generator.onnx"))
    del foreign.metadata_props[:]  # model B with its metadata removed
    onnx.save(foreign, str(a / "generator.onnx"))
    with pytest.raises(ModelError, match=r"generator\.onnx carries no gantool metadata, so it is not part of"):
        Inpainter(a, provider="cpu")
    for model in (a, a / "generator.onnx", a / "generator.torchscript.pt"):
        result = inpaint(photo(tmp_path), "--box", "1,1,4,4", "--model", model, "--overwrite")
        assert result.exit_code == 1 and f"{a / 'generator.onnx'} carries no gantool metadata" in result.output
        assert result.output.count("\n") == 1 and "Traceback" not in result.output, result.output  # one line


def test_a_file_of_another_export_of_the_same_weights_is_refused(shared_exports: SharedExports, tmp_path: Path) -> None:
    shutil.copytree(shared_exports.get("c"), tmp_path / "x")  # ONNX of a.pt
    shutil.copy(shared_exports.get("a") / "generator.torchscript.pt", tmp_path / "x")  # the weights hashes agree
    with pytest.raises(ModelError, match=r"mixes files of different exports \(export ids differ"):
        Inpainter(tmp_path / "x", provider="cpu", backend="torchscript")


def test_overwrite_never_deletes_a_file_gantool_did_not_write(shared_exports: SharedExports, tmp_path: Path) -> None:
    (a,) = shared_exports.copy(tmp_path, "a")
    stranger = a / "generator.pt2"
    stranger.write_bytes(os.urandom(4096))  # random bytes under a name from the export table
    before = {p.name: p.read_bytes() for p in a.iterdir()}
    checkpoint = tmp_path / "run" / "checkpoints" / "b.pt"
    result = invoke("export", checkpoint, "-o", a, "--onnx", "--no-verify", "--overwrite")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"refusing to replace {stranger}" in result.output
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before
    stranger.unlink()  # once it is gone, --overwrite replaces the older export's files
    assert invoke("export", checkpoint, "-o", a, "--onnx", "--no-verify", "--overwrite").exit_code == 0
    assert sorted(p.name for p in a.iterdir()) == ["export_report.json", "generator.onnx", "generator.safetensors"]


def test_a_killed_export_is_completed_by_the_next_reader(shared_exports: SharedExports, tmp_path: Path) -> None:
    """A real `gantool export --overwrite`, SIGKILLed after the first file of its commit went in
    (two models in the folder for a moment): the next Inpainter completes it and runs model B."""
    import subprocess
    import sys

    from gantool.core.fileio import JOURNAL_NAME, KILL_AT_ENV

    (a,) = shared_exports.copy(tmp_path, "a")
    checkpoint = tmp_path / "run" / "checkpoints" / "b.pt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "toolkit"), KILL_AT_ENV: "install"}
    command = [sys.executable, "-m", "gantool", "export", str(checkpoint), "-o", str(a), "--onnx", "--no-verify",
               "--overwrite"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr
    assert (a / JOURNAL_NAME).is_file()  # killed mid-commit
    Inpainter(a, provider="cpu")  # completes the commit, then opens one whole export
    names = sorted(p.name for p in a.iterdir())
    assert names == ["export_report.json", "generator.onnx", "generator.safetensors"]
    assert len({read_model_metadata(a / n)[META_EXPORT_ID] for n in names if not n.endswith(".json")}) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --------------------------------------------------------- non-finite weights, every backend


def _inf_checkpoint(tmp_path: Path) -> Path:
    generator = briefly_trained_generator(TINY_CONFIG, steps=1)
    state = {k: v.clone() for k, v in generator.state_dict().items()}
    name = next(k for k in state if k.endswith("running_mean"))
    state[name].view(-1)[0] = float("inf")  # Inf in a BatchNorm running mean
    path = tmp_path / "run" / "checkpoints" / "last.pt"
    save_checkpoint(path, {"model_config": TINY_CONFIG.to_dict(), "generator": state, "step": 1, "phase": "g"})
    return path


@pytest.mark.parametrize("backend", ["eager", "safetensors", "onnx", "torchscript", "pt2"])
def test_non_finite_weights_are_refused_by_every_backend(
    exported_model: ExportedModel, tmp_path: Path, backend: str
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    if backend == "eager":
        model = _inf_checkpoint(tmp_path)
    elif backend == "safetensors":
        import safetensors.numpy

        with safetensors.safe_open(str(exported_model.safetensors), framework="numpy") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            meta = f.metadata()
        name = next(k for k in tensors if k.endswith("running_mean"))
        tensors[name] = tensors[name].copy()
        tensors[name].flat[0] = np.inf
        model = folder / "generator.safetensors"
        safetensors.numpy.save_file(tensors, str(model), metadata=rehashed(meta, tensors))  # consistent: not a hash case
    elif backend == "onnx":
        model = _poisoned_onnx(exported_model.onnx, folder)
    else:
        if backend == "pt2":
            checkpoint = tmp_path / "ok.pt"
            write_checkpoint(checkpoint, briefly_trained_generator(TINY_CONFIG, steps=1))
            export_generator(checkpoint, tmp_path / "ok", formats=(backend,), verify=False)
            source = tmp_path / "ok" / "generator.pt2"
        else:
            source = exported_model.torchscript  # the session's export: TorchScript is read, not changed
        model = folder / source.name
        if backend == "pt2":
            program = torch.export.load(str(source))
            with torch.no_grad():
                next(t for t in program.state_dict.values() if t.is_floating_point()).view(-1)[0] = float("inf")
            torch.export.save(program, str(model))
        else:
            with warnings.catch_warnings():  # local: TorchScript's deprecation notice
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                module = torch.jit.load(str(source))
                with torch.no_grad():
                    next(p for p in module.parameters()).view(-1)[0] = float("inf")
                torch.jit.save(module, str(model))
    with pytest.raises(ModelError, match="non-finite weights"):
        Inpainter(model, provider="cpu", backend="eager" if backend == "safetensors" else "auto")
    result = inpaint(photo(tmp_path), "--box", "1,1,4,4", "--model", model)
    assert result.exit_code == 1 and "non-finite weights" in result.output and result.output.count("\n") == 1


# ------------------------------------------------------------ clear lines (issue #23, item 7)


def test_a_folder_with_only_the_int8_model_runs_with_precision_int8(
    exported_model: ExportedModel, tmp_path: Path
) -> None:
    folder = tmp_path / "int8only"
    folder.mkdir()
    model = onnx.load(str(exported_model.onnx))
    for prop in model.metadata_props:
        if prop.key == "gantool.precision":
            prop.value = "int8"  # an fp32 graph under the int8 name: enough to find and open it
    onnx.save(model, str(folder / "generator_int8.onnx"))
    result = inpaint(photo(tmp_path), "--box", "1,1,4,4", "--model", folder, "--precision", "int8")
    assert result.exit_code == 0, result.output
    result = inpaint(photo(tmp_path), "--box", "1,1,4,4", "--model", folder, "--precision", "fp16", "--overwrite")
    assert result.exit_code == 1 and "expected generator_fp16.onnx or generator.onnx" in result.output, result.output


def test_a_truncated_torchscript_file_is_called_truncated(exported_model: ExportedModel, tmp_path: Path) -> None:
    data = exported_model.torchscript.read_bytes()
    cut = tmp_path / "cut" / "generator.torchscript.pt"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) // 2])
    for model in (cut, cut.parent):
        result = inpaint(photo(tmp_path), "--box", "1,1,4,4", "--model", model)
        assert result.exit_code == 1 and f"{cut} is truncated or damaged" in result.output, result.output
        assert "Invalid argument" not in result.output and "miniz" not in result.output


class _RunsAShell:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_blocked_pickle_gives_the_cause_never_the_weights_only_false_advice(tmp_path: Path) -> None:
    hostile = tmp_path / "hostile.pt"
    torch.save({"step": _RunsAShell()}, hostile)
    for command in (("info", hostile), ("inpaint", photo(tmp_path), "--box", "1,1,4,4", "--model", hostile)):
        result = invoke(*command)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert "system" in result.output and "blocked" in result.output  # the refused global
        assert "weights_only" not in result.output and "will likely succeed" not in result.output


def test_a_run_whose_export_is_older_than_its_last_checkpoint_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    generator = briefly_trained_generator(TINY_CONFIG, steps=1)
    checkpoint = write_checkpoint(run / "checkpoints" / "last.pt", generator, step=8)
    export_generator(checkpoint, run / "export", formats=("onnx",), verify=False)
    write_checkpoint(checkpoint, generator, step=11)  # training went on
    os.utime(checkpoint, (os.path.getmtime(run / "export" / "generator.onnx") + 5,) * 2)
    with caplog.at_level("WARNING", logger="gantool.core.artifacts"):
        Inpainter(run, provider="cpu")
        Inpainter(run, provider="cpu")
        Inpainter(run, provider="cpu", backend="eager")  # the export's safetensors: the same folder, no new line
    warnings = [r.getMessage() for r in caplog.records if "is from training step" in r.getMessage()]
    assert len(warnings) == 1 and "step 8" in warnings[0] and "at step 11" in warnings[0], caplog.text


def test_an_export_older_than_the_highest_step_checkpoint_warns_when_last_pt_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's newest checkpoint is its highest step_N.pt once last.pt is gone: an export older
    than that is still named as stale."""
    run = tmp_path / "run"
    generator = briefly_trained_generator(TINY_CONFIG, steps=1)
    checkpoint = write_checkpoint(run / "checkpoints" / "step_8.pt", generator, step=8)
    export_generator(checkpoint, run / "export", formats=("onnx",), verify=False)
    newer = write_checkpoint(run / "checkpoints" / "step_11.pt", generator, step=11)
    os.utime(newer, (os.path.getmtime(run / "export" / "generator.onnx") + 5,) * 2)
    with caplog.at_level("WARNING", logger="gantool.core.artifacts"):
        Inpainter(run, provider="cpu")
    warnings = [r.getMessage() for r in caplog.records if "is from training step" in r.getMessage()]
    assert len(warnings) == 1 and "step 8" in warnings[0] and "step_11.pt is at step 11" in warnings[0], caplog.text

"""The deployment formats of today: generator.pt2 (torch.export), generator.aoti.pt2 (AOTInductor),
generator_int8.onnx (static QDQ), bf16 autocast, and TorchScript kept as legacy without warnings.

The fast tier shares one export without AOTInductor (``modern_export`` in conftest.py); the
compile (about a minute) runs once per session in the slow tier (``aoti_export``). The checks
AotiBackend makes on a package's metadata before it loads anything run in the fast tier on a
stand-in package (:func:`stand_in_aoti_package`) and in the slow tier on the compiled one.
"""

from __future__ import annotations

import json
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import TINY_CONFIG, briefly_trained_generator, write_checkpoint
from gantool.cli import cli
from gantool.core.artifacts import KIND_AOTI, KIND_PT2, model_kind, read_model_metadata, resolve_model
from gantool.core.errors import InputError, ModelError
from gantool.export.exporter import check_options, export_generator
from gantool.export.parity import compare, default_cases
from gantool.export.quantize import QuantizationError
from gantool.runtime.backends import (
    AotiBackend,
    EagerBackend,
    OnnxBackend,
    Pt2Backend,
    TorchScriptBackend,
    load_backend,
)
from gantool.runtime.providers import check_aoti_package, cpu_isa_flags
from gantool.training import loop as train_module
from gantool.training.checkpoint import load_checkpoint, weights_sha256

CASES = default_cases(TINY_CONFIG)
CASE_IDS = [c.label.replace(" ", "-") for c in CASES]
BF16 = pytest.mark.skipif(not train_module.cpu_has_native_bf16(), reason="this CPU has no native bf16")


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _batch(n: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    image = rng.random((n, 3, height, width), dtype=np.float32)
    mask = np.zeros((n, 1, height, width), np.float32)
    mask[..., height // 4 : height // 2 + 3, width // 3 : width // 2 + 5] = 1.0
    return image, mask


def stand_in_aoti_package(pt2: Path, target: Path, **changes: str) -> Path:
    """What an AOTInductor CPU package of ``pt2``'s export looks like before it loads: the .pt2's
    entries plus an ``aotinductor`` library entry (no code: nothing here loads it), and the metadata
    an AOTI export adds (compiled here, for this torch and this CPU), changed by ``changes``."""
    extra = {"aoti_device": "cpu", "aoti_cpu_flags": " ".join(cpu_isa_flags()), **changes}
    with zipfile.ZipFile(pt2) as source, zipfile.ZipFile(target, "w") as copy:
        root = source.namelist()[0].split("/", 1)[0]
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/extra/gantool_metadata.json"):
                meta = json.loads(data)
                meta.update({f"gantool.{k}": v for k, v in extra.items()})
                data = json.dumps(meta).encode()
            copy.writestr(info, data)
        copy.writestr(f"{root}/data/aotinductor/model/stand_in.wrapper.so", b"not a library")
    return target


@pytest.fixture(params=["stand-in", pytest.param("compiled", marks=pytest.mark.slow)])
def aoti_package(request, tmp_path) -> Path:
    """An AOTInductor package of the session's checkpoint: the stand-in (fast) or the compiled one (slow).
    Each asks only for its own export, so the slow tier does not build the fast tier's."""
    if request.param == "compiled":
        return request.getfixturevalue("aoti_export").out_dir / "generator.aoti.pt2"
    folder = tmp_path / "stand_in"
    shutil.copytree(request.getfixturevalue("modern_export").out_dir, folder)
    return stand_in_aoti_package(folder / "generator.pt2", folder / "generator.aoti.pt2")


# ------------------------------------------------------------------------ the export


def test_every_format_is_written_with_the_same_metadata(modern_export):
    out = modern_export.out_dir
    names = {p.name for p in out.iterdir()}
    assert {"generator.onnx", "generator_int8.onnx", "generator.pt2"} <= names
    assert "generator.torchscript.pt" not in names and "generator.aoti.pt2" not in names  # not asked for
    onnx_meta = read_model_metadata(out / "generator.onnx")
    pt2_meta = read_model_metadata(out / "generator.pt2")
    # Each also records its own weights' hash (ONNX initializers, the .pt2's folded tensors), checked when it opens.
    assert len(pt2_meta.pop("gantool.file_weights_sha256")) == len(onnx_meta.pop("gantool.file_weights_sha256")) == 64
    assert pt2_meta == onnx_meta
    int8_meta = read_model_metadata(out / "generator_int8.onnx")
    assert int8_meta["gantool.precision"] == "int8"
    assert int8_meta["gantool.weights_sha256"] == onnx_meta["gantool.weights_sha256"]
    assert isinstance(json.loads(int8_meta["gantool.float_nodes"]), list)
    assert "synthetic" in int8_meta["gantool.calibration"]  # the checkpoint names no data folder
    state = load_checkpoint(modern_export.checkpoint)
    assert onnx_meta["gantool.weights_sha256"] == weights_sha256(state["generator"])


@pytest.mark.slow
def test_the_aoti_package_carries_the_same_metadata_and_where_it_was_compiled(aoti_export):
    out = aoti_export.out_dir
    assert {"generator.onnx", "generator_int8.onnx", "generator.pt2", "generator.aoti.pt2"} <= {
        p.name for p in out.iterdir()
    }
    onnx_meta = read_model_metadata(out / "generator.onnx")
    pt2_meta = read_model_metadata(out / "generator.pt2")
    hashes = {m.pop("gantool.file_weights_sha256") for m in (onnx_meta, pt2_meta)}
    assert pt2_meta == onnx_meta
    aoti_meta = read_model_metadata(out / "generator.aoti.pt2")
    assert len(aoti_meta["gantool.file_weights_sha256"]) == 64  # its compiled constants'
    assert aoti_meta["gantool.file_weights_sha256"] not in hashes
    assert {k: aoti_meta[k] for k in onnx_meta} == onnx_meta
    assert aoti_meta["gantool.aoti_device"] == "cpu" and aoti_meta["gantool.torch_version"] == torch.__version__
    assert aoti_meta["gantool.aoti_cpu_flags"].split() == cpu_isa_flags()  # what -march=native compiled for
    assert json.loads(aoti_meta["gantool.compile_flags"]) == {"freezing": True}
    assert model_kind(out / "generator.aoti.pt2") == KIND_AOTI
    assert resolve_model(out, "aoti") == (out / "generator.aoti.pt2", "aoti")
    backends = aoti_export.report["backends"]
    assert backends["aoti-cpu"]["passed"] and backends["aoti-cpu"]["known_exact"]
    assert len(backends["aoti-cpu"]["cases"]) == len(CASES) and backends["aoti-cpu"]["max_abs"] <= 1e-4
    data = json.loads(invoke("info", out / "generator.aoti.pt2", "--json").output)
    assert data["kind"] == "aoti" and data["precision"] == "fp32" and data["metadata"]["gantool.aoti_device"] == "cpu"


def test_model_kind_tells_pt2_from_aoti(aoti_package):
    out = aoti_package.parent
    assert model_kind(out / "generator.pt2") == KIND_PT2
    assert model_kind(aoti_package) == KIND_AOTI
    assert resolve_model(out / "generator.pt2") == (out / "generator.pt2", "pt2")
    assert resolve_model(out, "aoti") == (aoti_package, "aoti")
    assert resolve_model(out)[1] == "onnx"  # auto: onnx first, as before


def test_export_sweep_covers_every_format_with_its_gate(modern_export):
    backends = modern_export.report["backends"]
    assert modern_export.report["passed"]
    for name in ("pt2", "onnxruntime-cpu-int8", "onnxruntime-cpu"):
        assert backends[name]["passed"] and backends[name]["known_exact"], name
        assert len(backends[name]["cases"]) == len(CASES)
    assert backends["pt2"]["max_abs"] <= 1e-4
    assert backends["onnxruntime-cpu-int8"]["gate_psnr_hole"] == 35.0
    assert backends["onnxruntime-cpu-int8"]["min_psnr_hole_uint8"] >= 35.0
    if train_module.cpu_has_native_bf16():
        assert backends["pt2-bf16"]["passed"] and backends["eager-bf16"]["gate_psnr_hole"] == 35.0
    report = json.loads((modern_export.out_dir / "export_report.json").read_text())
    assert any(note.startswith("int8: calibrated on") and "left in float" in note for note in report["notes"])


def test_info_says_the_precision(modern_export):
    result = invoke("info", modern_export.out_dir / "generator_int8.onnx")
    assert result.exit_code == 0 and "runs in int8" in result.output, result.output
    result = invoke("info", modern_export.out_dir / "generator.pt2", "--json")
    data = json.loads(result.output)
    assert data["kind"] == "pt2" and data["precision"] == "fp32", data


def test_options_of_the_new_formats():
    assert check_options(["aoti"], None, False, 1e-4) == ("aoti", "pt2")  # aoti brings pt2 along
    assert check_options(["onnx"], None, False, 1e-4, int8=True) == ("onnx",)
    with pytest.raises(InputError, match="--int8 applies only to onnx"):
        check_options(["pt2"], None, False, 1e-4, int8=True)


def test_calib_and_gate_options_fail_in_one_line(checkpoint_factory, tmp_path, caplog):
    checkpoint = checkpoint_factory("random")
    result = invoke("export", checkpoint, "--pt2", "--calib", tmp_path, "-o", tmp_path / "out")
    assert result.exit_code != 0 and "--calib applies only to --int8" in result.output
    (tmp_path / "empty").mkdir()
    # Both are refused before the export starts, naming the option (an empty folder used to be
    # found only after the ONNX export, by the calibration's "no readable images in ...").
    empty = ("--calib folder", "holds no image files")
    for calib, fragment in ((tmp_path / "none", "--calib must be a folder"), (tmp_path / "empty", empty[1])):
        result = invoke("export", checkpoint, "--onnx", "--int8", "--calib", calib, "-o", tmp_path / "out")
        assert result.exit_code != 0 and "Traceback" not in result.output and fragment in result.output
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
        assert calib.name != "empty" or empty[0] in result.output
    caplog.set_level("INFO", logger="gantool.export.exporter")
    with pytest.raises(InputError, match="holds no image files"):
        export_generator(checkpoint, tmp_path / "out2", formats=["onnx"], int8=True, calib=tmp_path / "empty")
    assert not [r for r in caplog.records if r.getMessage().startswith("exporting ")]  # no export began


def test_int8_below_its_gate_writes_nothing_and_gives_the_figure(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "ck.pt", briefly_trained_generator(TINY_CONFIG, seed=9, steps=1))
    out = tmp_path / "out"
    with pytest.raises(QuantizationError, match=r"worst hole PSNR against fp32 \d+\.\d dB with all convolutions"):
        export_generator(checkpoint, out, formats=["onnx"], int8=True, int8_min_psnr=500, verify=False)
    assert not out.exists() or list(out.iterdir()) == []
    result = invoke("export", checkpoint, "--onnx", "--int8", "--int8-min-psnr", "500", "-o", out)
    assert result.exit_code == 1 and "left in float" in result.output and "Traceback" not in result.output
    assert not out.exists() or list(out.iterdir()) == []


def test_int8_calibrates_on_a_calib_folder(tmp_path):
    from PIL import Image

    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray((rng.random((40, 48, 3)) * 255).astype(np.uint8)).save(calib / f"c{i}.png")
    checkpoint = write_checkpoint(tmp_path / "ck.pt", briefly_trained_generator(TINY_CONFIG, seed=8, steps=1))
    result = invoke("export", checkpoint, "--onnx", "--int8", "--calib", calib, "-o", tmp_path / "out", "--no-verify")
    assert result.exit_code == 0, result.output
    # The calibration folder is named by its last part: a shipped file carries no path of this machine.
    assert "3 images from <path>/calib" in result.output and str(calib) not in result.output
    meta = read_model_metadata(tmp_path / "out" / "generator_int8.onnx")
    assert meta["gantool.calibration"].startswith("3 images from <path>/calib")


# ------------------------------------------------------------------------ the backends


@pytest.mark.parametrize("name", ["pt2", pytest.param("aoti", marks=pytest.mark.slow)])
def test_pt2_and_aoti_backends_match_eager(request, modern_export, name):
    export = request.getfixturevalue("aoti_export") if name == "aoti" else modern_export
    eager = EagerBackend(export.checkpoint, "cpu")
    image, mask = _batch(3, 20, 44)  # unseen batch and a non-square size
    backend = load_backend(export.out_dir, "cpu", name)
    result = compare(backend.run(image, mask), eager.run(image, mask), image, mask)
    assert result["known_exact"] and result["max_abs"] <= 1e-4, (name, result)
    assert backend.precision == "fp32" and backend.name == name


@BF16
@pytest.mark.parametrize("name", ["pt2", "eager"])
def test_bf16_runs_the_torch_backends_under_autocast(modern_export, name):
    backend = load_backend(modern_export.out_dir, "cpu", name, precision="bf16")
    assert backend.precision == "bf16" and backend.bf16
    image, mask = _batch(2, 36, 44)
    out = backend.run(image, mask)
    ref = EagerBackend(modern_export.checkpoint, "cpu").run(image, mask)
    result = compare(out, ref, image, mask)
    assert result["known_exact"] and result["psnr_hole_uint8"] >= 35.0, result
    assert result["max_abs"] > 0  # really bf16 numerics, not fp32
    # auto: OpenVINO where it runs (AUTO_OPENVINO_PRECISIONS), else a torch backend
    from gantool.runtime.choice import auto_openvino

    expected = "openvino" if auto_openvino("cpu", "bf16") else "pt2"
    assert load_backend(modern_export.out_dir, "cpu", precision="bf16").name == expected


def test_bf16_is_refused_with_the_reason_where_it_is_not_native(aoti_package, monkeypatch):
    monkeypatch.setattr(train_module, "amp_supported", lambda device: False)
    with pytest.raises(InputError, match="no native bf16"):
        load_backend(aoti_package.parent, "cpu", "pt2", precision="bf16")
    for backend in ("onnx", "aoti"):
        with pytest.raises(InputError, match="bf16 needs the openvino or pt2 or eager backend"):
            load_backend(aoti_package.parent, "cpu", backend, precision="bf16")


def test_int8_is_picked_only_when_asked(modern_export):
    auto = load_backend(modern_export.out_dir, "cpu")
    assert auto.path.name == "generator.onnx" and auto.precision == "fp32"
    int8 = load_backend(modern_export.out_dir, "cpu", precision="int8")
    from gantool.runtime.choice import auto_openvino

    # OpenVINO where it runs (AUTO_OPENVINO_PRECISIONS: measured faster at int8), else ONNX Runtime
    assert int8.name == ("openvino" if auto_openvino("cpu", "int8") else "onnx")
    assert isinstance(int8, OnnxBackend) or int8.name == "openvino"
    assert int8.path.name == "generator_int8.onnx" and int8.precision == "int8"
    image, mask = _batch(1, 32, 32)
    result = compare(int8.run(image, mask), auto.run(image, mask), image, mask)
    assert result["known_exact"] and result["psnr_hole_uint8"] >= 35.0
    with pytest.raises(InputError, match="int8 needs the openvino or onnx backend"):
        load_backend(modern_export.out_dir, "cpu", "pt2", precision="int8")


def _with_metadata(package: Path, target: Path, **changes: str) -> Path:
    """A copy of an AOTInductor package whose gantool metadata entry says something else."""
    with zipfile.ZipFile(package) as source, zipfile.ZipFile(target, "w") as copy:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/extra/gantool_metadata.json"):
                meta = json.loads(data)
                meta.update({f"gantool.{k}": v for k, v in changes.items()})
                data = json.dumps(meta).encode()
            copy.writestr(info, data)
    return target


def test_aoti_package_for_another_torch_or_device_is_refused(aoti_package, tmp_path):
    package = aoti_package
    older = _with_metadata(package, tmp_path / "old.aoti.pt2", torch_version="2.9.0")
    with pytest.raises(ModelError, match="compiled with torch 2.9.0, this is torch"):
        AotiBackend(older, "cpu")
    gpu = _with_metadata(package, tmp_path / "gpu.aoti.pt2", aoti_device="cuda")
    with pytest.raises(ModelError, match="compiled for cuda, not cpu"):
        AotiBackend(gpu, "cpu")
    from PIL import Image

    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(tmp_path / "x.png")
    result = invoke("inpaint", tmp_path / "x.png", "--model", older, "--backend", "aoti", "--box", "1,1,4,4")
    assert result.exit_code == 1 and "Traceback" not in result.output
    expected = (
        f"Error: old.aoti.pt2 was compiled with torch 2.9.0, this is torch {torch.__version__}: "
        "re-export it with `gantool export --aoti` on this machine"
    )
    assert [line for line in result.output.splitlines() if line.startswith("Error")] == [expected]


def test_corrupt_pt2_files_raise_model_errors(tmp_path):
    bad = tmp_path / "generator.pt2"
    bad.write_bytes(b"PK\x03\x04 not really a zip" * 20)
    with pytest.raises(ModelError):
        Pt2Backend(bad, "cpu")
    with pytest.raises(ModelError):
        read_model_metadata(bad)


def test_inpaint_startup_line_says_the_precision(modern_export, tmp_path):
    from PIL import Image

    Image.fromarray(np.full((20, 24, 3), 120, np.uint8)).save(tmp_path / "a.png")
    result = invoke("inpaint", tmp_path / "a.png", "--box", "4,4,8,8", "--model", modern_export.out_dir,
                    "--precision", "int8", "--provider", "cpu")  # fmt: skip
    assert result.exit_code == 0, result.output
    # --backend auto runs the int8 file on OpenVINO on the CPU where openvino is installed
    # (AUTO_OPENVINO_PRECISIONS), else on ONNX Runtime
    from gantool.core.constants import AUTO_OPENVINO_PRECISIONS
    from gantool.runtime.openvino import openvino_available

    runtime = "openvino" if "int8" in AUTO_OPENVINO_PRECISIONS and openvino_available() else "onnx"
    assert f"backend: {runtime}; precision: int8 (as requested); blend: poisson; model:" in result.output
    result = invoke("inpaint", tmp_path / "a.png", "--box", "4,4,8,8", "--model", modern_export.out_dir,
                    "--backend", "pt2", "--provider", "cpu", "--overwrite")  # fmt: skip
    assert result.exit_code == 0 and "backend: pt2; precision: fp32 (" in result.output, result.output


@pytest.mark.slow
def test_inpaint_startup_line_says_the_aoti_backend(aoti_export, tmp_path):
    from PIL import Image

    Image.fromarray(np.full((20, 24, 3), 120, np.uint8)).save(tmp_path / "a.png")
    result = invoke("inpaint", tmp_path / "a.png", "--box", "4,4,8,8", "--model", aoti_export.out_dir,
                    "--backend", "aoti", "--provider", "cpu")  # fmt: skip
    assert result.exit_code == 0 and "backend: aoti; precision: fp32 (" in result.output, result.output


# ------------------------------------------------------------------ TorchScript, legacy


def test_gantool_torchscript_calls_raise_no_deprecation_warning(checkpoint_factory, tmp_path):
    checkpoint = checkpoint_factory("random")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_generator(checkpoint, tmp_path / "out", formats=["torchscript"], cases=CASES[:2])
        backend = TorchScriptBackend(result.paths["torchscript"], "cpu")
        backend.run(*_batch(1, 16, 16))
    jit = [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning)) and "jit" in str(w.message)]
    assert jit == [], [str(w.message) for w in jit]
    shutil.rmtree(tmp_path / "out")


def test_aoti_cpu_package_needs_the_compiling_cpus_instructions(aoti_package, tmp_path):
    # Inductor compiles CPU packages with -march=native: on a CPU without (say) AVX-512 the
    # package would die with SIGILL, so it is refused first, in one line. Found before: no check.
    package = aoti_package
    metadata = read_model_metadata(package)
    here = cpu_isa_flags()
    check_aoti_package(package, metadata, torch.device("cpu"))  # compiled here: fine
    other = {**metadata, "gantool.aoti_cpu_flags": " ".join([*here, "avx10_2", "amx_fp8"])}
    with pytest.raises(ModelError, match=r"compiled for a CPU with amx_fp8, avx10_2, which this CPU lacks: re-export"):
        check_aoti_package(package, other, torch.device("cpu"))
    check_aoti_package(package, other, torch.device("cpu"), cpu_flags=[])  # nothing known here: not refused
    older = {k: v for k, v in metadata.items() if k != "gantool.aoti_cpu_flags"}
    check_aoti_package(package, older, torch.device("cpu"))  # packages from before the key: not refused

    many = _with_metadata(package, tmp_path / "many.aoti.pt2", aoti_cpu_flags=" ".join(f"isa{i}" for i in range(9)))
    from PIL import Image

    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(tmp_path / "x.png")
    result = invoke("inpaint", tmp_path / "x.png", "--model", many, "--backend", "aoti", "--box", "1,1,4,4")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "isa0, isa1, isa2, isa3, isa4, isa5 and 3 more, which this CPU lacks" in result.output


def test_cpu_isa_flags_reads_x86_and_arm_cpuinfo():
    x86 = "processor\t: 0\nflags\t\t: fpu vme sse sse2 avx2 avx512f amx_tile fma pni hypervisor\n"
    assert cpu_isa_flags(x86) == ["amx_tile", "avx2", "avx512f", "fma", "sse", "sse2"]
    arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU part\t: 0xd4f\n"
    assert cpu_isa_flags(arm) == ["asimd", "bf16", "fp", "sve"]
    assert cpu_isa_flags("model name : something\n") == []


def test_a_relative_calib_folder_is_recorded_by_name_only(tmp_path, monkeypatch):
    # Before the fix: "3 images from ../clients/acme/photos" in the int8 file and the report.
    from PIL import Image

    photos = tmp_path / "clients" / "acme" / "photos"
    photos.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray((rng.random((40, 48, 3)) * 255).astype(np.uint8)).save(photos / f"c{i}.png")
    checkpoint = write_checkpoint(tmp_path / "ck.pt", briefly_trained_generator(TINY_CONFIG, seed=8, steps=1))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    result = invoke("export", checkpoint, "--onnx", "--int8", "--calib", "../clients/acme/photos", "-o", "out",
                    "--no-verify")  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = read_model_metadata(Path("out/generator_int8.onnx"))
    assert meta["gantool.calibration"].startswith("3 images from <path>/photos"), meta["gantool.calibration"]
    report = Path("out/export_report.json").read_text()
    assert "acme" not in report and "clients" not in report
    assert "acme" not in Path("out/generator_int8.onnx").read_bytes().decode("latin-1")


def test_export_cuda_without_a_cuda_device_is_a_failure_before_any_work(checkpoint_factory, tmp_path):
    from gantool.export.parity import cuda_worth_trying

    if cuda_worth_trying():
        pytest.skip("this machine has a CUDA device: the check runs")
    # Before the fix: exit 0, with "onnxruntime-cuda not checked: no CUDA device found" among the notes.
    out = tmp_path / "out"
    result = invoke("export", checkpoint_factory(), "--onnx", "--cuda", "-o", out)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "--cuda" in result.output and "no CUDA device" in result.output
    assert not out.exists()

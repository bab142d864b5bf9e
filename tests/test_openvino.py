"""The OpenVINO backend: the same ONNX exports on OpenVINO's CPU plugin, chosen by `auto` on the CPU,
one dynamic-shape compile for every shape, precision hints, and `--precision auto` following the
model's `gantool.prefer`."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from gantool.cli import cli
from gantool.core.artifacts import META_PREFER, read_model_metadata
from gantool.core.constants import AUTO_OPENVINO_PRECISIONS
from gantool.core.errors import InputError, ModelError, ProviderError
from gantool.export.parity import case_inputs, compare, default_cases, openvino_backend, torch_backend
from gantool.runtime.backends import OpenVinoBackend, load_backend
from gantool.runtime.choice import auto_choice
from gantool.runtime.openvino import bf16_native, compile_config, openvino_available
from gantool.training.checkpoint import generator_from_checkpoint, load_checkpoint
from inpaint_helpers import exported_model  # noqa: F401 (fixture)
from tiny import TINY_CONFIG

pytestmark = pytest.mark.skipif(not openvino_available(), reason="openvino is not installed")
ATOL = 1e-4  # gantool export's default --atol: the fp32 gate
CASES = default_cases(TINY_CONFIG)



def auto_cpu_runtime(precision: str) -> str:
    """What --backend auto runs an ONNX export on, on the CPU, at ``precision``
    (gantool.core.constants.AUTO_OPENVINO_PRECISIONS: int8 and bf16 on OpenVINO, fp32 on ONNX Runtime)."""
    return "openvino" if precision in AUTO_OPENVINO_PRECISIONS else "onnx"


def _with_prefer(files: list[Path], folder: Path, prefer: str) -> Path:
    """Copies of exported ONNX files whose gantool.prefer says ``prefer`` (as `export --prefer` writes it)."""
    folder.mkdir()
    for path in files:
        model = onnx.load(str(path))
        props = {p.key: p.value for p in model.metadata_props}
        props[META_PREFER] = prefer
        del model.metadata_props[:]
        for key, value in props.items():
            model.metadata_props.add(key=key, value=value)
        onnx.save(model, str(folder / path.name))
    return folder


def test_fp32_matches_eager_on_every_case_with_one_compile(exported_model):
    backend = load_backend(exported_model.folder, "cpu", "openvino", "fp32")
    assert backend.name == "openvino" and backend.provider == "CPU" and backend.precision == "fp32"
    assert "INFERENCE_PRECISION_HINT=f32" in backend.provider_note
    compiled = backend.compiled
    reference = torch_backend(generator_from_checkpoint(load_checkpoint(exported_model.checkpoint)))
    for case in CASES:  # batches 1-3, square and not, down to 4 x 4: all through the one dynamic compile
        image, mask = case_inputs(case, TINY_CONFIG.local_size)
        result = compare(backend.run(image, mask), reference(image, mask), image, mask)
        assert result["known_exact"] and result["max_abs"] <= ATOL, (case.label, result)
    assert backend.compiled is compiled


def test_auto_follows_the_openvino_switch_and_openvino_matches_onnx_runtime(exported_model):
    # --backend auto runs fp32 on ONNX Runtime (OpenVINO was not measured faster there);
    # --backend openvino always runs it.
    auto = load_backend(exported_model.folder, "cpu")
    assert auto.name == auto_cpu_runtime("fp32") == "onnx" and auto.path.name == "generator.onnx"
    assert auto.precision_note == "the model's default"
    explicit = load_backend(exported_model.folder, "cpu", "openvino")
    assert isinstance(explicit, OpenVinoBackend)
    ort = load_backend(exported_model.folder, "cpu", "onnx")
    assert ort.name == "onnx" and ort.provider == "CPUExecutionProvider"
    image, mask = case_inputs(CASES[1], TINY_CONFIG.local_size)
    np.testing.assert_allclose(explicit.run(image, mask), ort.run(image, mask), rtol=0, atol=ATOL)
    assert auto_choice(exported_model.onnx, "cpu") == {"backend": auto_cpu_runtime("fp32"), "precision": "fp32",
                                                       "why": "the model's default"}  # fmt: skip


def test_threads_share_the_compiled_model_with_their_own_requests(exported_model):
    backend = load_backend(exported_model.folder, "cpu", "openvino")
    inputs = [case_inputs(case, TINY_CONFIG.local_size) for case in CASES[:4]]
    expected = [backend.run(image, mask) for image, mask in inputs]
    outputs: dict[int, list[np.ndarray]] = {}

    def work(index: int) -> None:
        outputs[index] = [backend.run(image, mask) for _ in range(3) for image, mask in inputs]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for runs in outputs.values():
        for i, out in enumerate(runs):
            np.testing.assert_array_equal(out, expected[i % len(inputs)])


def test_precisions_it_cannot_run_are_one_line_refusals(exported_model):
    with pytest.raises(InputError, match="precision fp16 needs the onnx backend"):
        load_backend(exported_model.folder, "cpu", "openvino", "fp16")
    with pytest.raises(ProviderError, match="runs on the CPU; for cuda use --backend onnx"):
        load_backend(exported_model.folder, "cuda", "openvino")
    with pytest.raises(ModelError, match="no int8 model beside"):
        load_backend(exported_model.folder, "cpu", "openvino", "int8")
    if not bf16_native():
        with pytest.raises(InputError, match="no native bf16"):
            load_backend(exported_model.folder, "cpu", "openvino", "bf16")
    assert compile_config("fp32")["INFERENCE_PRECISION_HINT"] == "f32"  # exact fp32, even on bf16 CPUs
    assert compile_config("int8")["INFERENCE_PRECISION_HINT"] == "f32"  # the float parts of the int8 model


@pytest.mark.skipif(not openvino_available() or not bf16_native(), reason="this CPU has no native bf16")
def test_bf16_keeps_known_pixels_exact_and_passes_its_gate(exported_model):
    backend = load_backend(exported_model.folder, "cpu", "openvino", "bf16")
    auto = load_backend(exported_model.folder, "cpu", "auto", "bf16")  # --precision bf16, --backend auto
    assert auto.name == auto_cpu_runtime("bf16") == "openvino" and auto.path.name == "generator.onnx"
    reference = torch_backend(generator_from_checkpoint(load_checkpoint(exported_model.checkpoint)))
    for case in CASES:
        image, mask = case_inputs(case, TINY_CONFIG.local_size)
        result = compare(backend.run(image, mask), reference(image, mask), image, mask)
        assert result["known_exact"] and result["psnr_hole_uint8"] >= 35.0, (case.label, result)


def test_int8_file_runs_within_its_gate_and_known_pixels_stay_exact(modern_export):
    backend = load_backend(modern_export.out_dir, "cpu", "openvino", "int8")
    assert backend.path.name == "generator_int8.onnx" and backend.precision == "int8"
    auto_int8 = load_backend(modern_export.out_dir, "cpu", "auto", "int8")
    assert auto_int8.name == auto_cpu_runtime("int8") == "openvino"  # --precision int8 with --backend auto
    reference = torch_backend(generator_from_checkpoint(load_checkpoint(modern_export.checkpoint)))
    ort_fp32 = openvino_backend(modern_export.paths["onnx"], "fp32")
    for case in CASES:
        image, mask = case_inputs(case, TINY_CONFIG.local_size)
        result = compare(backend.run(image, mask), reference(image, mask), image, mask)
        assert result["known_exact"] and result["psnr_hole_uint8"] >= 35.0, (case.label, result)
        assert compare(ort_fp32(image, mask), reference(image, mask), image, mask)["max_abs"] <= ATOL


SHIPPED = Path(__file__).resolve().parents[1] / "models"
# OpenVINO's int8 pipeline got the shipped model's push-pull fill wrong by 0.09 (hole PSNR against
# ONNX Runtime 28.5 dB on a 12 x 20 box); right, the two run the same int8 file and differ only in
# float rounding.
SAME_INT8_PSNR = 60.0


def _as_pools(model: onnx.ModelProto) -> int:
    """The inverse of gantool.runtime.openvino.pools_as_convolutions: an int8 file as gantool wrote it
    before that rewrite (its box-filter convolutions back to AveragePool, count_include_pad = 1)."""
    boxes = {init.name for init in model.graph.initializer if init.name.endswith("_box_filter")}
    for i, node in enumerate(model.graph.node):
        if node.op_type == "Conv" and node.input[1] in boxes:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            model.graph.node[i].CopyFrom(onnx.helper.make_node(
                "AveragePool", [node.input[0]], list(node.output), name=node.name, count_include_pad=1,
                kernel_shape=attrs["kernel_shape"], strides=attrs["strides"], pads=attrs["pads"],
            ))  # fmt: skip
    kept = [init for init in model.graph.initializer if init.name not in boxes]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return len(boxes)


def _agrees_with_onnx_runtime(folder: Path) -> None:
    openvino_int8 = load_backend(folder, "cpu", "openvino", "int8")
    onnxruntime_int8 = load_backend(folder, "cpu", "onnx", "int8")
    assert openvino_int8.path.name == onnxruntime_int8.path.name == "generator_int8.onnx"
    rng = np.random.default_rng(0)
    for height, width in [(12, 20), (36, 44)]:  # odd pyramid levels: where padded cells are averaged
        image = rng.random((2, 3, height, width), dtype=np.float32)
        mask = np.zeros((2, 1, height, width), np.float32)
        mask[..., height // 4 : height // 4 + height // 2, width // 4 : width // 4 + width // 2] = 1
        result = compare(openvino_int8.run(image, mask), onnxruntime_int8.run(image, mask), image, mask)
        assert result["known_exact"] and result["psnr_hole_uint8"] >= SAME_INT8_PSNR, (height, width, result)


@pytest.mark.skipif(not (SHIPPED / "generator_int8.onnx").is_file(), reason="no shipped int8 model")
def test_openvino_runs_the_shipped_push_pull_int8_model_as_onnx_runtime_does():
    model = onnx.load(str(SHIPPED / "generator_int8.onnx"))
    assert not [n for n in model.graph.node if n.op_type == "AveragePool"]  # rewritten as convolutions
    _agrees_with_onnx_runtime(SHIPPED)


@pytest.mark.skipif(not (SHIPPED / "generator_int8.onnx").is_file(), reason="no shipped int8 model")
def test_an_int8_file_with_padded_pools_is_rewritten_when_openvino_reads_it(tmp_path):
    """An int8 file written before the rewrite (average pools that count their zero padding) runs
    right on OpenVINO too: the backend rewrites it in memory; ONNX Runtime's output is bitwise the same."""
    import onnxruntime

    from gantool.runtime.openvino import pools_as_convolutions

    folder = tmp_path / "older"
    folder.mkdir()
    shutil.copy(SHIPPED / "generator.onnx", folder / "generator.onnx")
    model = onnx.load(str(SHIPPED / "generator_int8.onnx"))
    assert _as_pools(model) == 20  # two per level of the 10-level push-pull pyramid
    onnx.save(model, str(folder / "generator_int8.onnx"))
    _agrees_with_onnx_runtime(folder)
    assert model.graph.node and pools_as_convolutions(model) == 20
    image = np.random.default_rng(1).random((1, 3, 12, 20), dtype=np.float32)
    mask = np.ones((1, 1, 12, 20), np.float32)
    mask[..., :3, :5] = 0
    runs = [
        onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"image": image, "mask": mask})[0]
        for m in (str(folder / "generator_int8.onnx"), model.SerializeToString())
    ]
    np.testing.assert_array_equal(runs[0], runs[1])


def test_pools_that_do_not_count_their_padding_are_left_alone():
    from gantool.runtime.openvino import pools_as_convolutions

    def pool(**attrs: object) -> onnx.ModelProto:
        node = onnx.helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], **attrs)
        x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 5, 5])
        y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
        return onnx.helper.make_model(onnx.helper.make_graph([node], "g", [x], [y]))

    for attrs in ({"pads": [0, 0, 1, 1]}, {"pads": [0, 0, 1, 1], "count_include_pad": 1, "ceil_mode": 1}):
        model = pool(**attrs)
        assert pools_as_convolutions(model) == 0 and model.graph.node[0].op_type == "AveragePool", attrs
    counted = pool(pads=[0, 0, 1, 1], count_include_pad=1)
    assert pools_as_convolutions(counted) == 1
    (conv,) = counted.graph.node
    assert conv.op_type == "Conv" and {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}["group"] == 3


def test_unreadable_and_foreign_files_are_one_line(tmp_path: Path, exported_model):
    bad = tmp_path / "generator.onnx"
    bad.write_bytes(b"\x08\x07not an onnx model at all")
    with pytest.raises(ModelError) as caught:
        OpenVinoBackend(bad, "cpu")
    assert "\n" not in str(caught.value)
    relu = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
        )
    )  # fmt: skip
    onnx.save(relu, str(tmp_path / "relu.onnx"))
    with pytest.raises(ModelError, match="not a gantool generator"):
        OpenVinoBackend(tmp_path / "relu.onnx", "cpu")


# ------------------------------------------------------------------ --precision auto and gantool.prefer


def test_auto_precision_runs_the_preferred_int8_and_explicit_precision_wins(modern_export, tmp_path):
    paths = modern_export.paths
    folder = _with_prefer([paths["onnx"], paths["onnx_int8"]], tmp_path / "int8", "int8")
    auto = load_backend(folder, "cpu")
    assert auto.name == auto_cpu_runtime("int8") and auto.precision == "int8" and auto.path.name == "generator_int8.onnx"
    assert auto.precision_note.startswith("the model prefers int8")
    assert load_backend(folder, "cpu", precision="fp32").precision == "fp32"  # explicit --precision wins
    ort = load_backend(folder, "cpu", "onnx")
    assert ort.name == "onnx" and ort.precision == "int8"  # ONNX Runtime runs the preference too
    assert auto_choice(folder / "generator.onnx", "cpu")["precision"] == "int8"


def test_auto_precision_falls_back_to_fp32_with_one_line(exported_model, tmp_path, caplog):
    folder = _with_prefer([exported_model.onnx], tmp_path / "no_int8", "int8")
    with caplog.at_level(logging.WARNING, logger="gantool.runtime.backends"):
        backend = load_backend(folder, "cpu")
    assert backend.precision == "fp32" and "no generator_int8.onnx beside generator.onnx" in backend.precision_note
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["the model prefers int8, but no generator_int8.onnx beside generator.onnx: running fp32"]
    eager = load_backend(folder.parent / "no_int8" / "generator.onnx", "cpu", "onnx")
    assert eager.precision == "fp32"  # an fp32-only export under ONNX Runtime: the same fallback


def test_an_int8_preference_on_a_gpu_is_an_info_line_not_a_warning(modern_export, tmp_path, caplog):
    """On a GPU fp32 is the fast path, not a fallback (the shipped model prefers int8): the reason is
    kept for the startup line, logged at info level. A CPU-side fallback stays a warning."""
    from gantool.runtime.choice import preferred_precision

    paths = modern_export.paths
    folder = _with_prefer([paths["onnx"], paths["onnx_int8"]], tmp_path / "int8", "int8")
    with caplog.at_level(logging.INFO, logger="gantool.runtime.backends"):
        precision, why = preferred_precision(folder / "generator.onnx", "onnx", "cuda")
    assert (precision, why) == ("auto", "the model prefers int8, but int8 runs on the CPU only")
    assert [r.levelno for r in caplog.records if "prefers int8" in r.getMessage()] == [logging.INFO]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gantool.runtime.backends"):
        preferred_precision(folder / "generator.onnx", "pt2", "cpu")  # a backend that cannot run int8
    assert [r.levelno for r in caplog.records if "prefers int8" in r.getMessage()] == [logging.WARNING]


def test_inpaint_startup_line_says_which_precision_runs_and_why(modern_export, tmp_path):
    from PIL import Image

    paths = modern_export.paths
    folder = _with_prefer([paths["onnx"], paths["onnx_int8"]], tmp_path / "model", "int8")
    Image.fromarray(np.full((20, 24, 3), 120, np.uint8)).save(tmp_path / "a.png")
    result = CliRunner().invoke(cli, ["inpaint", str(tmp_path / "a.png"), "--box", "4,4,8,8", "--model", str(folder),
                                      "--provider", "cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"backend: {auto_cpu_runtime('int8')}; precision: int8 (the model prefers int8 (gantool export --prefer int8" in result.output
    info = CliRunner().invoke(cli, ["info", str(folder / "generator.onnx")])
    assert f"default options run it here: {auto_cpu_runtime('int8')}, int8 (the model prefers int8" in info.output, info.output


def test_export_refuses_a_preference_whose_gate_cannot_run(exported_model, tmp_path):
    from gantool.export.exporter import export_generator

    with pytest.raises(InputError, match="--prefer int8 needs --int8"):
        export_generator(exported_model.checkpoint, tmp_path / "a", prefer="int8")
    with pytest.raises(InputError, match="drop --no-verify"):
        export_generator(exported_model.checkpoint, tmp_path / "b", prefer="int8", int8=True, verify=False)
    with pytest.raises(InputError, match="--prefer"):
        export_generator(exported_model.checkpoint, tmp_path / "c", prefer="fp8")
    if not bf16_native():
        with pytest.raises(InputError, match="--prefer bf16 needs its gate"):
            export_generator(exported_model.checkpoint, tmp_path / "d", prefer="bf16")
    assert not any((tmp_path / name).exists() and any((tmp_path / name).iterdir()) for name in "abcd")


def test_export_records_the_default_preference(exported_model):
    assert read_model_metadata(exported_model.onnx)[META_PREFER] == "fp32"


def test_export_sweep_covers_openvino(modern_export):
    backends = modern_export.report["backends"]
    assert backends["openvino"]["passed"] and backends["openvino"]["max_abs"] <= ATOL
    assert backends["openvino-int8"]["passed"] and backends["openvino-int8"]["gate_psnr_hole"] == 35.0
    if bf16_native():
        assert backends["openvino-bf16"]["passed"]
    else:
        assert any("openvino-bf16 not checked" in note for note in modern_export.report["notes"])


@pytest.mark.slow
def test_export_cli_prefer_int8_then_default_inpaint_runs_int8(checkpoint_factory, tmp_path):
    from PIL import Image

    checkpoint = checkpoint_factory("trained", seed=5, step=4, phase="joint")
    out = tmp_path / "export"
    result = CliRunner().invoke(cli, ["export", str(checkpoint), "--onnx", "--int8", "--prefer", "int8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "openvino-int8" in result.output and "openvino " in result.output  # the sweep's rows
    assert read_model_metadata(out / "generator_int8.onnx")[META_PREFER] == "int8"
    Image.fromarray(np.full((20, 24, 3), 120, np.uint8)).save(tmp_path / "a.png")
    run = CliRunner().invoke(cli, ["inpaint", str(tmp_path / "a.png"), "--box", "4,4,8,8", "--model", str(out)])
    assert run.exit_code == 0 and "precision: int8 (the model prefers int8" in run.output, run.output
    shutil.rmtree(out)

"""Backends, model resolution, providers, strategies and the Inpainter API."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from gantool.core import artifacts
from gantool.core.artifacts import read_model_metadata, resolve_model
from gantool.core.errors import InputError, ModelError, ProviderError
from gantool.core.processing import output_mode, paste_holes, resize_mask
from gantool.inference.inpainter import Inpainter, Window, crop_windows, hole_boxes, inpaint_arrays, plan_windows
from gantool.nn.networks import CompletionNetwork
from gantool.runtime.backends import EagerBackend, OnnxBackend, TorchScriptBackend, load_backend
from gantool.runtime.providers import failure_cause
from inpaint_helpers import GPU_ONLY, NO_GPU_ONLY, ExportedModel, exported_model, textured_rgb  # noqa: F401
from numerics import conv_fan_in, fp32_tol
from tiny import TINY_CONFIG


def _batch(n: int, height: int, width: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    image = rng.random((n, 3, height, width), dtype=np.float32)
    mask = np.zeros((n, 1, height, width), np.float32)
    mask[..., height // 4 : height // 2 + 3, width // 3 : width // 2 + 5] = 1.0
    return image, mask


# ------------------------------------------------------------------------- backends


def test_three_backends_agree_and_keep_known_pixels(exported_model: ExportedModel) -> None:
    backends = [
        OnnxBackend(exported_model.onnx, "cpu"),
        TorchScriptBackend(exported_model.torchscript, "cpu"),
        EagerBackend(exported_model.safetensors, "cpu"),
        EagerBackend(exported_model.checkpoint, "cpu"),
    ]
    image, mask = _batch(2, 48, 40)
    outputs = [b.run(image, mask) for b in backends]
    for backend, out in zip(backends, outputs):
        assert out.shape == image.shape and out.dtype == np.float32
        assert np.array_equal(out[mask.repeat(3, 1) == 0], image[mask.repeat(3, 1) == 0]), backend.name
        assert np.abs(out - outputs[0]).max() < 1e-4, backend.name
        assert backend.size_multiple == 4 and backend.train_size == 32
    hole = mask.repeat(3, 1) > 0
    assert np.abs(outputs[0][hole] - image[hole]).mean() > 1e-3  # the hole really was filled


def test_backend_run_rejects_bad_shapes(exported_model: ExportedModel) -> None:
    backend = OnnxBackend(exported_model.onnx, "cpu")
    image, mask = _batch(1, 37, 24)
    with pytest.raises(InputError, match="multiples of 4"):
        backend.run(image, mask)
    image, mask = _batch(1, 36, 24)
    with pytest.raises(InputError, match="mask must be"):
        backend.run(image, mask[:, :, :20])
    with pytest.raises(InputError, match="N x 3 x H x W"):
        backend.run(image[:, :2], mask)


def test_inpainter_run_pads_any_size(exported_model: ExportedModel) -> None:
    inpainter = Inpainter(exported_model.folder, provider="cpu")
    image, mask = _batch(2, 23, 37)
    out = inpainter.run(image, mask)
    assert out.shape == image.shape
    known = mask.repeat(3, 1) == 0
    assert np.array_equal(out[known], image[known])


def test_metadata_follows_the_contract(exported_model: ExportedModel) -> None:
    onnx_backend = OnnxBackend(exported_model.onnx, "cpu")
    assert onnx_backend.metadata == read_model_metadata(exported_model.onnx)
    ts_backend = TorchScriptBackend(exported_model.torchscript, "cpu")
    assert ts_backend.metadata == read_model_metadata(exported_model.torchscript)
    for backend in (onnx_backend, ts_backend):
        assert json.loads(backend.metadata["gantool.processing"])["size_multiple"] == 4
        assert backend.config.size == 32 and backend.precision == "fp32"
    eager = EagerBackend(exported_model.checkpoint, "cpu")
    assert eager.metadata["gantool.train_step"] == "4" and eager.config.width == 4


def test_fp16_model_is_used_only_when_asked_on_the_cpu(exported_model: ExportedModel) -> None:
    fp32 = OnnxBackend(exported_model.onnx, "cpu")
    fp16 = OnnxBackend(exported_model.onnx, "cpu", precision="fp16")
    assert fp32.path.name == "generator.onnx"
    assert fp16.path.name == "generator_fp16.onnx" and fp16.precision == "fp16"
    image, mask = _batch(1, 32, 32)
    out16, out32 = fp16.run(image, mask), fp32.run(image, mask)
    known = mask.repeat(3, 1) == 0
    assert np.array_equal(out16[known], image[known])
    assert np.abs(out16 - out32).max() < 2e-2


def test_fp16_without_an_fp16_file_is_an_error(exported_model: ExportedModel, tmp_path: Path) -> None:
    shutil.copy(exported_model.onnx, tmp_path / "generator.onnx")
    with pytest.raises(ModelError, match="no fp16 model"):
        OnnxBackend(tmp_path / "generator.onnx", "cpu", precision="fp16")
    with pytest.raises(InputError, match="fp16 needs the onnx backend"):
        load_backend(exported_model.safetensors, "cpu", "eager", precision="fp16")


# ------------------------------------------------------------------ model resolution


def test_resolve_model_by_folder_and_file(exported_model: ExportedModel) -> None:
    folder = exported_model.folder
    assert resolve_model(folder, "auto") == (exported_model.onnx, "onnx")
    assert resolve_model(folder, "torchscript") == (exported_model.torchscript, "torchscript")
    assert resolve_model(folder, "eager") == (exported_model.safetensors, "eager")
    assert resolve_model(folder.parent, "onnx") == (exported_model.onnx, "onnx")  # a run folder
    assert resolve_model(exported_model.torchscript) == (exported_model.torchscript, "torchscript")
    assert resolve_model(exported_model.checkpoint) == (exported_model.checkpoint, "eager")
    with pytest.raises(ModelError, match="use --backend torchscript"):
        resolve_model(exported_model.torchscript, "eager")
    with pytest.raises(ModelError, match="not a model for the onnx backend"):
        resolve_model(exported_model.checkpoint, "onnx")


def test_a_run_folder_without_an_export_or_last_pt_opens_its_highest_step_checkpoint(
    exported_model: ExportedModel, tmp_path: Path
) -> None:
    """`--model RUN` with no export runs the run's newest checkpoint; with last.pt gone that is its
    highest step_N.pt, as `--resume RUN` takes it. Before: 'no model in RUN'."""
    run = tmp_path / "my run"
    (run / "checkpoints").mkdir(parents=True)
    for step in (2, 10):
        shutil.copy(exported_model.checkpoint, run / "checkpoints" / f"step_{step}.pt")
    newest = run / "checkpoints" / "step_10.pt"
    assert resolve_model(run) == (newest, "eager")
    assert resolve_model(run, "eager") == (newest, "eager")
    with pytest.raises(ModelError, match="expected generator.onnx") as refused:
        resolve_model(run, "onnx")
    assert "step_" not in str(refused.value)  # a checkpoint is not an export's file


def test_missing_models_explain_themselves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelError, match="model not found"):
        resolve_model(tmp_path / "nope.onnx")
    with pytest.raises(ModelError, match="expected generator.onnx"):
        resolve_model(tmp_path, "onnx")
    monkeypatch.setattr(artifacts, "DEFAULT_MODEL_DIRS", (tmp_path / "models",))
    with pytest.raises(ModelError, match="gantool train.*gantool export.*--model runs/<run>/export"):
        Inpainter()
    (tmp_path / "models").mkdir()
    with pytest.raises(ModelError, match="gantool train"):
        resolve_model(None)


def test_shipped_model_folder_is_the_default(
    exported_model: ExportedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "models"
    shutil.copytree(exported_model.folder, shipped)
    monkeypatch.setattr(artifacts, "DEFAULT_MODEL_DIRS", (tmp_path / "absent", shipped))
    assert Inpainter(provider="cpu").backend.path == shipped / "generator.onnx"


def test_corrupt_models_raise_model_errors(exported_model: ExportedModel, tmp_path: Path) -> None:
    bad_onnx = tmp_path / "generator.onnx"
    bad_onnx.write_bytes(exported_model.onnx.read_bytes()[:500])
    with pytest.raises(ModelError, match="cannot load ONNX model"):
        OnnxBackend(bad_onnx, "cpu")
    bad_ts = tmp_path / "generator.torchscript.pt"
    bad_ts.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(ModelError, match="truncated or damaged"):  # said so, not a miniz error
        TorchScriptBackend(bad_ts, "cpu")
    bad_ts.write_bytes(b"not a zip at all")
    with pytest.raises(ModelError, match="not a readable TorchScript model"):
        TorchScriptBackend(bad_ts, "cpu")
    bad_weights = tmp_path / "generator.safetensors"
    bad_weights.write_bytes(b"\x00" * 20)
    with pytest.raises(Exception, match="not a readable safetensors"):
        EagerBackend(bad_weights, "cpu")


def test_onnx_model_with_another_signature_is_refused(tmp_path: Path) -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "relu.onnx")
    with pytest.raises(ModelError, match="not a gantool generator"):
        OnnxBackend(tmp_path / "relu.onnx", "cpu")


# ------------------------------------------------------------------------ providers


@NO_GPU_ONLY
def test_auto_provider_goes_straight_to_the_cpu_without_noise(
    exported_model: ExportedModel, capfd: pytest.CaptureFixture[str]
) -> None:
    backend = OnnxBackend(exported_model.onnx, "auto")
    assert backend.provider == "CPUExecutionProvider"
    assert "no CUDA device found" in backend.provider_note
    out, err = capfd.readouterr()
    assert "Failed to load" not in out + err and "libcublas" not in out + err


@NO_GPU_ONLY
@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
def test_gpu_provider_without_gpu_fails_naming_the_cause(
    exported_model: ExportedModel, provider: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ProviderError) as error:
        OnnxBackend(exported_model.onnx, provider)
    message = str(error.value)
    assert f"provider '{provider}' could not be loaded" in message
    assert "no NVIDIA GPU is visible" in message
    assert "\n" not in message
    out, err = capfd.readouterr()  # ONNX Runtime's own noise was captured, not shown
    assert "Failed to load" not in out + err and "onnxruntime" not in err


@NO_GPU_ONLY
@pytest.mark.parametrize("backend_class", [TorchScriptBackend, EagerBackend])
def test_torch_backends_map_providers_to_devices(exported_model: ExportedModel, backend_class: type) -> None:
    path = exported_model.torchscript if backend_class is TorchScriptBackend else exported_model.safetensors
    assert backend_class(path, "auto").provider == "cpu"
    with pytest.raises(ProviderError, match="provider 'cuda' is not available"):
        backend_class(path, "cuda")
    with pytest.raises(ProviderError, match="needs the onnx backend"):
        backend_class(path, "tensorrt")


def test_failure_cause_names_the_library_or_device() -> None:
    ort_log = (
        "\x1b[1;31m2026 [E:onnxruntime:Default, provider_bridge_ort.cc:2458] Failed to load library "
        "/x/libonnxruntime_providers_cuda.so with error: libcudnn.so.9: cannot open shared object file\x1b[m\n"
    )
    assert failure_cause(ort_log, "cuda").startswith("libcudnn.so.9: cannot open shared object file")
    device = "CUDA failure 100: no CUDA-capable device is detected ; GPU=0 ; hostname=x"
    assert failure_cause(device, "cuda").startswith("CUDA failure 100: no CUDA-capable device is detected")
    preload = "Failed to load libcublasLt.so.13: libcublasLt.so.13: cannot open shared object file\n"
    assert failure_cause(preload, "cuda").startswith("libcublasLt.so.13: libcublasLt.so.13")
    assert "CUDAExecutionProvider" in failure_cause("", "cuda")


def test_unknown_provider_backend_and_strategy(exported_model: ExportedModel) -> None:
    with pytest.raises(InputError, match="unknown provider"):
        load_backend(exported_model.folder, "rocm")
    with pytest.raises(InputError, match="unknown backend"):
        load_backend(exported_model.folder, "cpu", "tflite")
    with pytest.raises(InputError, match="unknown strategy"):
        Inpainter(exported_model.folder, "cpu", strategy="tile")


@GPU_ONLY
def test_cuda_provider_really_runs_and_matches_the_cpu(exported_model: ExportedModel) -> None:
    gpu = Inpainter(exported_model.folder, provider="cuda", precision="fp32")
    assert gpu.provider == "CUDAExecutionProvider"
    cpu = Inpainter(exported_model.folder, provider="cpu")
    image, mask = _batch(2, 44, 36)
    assert np.abs(gpu.run(image, mask) - cpu.run(image, mask)).max() < 1e-3
    auto = Inpainter(exported_model.folder, provider="auto")
    assert auto.provider == "CUDAExecutionProvider"
    assert auto.backend.path.name == "generator_fp16.onnx"  # the fp16 export is used on the GPU


# -------------------------------------------------------------------- Python API


def test_inpainter_accepts_paths_pil_and_arrays(exported_model: ExportedModel, tmp_path: Path) -> None:
    inpainter = Inpainter(exported_model.folder, provider="cpu")
    rgb = textured_rgb(23, 37)
    mask = np.zeros((23, 37), np.uint8)
    mask[4:12, 9:20] = 200  # > 127: hole
    mask[15:20, 25:30] = 100  # <= 127: known
    Image.fromarray(rgb).save(tmp_path / "image.png")
    Image.fromarray(mask).save(tmp_path / "mask.png")
    results = [
        inpainter.inpaint(rgb, mask),
        inpainter.inpaint(tmp_path / "image.png", str(tmp_path / "mask.png")),
        inpainter.inpaint(Image.open(tmp_path / "image.png"), Image.open(tmp_path / "mask.png")),
        inpainter.inpaint(rgb, (mask > 127).astype(np.uint8)),  # 0/1 masks too
    ]
    hole = mask > 127
    for result in results:
        assert result.mode == "RGB" and result.size == (37, 23)
        out = np.asarray(result)
        assert np.array_equal(out[~hole], rgb[~hole])
        assert np.array_equal(out, np.asarray(results[0]))
    assert (np.asarray(results[0])[hole] != rgb[hole]).any()


def test_inpainter_rejects_bad_inputs(exported_model: ExportedModel) -> None:
    inpainter = Inpainter(exported_model.folder, provider="cpu")
    rgb = textured_rgb(16, 16)
    with pytest.raises(InputError, match="uint8"):
        inpainter.inpaint(rgb.astype(np.float32) / 255, np.zeros((16, 16)))
    with pytest.raises(InputError, match="is 8x8 but"):
        inpainter.inpaint(rgb, np.zeros((8, 8), np.uint8))
    with pytest.raises(InputError, match="no mask"):
        inpainter.inpaint(rgb)


def test_empty_mask_returns_the_image_unchanged(exported_model: ExportedModel) -> None:
    inpainter = Inpainter(exported_model.folder, provider="cpu")
    rgb = textured_rgb(20, 28)
    assert np.array_equal(np.asarray(inpainter.inpaint(rgb, np.zeros((20, 28), np.uint8))), rgb)


# ----------------------------------------------------------------------- strategies


def test_hole_boxes_groups_connected_pixels() -> None:
    mask = np.zeros((30, 40), np.float32)
    mask[2:5, 3:6] = 1
    mask[5, 6] = 1  # diagonal neighbour: same hole
    mask[20:25, 30:38] = 1
    mask[20, 10] = 1
    assert hole_boxes(mask) == [(2, 3, 6, 7), (20, 10, 21, 11), (20, 30, 25, 38)]
    u_shape = np.zeros((10, 10), np.float32)
    u_shape[2:8, 2] = u_shape[2:8, 7] = u_shape[7, 2:8] = 1  # joined only at the bottom
    assert hole_boxes(u_shape) == [(2, 2, 8, 8)]
    assert hole_boxes(np.zeros((5, 5))) == []


@pytest.mark.parametrize("seed", range(6))
def test_hole_boxes_match_a_flood_fill(seed: int) -> None:
    # An independent oracle: breadth-first flood fill over the 8 neighbours, on random masks
    # (sparse to dense, including holes touching every border and soft mask values).
    rng = np.random.default_rng(seed)
    mask = (rng.random((23, 31)) < 0.15 + 0.12 * seed).astype(np.float32) * rng.choice([0.6, 1.0])
    hole = mask > 0.5
    seen = np.zeros_like(hole)
    expected = []
    for y0, x0 in zip(*np.nonzero(hole)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        todo, ys, xs = [(y0, x0)], [], []
        while todo:
            y, x = todo.pop()
            ys.append(y)
            xs.append(x)
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    ny, nx = y + dy, x + dx
                    if 0 <= ny < hole.shape[0] and 0 <= nx < hole.shape[1] and hole[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        todo.append((ny, nx))
        expected.append((min(ys), min(xs), max(ys) + 1, max(xs) + 1))
    assert hole_boxes(mask) == sorted(expected)
    assert hole_boxes(mask[:, ::-1]) == sorted(
        (t, 31 - r, b, 31 - l) for t, l, b, r in expected
    )  # a strided view in, the same boxes mirrored out


def test_crop_windows_cover_every_hole_once() -> None:
    mask = np.zeros((200, 200), np.float32)
    mask[20:30, 20:30] = 1
    mask[150:160, 160:170] = 1
    mask[40:44, 40:44] = 1  # close to the first: merged with it
    windows = crop_windows(mask, train_size=32, margin=8)
    assert len(windows) == 2
    coverage = np.zeros_like(mask)
    for w in windows:
        assert w.height >= 32 and w.width >= 32
        assert w.top >= 0 and w.left >= 0 and w.top + w.height <= 200 and w.left + w.width <= 200
        coverage[w.top : w.top + w.height, w.left : w.left + w.width] += 1
    assert (coverage[mask > 0] == 1).all()
    assert (coverage == 0).mean() > 0.5  # only windows around the holes are run
    edge = np.zeros((50, 50), np.float32)
    edge[0:3, 47:50] = 1  # at the corner: the window shifts inside the image
    assert crop_windows(edge, 32, 8) == [Window(0, 18, 32, 32)]


def test_plan_windows_strategies() -> None:
    mask = np.zeros((100, 80), np.float32)
    mask[10:20, 10:20] = 1
    assert plan_windows(mask, "full", 32) == [Window(0, 0, 100, 80)]
    assert plan_windows(mask, "resize", 32) == [Window(0, 0, 100, 80, scaled_to=(32, 26))]
    assert plan_windows(mask, "auto", 32) == crop_windows(mask, 32)  # 100 > 2 x 32
    assert plan_windows(mask, "auto", 64) == [Window(0, 0, 100, 80)]
    assert plan_windows(np.zeros((10, 10)), "full", 32) == []


def test_crop_matches_full_when_the_window_covers_the_context(exported_model: ExportedModel) -> None:
    backend = OnnxBackend(exported_model.onnx, "cpu")
    image = textured_rgb(200, 200).astype(np.float32) / 255
    mask = np.zeros((200, 200), np.float32)
    mask[90:104, 100:115] = 1
    full = inpaint_arrays(backend, [(image, mask)], "full")[0]
    wide = inpaint_arrays(backend, [(image, mask)], "crop", crop_margin=200)[0]
    # The same outputs from a wider input: ONNX Runtime may block the convolutions differently.
    assert np.abs(wide - full).max() <= fp32_tol(full, conv_fan_in(CompletionNetwork(TINY_CONFIG)))
    crop = inpaint_arrays(backend, [(image, mask)], "crop")[0]
    known = mask == 0
    assert np.array_equal(crop[known], image[known])
    assert np.abs(crop[~known] - full[~known]).mean() < 0.1  # same model, less context
    resized = inpaint_arrays(backend, [(image, mask)], "resize")[0]
    assert np.array_equal(resized[known], image[known]) and not np.array_equal(resized, image)


def test_processing_additions() -> None:
    assert output_mode(Image.new("RGBA", (2, 2))) == "RGB"
    assert output_mode(Image.new("P", (2, 2))) == "RGB"
    assert output_mode(Image.new("LA", (2, 2))) == "L"
    assert output_mode(Image.new("I;16", (2, 2))) == "I;16"
    mask = np.zeros((9, 9), np.float32)
    mask[4, 4] = 1
    assert resize_mask(mask, (3, 3))[1, 1] == 1 and resize_mask(mask, (3, 3)).sum() == 1
    known = np.arange(12, dtype=np.uint16).reshape(2, 2, 3)
    pasted = paste_holes(known, np.full_like(known, 99), np.array([[1, 0], [0, 0]], np.float32))
    assert pasted[0, 0].tolist() == [99, 99, 99] and np.array_equal(pasted[1], known[1])


def test_inpainter_defaults_to_auto_and_opens_a_safetensors_file(exported_model: ExportedModel) -> None:
    # Fixed bug: Inpainter defaulted to backend="onnx" while the CLI used "auto",
    # so Inpainter("...generator.safetensors") failed.
    inpainter = Inpainter(exported_model.safetensors, provider="cpu")
    assert inpainter.backend_name == "eager"
    image = textured_rgb(20, 28)
    mask = np.zeros((20, 28), np.uint8)
    mask[4:12, 8:20] = 255
    result = np.asarray(inpainter.inpaint(image, mask))
    assert result.shape == image.shape
    assert np.array_equal(result[mask == 0], image[mask == 0])


def test_backend_registry_matches_the_enumeration() -> None:
    from gantool.core.constants import BACKENDS
    from gantool.runtime.backends import BACKEND_CLASSES

    assert tuple(BACKEND_CLASSES) == BACKENDS
    assert all(cls.name == name for name, cls in BACKEND_CLASSES.items())  # type: ignore[attr-defined]

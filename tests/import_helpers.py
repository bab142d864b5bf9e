"""Shared by the tests of an imported GLCIC-PyTorch model downstream (test_import_downstream.py,
test_ray_inpaint.py): one imported and exported model per session, and the comparison of
8-bit output files with the independent oracle (tests/glcic_oracle.py).

The model has GLCIC-PyTorch's layer structure and key names at base width 8 (GLCIC-PyTorch's
is 64, fixed; the import reads the width from ``conv1``), so the fast tier stays cheap; the
full width is exercised in the slow tier (test_import_glcic.py, test_import_downstream.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from glcic_oracle import cn_forward, composite, fp32_tolerance, make_model_cn, write_glcic_files

MPV = [0.4914, 0.4822, 0.4465]
SIZE, LOCAL = 64, 32  # config.json's cn_input_size / ld_input_size
WIDTH = 8


@dataclass(frozen=True)
class ImportedModel:
    state_dict: dict[str, torch.Tensor]  # GLCIC-PyTorch's model_cn, as written (``module.`` prefix)
    width: int
    imported: Path  # gantool import's folder: checkpoint.pt, generator.safetensors (runs eager)
    export: Path | None  # gantool export's folder (generator.onnx, ...), when exported


_CACHE: dict[tuple[int, tuple[str, ...]], ImportedModel] = {}  # one import (+ export) per session, width, formats


def imported_model(root: Path, width: int = WIDTH, formats: tuple[str, ...] = ()) -> ImportedModel:
    """GLCIC-PyTorch files (random weights, non-trivial BN statistics, DataParallel keys),
    imported by the library and, given ``formats``, exported (the export's parity sweep is
    left to test_import_glcic.py: the tests here compare every output with the oracle)."""
    key = (width, formats)
    if key not in _CACHE:
        from gantool.export.exporter import export_generator
        from gantool.training.glcic_import import import_glcic_pytorch

        sd = make_model_cn(width, seed=11, prefix="module.")
        model_cn, config = write_glcic_files(root / "src", sd, MPV, SIZE, LOCAL)
        result = import_glcic_pytorch(model_cn, config, root / "imported")
        export = None
        if formats:
            export = export_generator(
                result.files["checkpoint"], root / "export", formats=formats, verify=False
            ).out_dir
        _CACHE[key] = ImportedModel(sd, width, result.out_dir, export)
    return _CACHE[key]


@pytest.fixture(scope="session")
def imported_glcic(tmp_path_factory: pytest.TempPathFactory) -> ImportedModel:
    """The session's width-8 imported model, not exported: its generator.safetensors runs
    eager (``--model imported/``, a user's first step). An import takes a second; an ONNX
    export of it half a minute on this loaded machine, so the fast tier runs this."""
    return imported_model(tmp_path_factory.mktemp("imported_glcic"))


@pytest.fixture(scope="session")
def exported_glcic(tmp_path_factory: pytest.TempPathFactory) -> ImportedModel:
    """The same model imported and exported to ONNX and torch.export (the slow tier)."""
    return imported_model(tmp_path_factory.mktemp("exported_glcic"), formats=("onnx", "pt2"))


def oracle_pixels(model: ImportedModel, pixels: np.ndarray, hole: np.ndarray) -> tuple[np.ndarray, float]:
    """GLCIC-PyTorch's forward (float64) composited onto ``pixels`` (uint8 H x W x 3), in 8-bit
    units (not rounded), and the fp32 tolerance in the same units."""
    plain = {k.removeprefix("module."): v for k, v in model.state_dict.items()}
    image = torch.from_numpy(pixels.copy()).permute(2, 0, 1)[None].double() / 255.0  # copy: a read-only view warns
    mask = torch.from_numpy(np.asarray(hole).copy())[None, None].double()
    reference = composite(image, mask, cn_forward(plain, image, mask, MPV, model.width))
    image32, mask32 = image.float(), mask.float()
    oracle32 = composite(image32, mask32, cn_forward(plain, image32, mask32, MPV, model.width))
    return reference[0].permute(1, 2, 0).numpy() * 255.0, fp32_tolerance(reference, oracle32) * 255.0


def rounding_may_differ(expected: np.ndarray, tol: float) -> np.ndarray:
    """Where an fp32 result within ``tol`` (8-bit units) of ``expected`` may round to another level."""
    return np.abs(np.abs(expected - np.floor(expected)) - 0.5) <= tol


def assert_matches_oracle(got: np.ndarray, pixels: np.ndarray, hole: np.ndarray, model: ImportedModel) -> int:
    """An 8-bit output against the oracle: known pixels identical to the input, the hole the
    oracle's rounded output, except a value within the fp32 tolerance of a rounding boundary,
    which may round one level the other way. Returns how many values did."""
    expected, tol = oracle_pixels(model, pixels, hole)
    got = np.asarray(got).astype(np.float64)
    assert got.shape == pixels.shape
    assert np.array_equal(got[~hole], pixels[~hole].astype(np.float64))  # known pixels pass through exactly
    level_diff = np.abs(got - np.rint(expected))
    assert level_diff.max() <= 1, level_diff.max()
    assert not np.any((level_diff == 1) & ~rounding_may_differ(expected, tol))
    assert not np.array_equal(got[hole], pixels[hole].astype(np.float64))  # the hole was filled
    return int((level_diff == 1).sum())


def photo(height: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random 8-bit pixels and a box hole (away from the border) plus a second small one at the edge."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    hole = np.zeros((height, width), bool)
    hole[height // 4 : height // 2 + 5, width // 4 : width // 4 + 12] = True
    hole[height - 5 :, 2:7] = True
    return pixels, hole


def save_photo(folder: Path, name: str, pixels: np.ndarray, hole: np.ndarray) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(folder / f"{name}.png")
    Image.fromarray(hole.astype(np.uint8) * 255).save(folder / f"{name}_mask.png")
    return folder / f"{name}.png", folder / f"{name}_mask.png"

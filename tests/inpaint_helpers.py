"""Shared by test_runtime.py and test_inpaint.py: one tiny exported model per
test session (made with gantool.export.exporter, the one way to export) and small images.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gantool.runtime.providers import cuda_device_visible

NO_GPU_ONLY = pytest.mark.skipif(cuda_device_visible(), reason="assumes a machine without a GPU")
GPU_ONLY = pytest.mark.skipif(not cuda_device_visible(), reason="needs an NVIDIA GPU")


@dataclass(frozen=True)
class ExportedModel:
    checkpoint: Path
    folder: Path  # generator.onnx, generator_fp16.onnx, generator.torchscript.pt, generator.safetensors

    @property
    def onnx(self) -> Path:
        return self.folder / "generator.onnx"

    @property
    def torchscript(self) -> Path:
        return self.folder / "generator.torchscript.pt"

    @property
    def safetensors(self) -> Path:
        return self.folder / "generator.safetensors"


_CACHE: dict[str, ExportedModel] = {}  # one export per session, however many modules ask


@pytest.fixture(scope="session")
def exported_model(checkpoint_factory: Callable[..., Path]) -> ExportedModel:
    """A briefly trained tiny generator (train size 32, stride 4), exported once."""
    if "model" not in _CACHE:
        from gantool.export.exporter import export_generator

        checkpoint = checkpoint_factory("trained", seed=3, step=4, phase="g")
        result = export_generator(checkpoint, checkpoint.parent.parent / "export", fp16=True, verify=False)
        _CACHE["model"] = ExportedModel(checkpoint, result.out_dir)
    return _CACHE["model"]


def textured_rgb(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise: uint8 H x W x 3."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / max(width, 1), y / max(height, 1), 0.5 + 0.4 * np.sin(x / 5 + y / 7)], axis=2)
    noisy = base * 200 + rng.integers(0, 50, (height, width, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def box_mask_image(height: int, width: int, top: int, left: int, bottom: int, right: int) -> Image.Image:
    mask = np.zeros((height, width), np.uint8)
    mask[top:bottom, left:right] = 255
    return Image.fromarray(mask)


def hole_of(mask_path: Path) -> np.ndarray:
    return np.asarray(Image.open(mask_path).convert("L")) > 127

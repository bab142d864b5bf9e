"""gantool: train, export and run GLCIC-style image-inpainting GANs.

Heavy modules (torch, onnxruntime) are imported lazily so ``import gantool``
and ``gantool --help`` stay fast and free of side effects.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Inpainter": "gantool.inference.inpainter",
    "ModelConfig": "gantool.core.config",
    "TrainConfig": "gantool.core.config",
    "CompletionNetwork": "gantool.nn.networks",
    "ContextDiscriminator": "gantool.nn.networks",
    "GantoolError": "gantool.core.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gantool' has no attribute {name!r}")

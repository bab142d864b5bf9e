"""Enumerations and inference defaults, defined once.

The library validates against these tuples and the command line builds its
``click.Choice`` lists and defaults from them, so adding a value is one edit.
Training defaults live on :class:`gantool.config.TrainConfig` (the dataclass
fields), model defaults on :class:`gantool.config.ModelConfig`.
"""

from __future__ import annotations

# Where a model runs: ONNX Runtime execution providers, or the torch device.
PROVIDERS = ("auto", "cuda", "tensorrt", "cpu")
# How a model file is run ("auto" picks from the file; see gantool.artifacts).
BACKENDS = ("onnx", "torchscript", "eager")
BACKEND_CHOICES = ("auto", *BACKENDS)
# Numerics of the model that runs ("auto": the exported fp16 ONNX model on a GPU).
PRECISIONS = ("auto", "fp32", "fp16")
# Where the model runs on an image (see gantool.inference).
STRATEGIES = ("auto", "full", "crop", "resize")
# Training / evaluation hole shapes (see gantool.masks).
MASK_KINDS = ("box", "free", "mixed")
# Training devices.
DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")

# Inference defaults, shared by the CLI, the Python API and the benchmarks.
DEFAULT_PROVIDER = "auto"
DEFAULT_BACKEND = "auto"
DEFAULT_PRECISION = "auto"
DEFAULT_STRATEGY = "auto"
DEFAULT_INPAINT_BATCH = 4
# ``auto`` switches from ``full`` to ``crop`` when max(H, W) > AUTO_CROP_FACTOR * train size.
AUTO_CROP_FACTOR = 2
# ``crop`` context around each hole, as a fraction of the train size.
CROP_MARGIN_FRACTION = 0.25

# `gantool eval`'s comparison grid, written beside the command (never inside --data).
DEFAULT_EVAL_GRID = "eval_grid.png"

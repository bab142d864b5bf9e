"""The base of every inference backend (:mod:`gantool.runtime.backends`): one signature,
``run(image, mask) -> inpainted``, and the checks every backend shares: weights that are
finite and are what the file records, inputs of the right shape, a finite output, and
the memory of a large run given back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.artifacts import META_PRECISION, config_from_metadata
from gantool.core.config import ModelConfig
from gantool.core.errors import InputError, ModelError, first_line
from gantool.runtime.memory import trim_heap
from gantool.runtime.weights import check_file_weights, refuse_non_finite, refuse_non_finite_output


class Backend:
    """What every backend has; subclasses implement :meth:`_run`.

    Every backend hands its weights to this constructor (``weights``: name -> tensor or
    array, whatever its file holds), which refuses non-finite ones and ones that are not
    what the file's ``gantool.file_weights_sha256`` records, and every run's
    output passes :func:`gantool.runtime.weights.refuse_non_finite_output`: one rule,
    one message, whatever runs the model.
    """

    name = "backend"
    precision_note = "as requested"  # why this precision runs (set by load_backend for --precision auto)

    def __init__(
        self, path: Path, metadata: dict[str, str], provider: str, provider_note: str, *, weights: Mapping[str, Any]
    ) -> None:
        refuse_non_finite(path, weights)  # first: a NaN file gets the NaN message, whatever it records
        check_file_weights(path, weights, metadata)
        self.path = path
        self.metadata = metadata
        self.config: ModelConfig = config_from_metadata(metadata, path)
        self.provider = provider
        self.provider_note = provider_note

    @property
    def size_multiple(self) -> int:
        return self.config.stride

    @property
    def train_size(self) -> int:
        return self.config.size

    @property
    def precision(self) -> str:
        return self.metadata.get(META_PRECISION, "fp32")

    def run(self, image: np.ndarray, mask: np.ndarray, release_memory_pixels: int = 0) -> np.ndarray:
        """Inpaint NCHW float32 ``image`` (N x 3 x H x W) with ``mask`` (N x 1 x H x W, 1 = hole).

        H and W must be multiples of :attr:`size_multiple` (pad with
        :func:`gantool.core.processing.pad_to_multiple`). Returns N x 3 x H x W float32.
        A run over at least ``release_memory_pixels`` pixels (N x H x W) gives the memory it
        needed back to the system (:meth:`_run_releasing`, then glibc's heap trimmed); 0: never
        (the CLI; the server passes its ``--release-memory-pixels``).
        """
        image, mask = self._check_inputs(image, mask)
        n, _, height, width = image.shape
        release = 0 < release_memory_pixels <= n * height * width
        try:
            out = self._run_releasing(image, mask) if release else self._run(image, mask)
        except MemoryError:
            raise ModelError(f"out of memory running {image.shape[0]}x{image.shape[2]}x{image.shape[3]}") from None
        except Exception as e:  # backend libraries raise their own types; report one line
            raise ModelError(f"{self.name} backend failed: {first_line(e)}") from None
        out = np.asarray(out, dtype=np.float32)
        refuse_non_finite_output(out, f"{self.path.name}, {self.name} on {self.provider}")
        if release:
            trim_heap()
        return out

    def _check_inputs(self, image: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if image.ndim != 4 or image.shape[1] != 3:
            raise InputError(f"image must be N x 3 x H x W, got shape {image.shape}")
        n, _, height, width = image.shape
        if mask.shape != (n, 1, height, width):
            raise InputError(f"mask must be {n} x 1 x {height} x {width}, got shape {mask.shape}")
        m = self.size_multiple
        if height % m or width % m or height == 0 or width == 0:
            raise InputError(f"H and W must be positive multiples of {m}, got {height} x {width} (pad first)")
        return (
            np.ascontiguousarray(image, dtype=np.float32),
            np.ascontiguousarray(mask, dtype=np.float32),
        )

    def _run(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _run_releasing(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """:meth:`_run`, then free what the runtime keeps for reuse (where it can be asked to)."""
        return self._run(image, mask)

    def describe(self) -> str:
        return f"{self.name} on {self.provider}"

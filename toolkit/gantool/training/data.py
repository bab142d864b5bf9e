"""Training data: the samples (crops and seeded masks) of a source, and the step-to-sample mapping.

The sources (a folder, a list file, WebDataset shards, synthetic images) are in
:mod:`gantool.training.sources` and :mod:`gantool.training.shards`, their file
index in :mod:`gantool.training.index`, the crops in :mod:`gantool.training.crops`;
their names stay importable from here.

Every sample is addressed by ``(index, sample_seed)``: crops, flips and masks
come from a generator seeded with ``sample_seed`` alone, so a batch depends on
nothing but the run seed and the step. That makes ``--resume`` exact and
DataLoader workers / DDP ranks deterministic without shared RNG state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gantool.core.errors import InputError
from gantool.core.processing import LUMA_WEIGHTS
from gantool.nn.masks import generate_mask
from gantool.training.crops import random_crop_resize, random_scaled_crop
from gantool.training.index import scan_folder
from gantool.training.readers import DECODE_CACHE_BYTES, IndexedSource
from gantool.training.sources import (
    SYNTHETIC,
    AnySource,
    ImageFolderSource,
    ImageListSource,
    SyntheticSource,
    check_data_unchanged,
    data_fingerprint,
    open_source,
    report_source,
    report_unreadable,
)

log = logging.getLogger(__name__)

__all__ = [  # the sources, their index and the crops stay importable from here
    "DECODE_CACHE_BYTES",
    "SYNTHETIC",
    "ImageFolderSource",
    "ImageListSource",
    "ImageScan",
    "IndexedSource",
    "SyntheticSource",
    "check_data_unchanged",
    "data_fingerprint",
    "find_images",
    "open_source",
    "random_crop_resize",
    "random_scaled_crop",
    "report_source",
    "report_unreadable",
    "scan_images",
    "GREY_SHARE",
    "InpaintingDataset",
    "StepBatchSampler",
    "estimate_fill",
    "holdout_count",
    "shuffle_channels",
    "validation_batch",
]


@dataclass
class ImageScan:
    """The image files under a folder, and how many of them came through symbolic links."""

    paths: list[Path]
    linked: int = 0  # images reached through a linked folder (or linked themselves)
    repeated: list[Path] = field(default_factory=list)  # links to a folder already walked (a loop, an alias)


def scan_images(root: str | Path) -> ImageScan:
    """Every image file under ``root``, recursively and through folder links, sorted for
    reproducibility (:func:`~gantool.training.index.scan_folder`; no index is kept). A folder is
    walked once, whatever the links to it: its later appearances are listed in ``repeated``."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"data folder not found: {root}")
    if not root.is_dir():
        raise InputError(f"--data must be a folder of images (or 'synthetic'), got a file: {root}")
    index = scan_folder(root)
    return ImageScan([root / n for n in index.names], index.linked, [Path(r) for r in index.repeated])


def find_images(root: str | Path) -> list[Path]:
    """All image files under ``root`` (recursive, through folder links), sorted for reproducibility."""
    return scan_images(root).paths


def shuffle_channels(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``image`` (3 x H x W) with its channels in a random order, or, one time in GREY_SHARE, grey
    (:data:`~gantool.core.processing.LUMA_WEIGHTS` in all three): the colour statistics of the data no longer favour one hue."""
    if rng.random() < 1.0 / GREY_SHARE:
        luma = np.tensordot(LUMA_WEIGHTS, image, axes=1).astype(np.float32)
        return np.ascontiguousarray(np.broadcast_to(luma, image.shape))
    return np.ascontiguousarray(image[rng.permutation(3)])


GREY_SHARE = 8  # one crop in 8 made grey by --channel-shuffle


class InpaintingDataset(torch.utils.data.Dataset):
    """``dataset[(index, sample_seed)] -> (image 3xSxS, mask 1xSxS, corner (2,))``."""

    def __init__(
        self,
        source: AnySource,
        size: int,
        local_size: int,
        mask_kind: str = "box",
        hole_range: tuple[int, int] | None = None,
        channel_shuffle: bool = False,
    ) -> None:
        self.source, self.size, self.local_size = source, size, local_size
        self.mask_kind, self.hole_range = mask_kind, hole_range
        self.channel_shuffle = channel_shuffle

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index, sample_seed = key
        rng = np.random.default_rng(sample_seed)
        image = self.source.load(index, self.size, rng)
        mask, corner = generate_mask(self.mask_kind, rng, self.size, self.local_size, self.hole_range)
        if self.channel_shuffle:  # drawn last, and only when on: crops and holes stay what they were
            image = shuffle_channels(image, rng)
        return torch.from_numpy(image), torch.from_numpy(mask[None]), torch.tensor(corner)


class StepBatchSampler(torch.utils.data.Sampler):
    """Yields one list of ``(index, sample_seed)`` keys per training step.

    The global batch for step ``s`` is positions ``[s*B, (s+1)*B)`` of an endless
    sequence of per-epoch permutations (epoch ``e`` shuffled with seed
    ``(seed, e)``); rank ``r`` of ``world`` takes its contiguous share.
    """

    def __init__(
        self,
        num_items: int,
        global_batch: int,
        seed: int,
        start_step: int,
        end_step: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if global_batch % world_size:
            raise InputError(f"--batch-size {global_batch} must be divisible by the {world_size} processes")
        self.num_items, self.global_batch, self.seed = num_items, global_batch, seed
        self.start_step, self.end_step = start_step, end_step
        self.rank, self.world_size = rank, world_size
        self._cached: tuple[int, np.ndarray] | None = None  # (epoch, permutation)

    def __len__(self) -> int:
        return max(0, self.end_step - self.start_step)

    def _permutation(self, epoch: int) -> np.ndarray:
        # Cached: recomputing it per sample costs ~0.6 s per batch on a million images.
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, np.random.default_rng([self.seed, epoch, 1]).permutation(self.num_items))
        return self._cached[1]

    def batch_keys(self, step: int) -> list[tuple[int, int]]:
        per_rank = self.global_batch // self.world_size
        first = step * self.global_batch + self.rank * per_rank
        keys = []
        for position in range(first, first + per_rank):
            epoch, offset = divmod(position, self.num_items)
            index = int(self._permutation(epoch)[offset])
            sample_seed = int(np.random.SeedSequence([self.seed, position, 2]).generate_state(1)[0])
            keys.append((index, sample_seed))
        return keys

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for step in range(self.start_step, self.end_step):
            yield self.batch_keys(step)


def holdout_count(source: AnySource, val_images: int) -> int:
    """How many images to hold out for validation: the last ones of the sorted list,
    at most a fifth of a folder. Synthetic data holds out images never generated for training."""
    if isinstance(source, SyntheticSource):
        return val_images
    return min(val_images, len(source) // 5)


def validation_batch(
    source: AnySource,
    count: int,
    size: int,
    local_size: int,
    mask_kind: str,
    hole_range: tuple[int, int] | None,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed batch with fixed masks (the same every time it is built): the
    held-out images, or the first ``count`` images when nothing is held out."""
    if isinstance(source, SyntheticSource):
        indices = [source.count + i for i in range(count)]
    else:
        held = holdout_count(source, count)
        indices = list(range(len(source) - held, len(source))) if held else list(range(min(count, len(source))))
    items = []
    for k, i in enumerate(indices):
        rng = np.random.default_rng(seed * 1_000_003 + k)
        try:  # exactly this image: a held-out one is never replaced by a training image
            image = source.load_exact(i, size, rng) if isinstance(source, IndexedSource) else source.load(i, size, rng)
        except InputError as e:
            log.warning("validation leaves out an image it cannot read: %s", e)
            continue
        mask, corner = generate_mask(mask_kind, rng, size, local_size, hole_range)
        items.append((torch.from_numpy(image), torch.from_numpy(mask[None]), torch.tensor(corner)))
    if not items:
        raise InputError(f"none of the {len(indices)} validation image(s) could be read")
    return tuple(torch.stack(t) for t in zip(*items))  # type: ignore[return-value]


def estimate_fill(
    source: AnySource, size: int, limit: int = 64, channel_shuffle: bool = False
) -> tuple[float, float, float]:
    """The mean pixel over up to ``limit`` training images (GLCIC fills holes with it); with
    ``channel_shuffle`` the mean the network sees, over :func:`shuffle_channels`' outcomes (a grey)."""
    n = min(limit, len(source))
    rng = np.random.default_rng(0)
    total = np.zeros(3, np.float64)
    for i in range(n):
        total += source.load(i, size, rng).mean(axis=(1, 2))
    mean = total / max(n, 1)
    if channel_shuffle:  # every permutation alike, one crop in GREY_SHARE grey
        grey = 1.0 / GREY_SHARE
        mean = np.full(3, (1 - grey) * mean.mean() + grey * float(LUMA_WEIGHTS @ mean))
    return tuple(float(v) for v in mean)  # type: ignore[return-value]

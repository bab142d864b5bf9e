"""Training data: an image folder or synthetic images, plus seeded masks.

Every sample is addressed by ``(index, sample_seed)``: crops, flips and masks
come from a generator seeded with ``sample_seed`` alone, so a batch depends on
nothing but the run seed and the step. That makes ``--resume`` exact and
DataLoader workers / DDP ranks deterministic without shared RNG state.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from gantool.core.errors import InputError
from gantool.core.processing import IMAGE_EXTENSIONS, LUMA_WEIGHTS, image_to_array, read_image
from gantool.nn.masks import generate_mask

log = logging.getLogger(__name__)

SYNTHETIC = "synthetic"
DECODE_CACHE_BYTES = 1 << 30  # decoded RGB bytes of a folder kept in memory per process (see ImageFolderSource)


@dataclass
class ImageScan:
    """The image files under a folder, and how many of them came through symbolic links."""

    paths: list[Path]
    linked: int = 0  # images reached through a linked folder (or linked themselves)
    repeated: list[Path] = field(default_factory=list)  # links to a folder already walked (a loop, an alias)


def scan_images(root: str | Path) -> ImageScan:
    """Every image file under ``root``, recursively and through folder links, sorted for
    reproducibility. A folder is walked once, whatever the links to it (a link to an ancestor,
    a cycle, two links to one folder): its later appearances are listed in ``repeated``. Links
    may point outside ``root``; the paths keep the linked names, so they stay under ``root``."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"data folder not found: {root}")
    if not root.is_dir():
        raise InputError(f"--data must be a folder of images (or 'synthetic'), got a file: {root}")
    found: list[Path] = []
    linked_dirs: set[str] = set()
    seen: set[tuple[int, int]] = set()
    scan = ImageScan(found)
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()  # which of two links to one folder is walked must not depend on the file system
        try:
            st = os.stat(folder)
        except OSError:
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            scan.repeated.append(Path(folder))
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        via_link = folder in linked_dirs
        for name in dirs:
            child = os.path.join(folder, name)
            if via_link or os.path.islink(child):
                linked_dirs.add(child)
        for name in files:
            path = Path(folder, name)
            if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file():
                found.append(path)
                scan.linked += via_link or path.is_symlink()
    found.sort()
    return scan


def find_images(root: str | Path) -> list[Path]:
    """All image files under ``root`` (recursive, through folder links), sorted for reproducibility."""
    return scan_images(root).paths


def random_crop_resize(img: Image.Image, size: int, rng: np.random.Generator) -> np.ndarray:
    """Random scale (shorter side between ``size`` and its own length), random
    square crop, random horizontal flip -> float32 3 x size x size."""
    width, height = img.size
    short = min(width, height)
    target = int(rng.integers(size, max(size, short) + 1))
    scale = target / short
    new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
    if (new_w, new_h) != (width, height):
        img = img.resize((new_w, new_h), Image.Resampling.BICUBIC, reducing_gap=3.0)
    left = int(rng.integers(0, new_w - size + 1))
    top = int(rng.integers(0, new_h - size + 1))
    arr = image_to_array(img.crop((left, top, left + size, top + size)))
    if rng.random() < 0.5:
        arr = arr[:, ::-1]
    return np.ascontiguousarray(np.clip(arr, 0.0, 1.0).transpose(2, 0, 1))


def random_scaled_crop(
    img: Image.Image, size: int, scale_range: tuple[float, float], rng: np.random.Generator
) -> np.ndarray:
    """A square window whose side is ``size`` times a log-uniform factor in ``scale_range``
    (capped by the image's shorter side), at a random place, resized to ``size``, flipped
    at random -> float32 3 x size x size. One resize straight from the window (PIL's
    ``box``), so a large photo is never scaled as a whole per sample."""
    width, height = img.size
    short = min(width, height)
    high = min(scale_range[1] * size, short)
    low = min(scale_range[0] * size, high)
    side = max(1, int(round(math.exp(rng.uniform(math.log(low), math.log(high))))))
    left = int(rng.integers(0, width - side + 1))
    top = int(rng.integers(0, height - side + 1))
    window = (left, top, left + side, top + side)
    arr = image_to_array(img.resize((size, size), Image.Resampling.BICUBIC, box=window, reducing_gap=3.0))
    if rng.random() < 0.5:
        arr = arr[:, ::-1]
    return np.ascontiguousarray(np.clip(arr, 0.0, 1.0).transpose(2, 0, 1))


class ImageFolderSource:
    """Readable images under a folder. Unreadable files are skipped and counted."""

    def __init__(self, root: str | Path, scale_range: tuple[float, float] | None = None) -> None:
        self.root = Path(root)
        # None: the crop's shorter side is drawn between the size and the image's own (random_crop_resize).
        self.scale_range = scale_range
        scan = scan_images(self.root)
        candidates = scan.paths
        self.linked, self.repeated = scan.linked, scan.repeated
        self.paths: list[Path] = []
        self.skipped: list[Path] = []
        decoded_bytes = 0
        for path in candidates:
            try:
                with Image.open(path) as img:
                    decoded_bytes += img.width * img.height * 3
                    img.verify()  # header and structure, without a full decode
                self.paths.append(path)
            except Exception:
                self.skipped.append(path)
        if not self.paths:
            found = f"{len(candidates)} candidate file(s), none readable" if candidates else "no image files"
            raise InputError(f"no readable images in {self.root} ({found}; extensions: {', '.join(IMAGE_EXTENSIONS)})")
        self.candidates = candidates
        self.train_count = len(self.paths)  # set by the loop to the images before the held-out ones
        # Images found undecodable, shared with DataLoader workers (a tensor in shared
        # memory), so each is warned about once per run, not once per worker and epoch.
        self.bad = torch.zeros(len(self.paths), dtype=torch.bool).share_memory_()
        # A folder whose decoded pixels fit in DECODE_CACHE_BYTES is decoded once per process
        # (each DataLoader worker keeps its own copy), not once per sample: a few dozen large
        # photographs would otherwise cost a full decode for every 96-160 px crop. The cache
        # changes no value, so resume stays bitwise with or without it.
        self.cache_decoded = decoded_bytes <= DECODE_CACHE_BYTES
        self._decoded: dict[int, Image.Image] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def load_exact(self, index: int, size: int, rng: np.random.Generator) -> np.ndarray:
        """Image ``index`` cropped, or InputError (undecodable, or NaN / infinite pixels)."""
        path = self.paths[index]
        img = self._decoded.get(index)
        if img is None:
            img = read_image(path)
            if self.cache_decoded:
                self._decoded[index] = img
        if self.scale_range is None:
            arr = random_crop_resize(img, size, rng)
        else:
            arr = random_scaled_crop(img, size, self.scale_range, rng)
        if not np.isfinite(arr).all():
            raise InputError(f"image {path} has NaN or infinite pixel values")
        return arr

    def load(self, index: int, size: int, rng: np.random.Generator) -> np.ndarray:
        # A file that passed verify() can still fail to decode (truncated data): use
        # the next training images instead of crashing a long run (never a held-out one).
        pool = self.train_count if index < self.train_count else len(self.paths)
        for attempt in range(pool):
            i = (index + attempt) % pool
            if self.bad[i]:
                continue
            try:
                return self.load_exact(i, size, rng)
            except InputError as e:
                if not self.bad[i]:
                    self.bad[i] = True
                    log.warning("skipping unreadable image (it is left out from now on): %s", e)
        raise InputError(f"no image in {self.root} could be decoded")

    def fingerprint(self) -> dict[str, Any]:
        """The folder's absolute path and a digest of its image files' names, sizes and mtimes."""
        digest = hashlib.sha256()
        total = 0
        for path in self.candidates:
            try:
                st = path.stat()
            except OSError:
                continue
            total += st.st_size
            name = path.relative_to(self.root).as_posix().encode("utf-8", "surrogateescape")
            digest.update(name + b"\0" + f"{st.st_size}:{st.st_mtime_ns}".encode() + b"\n")
        return {
            "path": str(self.root.resolve()),  # absolute and normalised (no "sub/..")
            "files": len(self.candidates),
            "bytes": total,
            "sha256": digest.hexdigest(),
        }


class SyntheticSource:
    """Procedural images (gradients, shapes, stripes): for tests and quick demos."""

    def __init__(self, count: int = 4096, seed: int = 0) -> None:
        self.count, self.seed = count, seed
        self.skipped: list[Path] = []
        self.train_count = count

    def fingerprint(self) -> dict[str, Any]:
        return {"path": SYNTHETIC, "files": self.count, "bytes": 0, "sha256": f"synthetic seed {self.seed}"}

    def __len__(self) -> int:
        return self.count

    def load(self, index: int, size: int, rng: np.random.Generator) -> np.ndarray:
        # The picture depends on the index only; ``rng`` (per sample) adds a flip.
        g = np.random.default_rng([self.seed, index, 7919])
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1)
        c0, c1 = g.uniform(0, 1, 3), g.uniform(0, 1, 3)
        angle = g.uniform(0, 2 * math.pi)
        t = (np.cos(angle) * xx + np.sin(angle) * yy + 1.5) / 3.0
        base = (c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]) * 255
        img = Image.fromarray(base.astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(int(g.integers(2, 6))):
            x0, y0 = g.uniform(-0.2, 1.0, 2) * size
            w, h = g.uniform(0.15, 0.6, 2) * size
            color = tuple(int(v) for v in g.integers(0, 256, 3))
            shape = int(g.integers(0, 3))
            if shape == 0:
                draw.ellipse((x0, y0, x0 + w, y0 + h), fill=color)
            elif shape == 1:
                draw.rectangle((x0, y0, x0 + w, y0 + h), fill=color)
            else:
                draw.line((x0, y0, x0 + w, y0 + h), fill=color, width=max(1, int(size / 20)))
        arr = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0
        if rng.random() < 0.5:
            arr = arr[:, :, ::-1]
        return np.ascontiguousarray(arr)


def open_source(
    data: str, seed: int = 0, scale_range: tuple[float, float] | None = None
) -> ImageFolderSource | SyntheticSource:
    """The training images: ``synthetic`` or a folder (cropped at ``scale_range``, see
    :func:`random_scaled_crop`; synthetic images are drawn at the training size)."""
    return SyntheticSource(seed=seed) if data == SYNTHETIC else ImageFolderSource(data, scale_range)


def report_source(source: ImageFolderSource | SyntheticSource, data: str) -> None:
    """The start-up lines about a data folder: images through links, links skipped, unreadable files."""
    if not isinstance(source, ImageFolderSource):
        return
    if source.linked:
        log.info("data: %d of %d image(s) came through folder links in %s", source.linked, len(source.candidates), data)
    if source.repeated:
        log.warning(
            "data: %d linked folder(s) skipped, each already read (a loop or a second link; first: %s)",
            len(source.repeated), source.repeated[0],
        )  # fmt: skip
    if source.skipped:
        log.warning("skipped %d unreadable file(s) in %s (first: %s)", len(source.skipped), data, source.skipped[0])


def data_fingerprint(source: ImageFolderSource | SyntheticSource, data: str) -> dict[str, Any]:
    """What a checkpoint records about its data (:meth:`ImageFolderSource.fingerprint`)."""
    return source.fingerprint()


def check_data_unchanged(saved: Any, now: dict[str, Any], allowed: bool) -> None:
    """Refuse (one line saying what differs) to resume on data other than the checkpoint's.

    ``allowed`` (``--allow-data-change``) turns the refusal into a warning.
    Checkpoints from before fingerprints were recorded are not checked.
    """
    if not isinstance(saved, dict) or "sha256" not in saved:
        return
    differs = []
    if saved.get("path") != now["path"]:
        differs.append(f"folder {saved.get('path')} -> {now['path']}")
    if saved.get("files") != now["files"]:
        differs.append(f"{saved.get('files')} -> {now['files']} image files")
    elif saved.get("bytes") != now["bytes"]:
        differs.append(f"{saved.get('bytes')} -> {now['bytes']} bytes")
    if not differs and saved.get("sha256") != now["sha256"]:
        differs.append("the same number of files, but names, sizes or modification times changed")
    if not differs:
        return
    what = "; ".join(differs)
    if allowed:
        log.warning("resuming on other data (--allow-data-change): %s", what)
        return
    raise InputError(
        f"--resume: the data differs from what the checkpoint trained on ({what}); "
        "to continue on this data, add --allow-data-change"
    )


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
        source: ImageFolderSource | SyntheticSource,
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


def holdout_count(source: ImageFolderSource | SyntheticSource, val_images: int) -> int:
    """How many images to hold out for validation: the last ones of the sorted list,
    at most a fifth of a folder. Synthetic data holds out images never generated for training."""
    if isinstance(source, SyntheticSource):
        return val_images
    return min(val_images, len(source) // 5)


def validation_batch(
    source: ImageFolderSource | SyntheticSource,
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
            image = (
                source.load_exact(i, size, rng) if isinstance(source, ImageFolderSource) else source.load(i, size, rng)
            )
        except InputError as e:
            log.warning("validation leaves out an image it cannot read: %s", e)
            continue
        mask, corner = generate_mask(mask_kind, rng, size, local_size, hole_range)
        items.append((torch.from_numpy(image), torch.from_numpy(mask[None]), torch.tensor(corner)))
    if not items:
        raise InputError(f"none of the {len(indices)} validation image(s) could be read")
    return tuple(torch.stack(t) for t in zip(*items))  # type: ignore[return-value]


def estimate_fill(
    source: ImageFolderSource | SyntheticSource, size: int, limit: int = 64, channel_shuffle: bool = False
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

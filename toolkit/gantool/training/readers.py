"""Images read by index: the base every training source shares (the decode cache, undecodable
images skipped and counted, the crops), and the small parsers of ``--data`` (list files, patterns).

The sources themselves are in :mod:`gantool.training.sources` and :mod:`gantool.training.shards`.
"""

from __future__ import annotations

import glob
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import torch
from PIL import Image

from gantool.core.errors import InputError
from gantool.core.processing import read_image
from gantool.training.crops import random_crop_resize, random_scaled_crop
from gantool.training.index import RUN_INDEX_FILE, DataIndex, write_index

log = logging.getLogger(__name__)

# Decoded RGB bytes kept in memory per process (each DataLoader worker keeps its own): a few
# dozen large photographs would otherwise cost a full decode for every 96-160 px crop. Images
# are kept as they are first read until the budget is spent; the cache changes no value, so
# resume stays bitwise with or without it.
DECODE_CACHE_BYTES = 1 << 30
LIST_COMMENT = "#"


class PathList(Sequence[Path]):
    """``root / name`` for each name of an index, made on demand (a million Paths cost ~200 MB)."""

    def __init__(self, root: Path, names: Sequence[str]) -> None:
        self.root, self.names = root, names

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, i: int) -> Path: ...
    @overload
    def __getitem__(self, i: slice) -> list[Path]: ...
    def __getitem__(self, i: int | slice) -> Path | list[Path]:
        if isinstance(i, slice):
            return [self.root / n for n in self.names[i]]
        return self.root / self.names[i]


class IndexedSource:
    """Images addressed by index, read and decoded on demand; undecodable ones skipped and counted."""

    kind = "indexed"

    def __init__(self, index: DataIndex, scale_range: tuple[float, float] | None = None) -> None:
        self.index = index
        # None: the crop's shorter side is drawn between the size and the image's own (random_crop_resize).
        self.scale_range = scale_range
        if len(index) == 0:
            raise InputError(self.empty_message())
        self.train_count = len(index)  # set by the loop to the images before the held-out ones
        # Images found undecodable, shared with DataLoader workers (a tensor in shared
        # memory), so each is warned about once per run, not once per worker and epoch.
        self.bad = torch.zeros(len(index), dtype=torch.bool).share_memory_()
        # A data set whose files alone exceed the budget cannot fit decoded (decoded pixels take at
        # least what their files do), and caching the first images met would only cost memory in
        # every worker: it is decoded per sample, as before the index.
        self.cache_decoded = int(index.sizes.sum()) <= DECODE_CACHE_BYTES
        self._decoded: dict[int, Image.Image] = {}
        self._decoded_bytes = 0

    # ------------------------------------------------------------------ what a source defines

    def empty_message(self) -> str:
        return "no images"

    def describe(self, index: int) -> str:
        """How an entry is named in messages (its path, or shard and member)."""
        raise NotImplementedError

    def read(self, index: int) -> Image.Image:
        """Entry ``index`` decoded (InputError when it cannot be)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared behaviour

    def __len__(self) -> int:
        return len(self.index)

    def _image(self, index: int) -> Image.Image:
        img = self._decoded.get(index)
        if img is not None:
            return img
        img = self.read(index)
        cost = img.width * img.height * len(img.getbands())
        if self.cache_decoded and self._decoded_bytes + cost <= DECODE_CACHE_BYTES:
            self._decoded[index] = img
            self._decoded_bytes += cost
        return img

    def load_exact(self, index: int, size: int, rng: np.random.Generator) -> np.ndarray:
        """Image ``index`` cropped, or InputError (undecodable, or NaN / infinite pixels)."""
        img = self._image(index)
        if self.scale_range is None:
            arr = random_crop_resize(img, size, rng)
        else:
            arr = random_scaled_crop(img, size, self.scale_range, rng)
        if not np.isfinite(arr).all():
            raise InputError(f"image {self.describe(index)} has NaN or infinite pixel values")
        return arr

    def load(self, index: int, size: int, rng: np.random.Generator) -> np.ndarray:
        # A file can fail to decode (truncated, not an image): use the next training images
        # instead of crashing a long run (never a held-out one).
        pool = self.train_count if index < self.train_count else len(self)
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
        raise InputError(self.none_readable_message())

    def none_readable_message(self) -> str:
        return f"no image in {self.index.spec} could be decoded ({len(self)} tried)"

    def unreadable(self) -> tuple[int, str | None]:
        """How many entries were found undecodable so far (by this process and its workers), and the first."""
        found = torch.nonzero(self.bad).flatten()
        return int(found.numel()), (self.describe(int(found[0])) if found.numel() else None)

    def mark_unreadable(self, indices: Sequence[int]) -> None:
        """Entries an earlier run of this data found undecodable (a resumed run's count goes on)."""
        for i in indices:
            if 0 <= int(i) < len(self):
                self.bad[int(i)] = True

    def unreadable_indices(self) -> list[int]:
        return [int(i) for i in torch.nonzero(self.bad).flatten().tolist()]

    def status(self) -> dict[str, Any]:
        """What the run's status.json says about the data: the images found unreadable so far."""
        count, first = self.unreadable()
        return {"unreadable_images": count, "first_unreadable": first}

    @property
    def skipped(self) -> list[str]:
        """The entries found undecodable so far."""
        return [self.describe(i) for i in self.unreadable_indices()]

    def fingerprint(self) -> dict[str, Any]:
        return self.index.fingerprint()

    def keep_index(self, run_dir: Path) -> None:
        """Keep this source's index in the run folder, for ``--resume`` (best effort)."""
        write_index(self.index, Path(run_dir) / RUN_INDEX_FILE)


class FileSource(IndexedSource):
    """Image files named by an index, relative to its root."""

    def __init__(self, index: DataIndex, scale_range: tuple[float, float] | None = None) -> None:
        super().__init__(index, scale_range)
        self.root = Path(index.root)
        self.paths = PathList(self.root, index.names)
        self.candidates = self.paths

    def describe(self, index: int) -> str:
        return str(self.paths[index])

    def read(self, index: int) -> Image.Image:
        return read_image(self.paths[index])


def read_list_file(path: Path) -> list[tuple[int, str]]:
    """(line number, name) of each entry of a list file."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read --data {path}: {e.strerror or e}") from None
    if b"\0" in raw[:8192]:
        raise InputError(f"--data {path} is neither a folder, a list of image paths nor a .tar shard (binary file)")
    text = raw.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        name = line.strip()
        if name and not name.startswith(LIST_COMMENT):
            entries.append((number, name))
    return entries


_BRACES = re.compile(r"\{[^{}]*(\.\.|,)[^{}]*\}")


def is_pattern(data: str) -> bool:
    """Whether ``data`` is a shard pattern: ``::``-joined, a brace range / list, or a glob."""
    return "::" in data or bool(_BRACES.search(data)) or glob.has_magic(data)

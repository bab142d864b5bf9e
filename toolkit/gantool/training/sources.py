"""Where training images come from: a folder, a list file, WebDataset shards, or synthetic images.

Every source is a sequence of images addressed by index, opened from a
:class:`~gantool.training.index.DataIndex` (no file is opened before step 1):

- :class:`ImageFolderSource`: the image files under a folder (recursive, through links);
- :class:`ImageListSource`: a text file naming images, one per line, relative to its folder;
- :class:`~gantool.training.shards.ShardSource`: tar shards, each member read at its offset;
- :class:`SyntheticSource`: procedural images for tests and demos.

A file that cannot be decoded is found when it is first read: it is warned about
once, replaced by the next training image (never a held-out one) and counted
(:meth:`IndexedSource.unreadable`), which the run's status.json and summary show.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from gantool.core.errors import InputError
from gantool.core.processing import IMAGE_EXTENSIONS
from gantool.training.index import DataIndex, NameTable, cached_index, folder_index, stat_listed, write_index
from gantool.training.readers import (
    FileSource,
    IndexedSource,
    PathList,
    is_pattern,
    read_list_file,
)

log = logging.getLogger(__name__)

SYNTHETIC = "synthetic"


class ImageFolderSource(FileSource):
    """The image files under a folder (recursive, through folder links), in sorted order.

    The file list comes from the folder's index (:func:`~gantool.training.index.folder_index`):
    built once, in parallel, and reused while the folder is unchanged."""

    kind = "folder"

    def __init__(
        self,
        root: str | Path,
        scale_range: tuple[float, float] | None = None,
        index_dirs: Sequence[Path] = (),
        keep_index: bool = False,
    ) -> None:
        root = Path(root)
        spec = str(root.resolve()) if root.exists() else str(root)
        index = folder_index(root, spec, [Path(d) / _run_index() for d in index_dirs], keep_index)
        self.folder = root
        super().__init__(index, scale_range)
        self.root = root  # as given (the index's root is the same folder)
        self.paths = PathList(root, index.names)
        self.candidates = self.paths
        self.linked, self.repeated = index.linked, [Path(r) for r in index.repeated]

    def empty_message(self) -> str:
        return f"no readable images in {self.folder} (no image files; extensions: {', '.join(IMAGE_EXTENSIONS)})"

    def none_readable_message(self) -> str:
        return f"no readable images in {self.folder}: none of its {len(self)} image file(s) could be decoded"


class ImageListSource(FileSource):
    """The images a text file names, one per line, relative to the file's folder (absolute
    names stay absolute); blank lines and lines starting with ``#`` are skipped. The order is
    the list's. A name that is missing (or not a file) is refused when the list is indexed."""

    kind = "list"

    def __init__(
        self,
        list_file: str | Path,
        scale_range: tuple[float, float] | None = None,
        index_dirs: Sequence[Path] = (),
        keep_index: bool = False,
    ) -> None:
        path = Path(list_file)
        spec = str(path.resolve())
        index = list_index(Path(spec), spec, [Path(d) / _run_index() for d in index_dirs], keep_index)
        self.list_file = path
        super().__init__(index, scale_range)

    def empty_message(self) -> str:
        return f"--data {self.list_file}: the list names no images"


def _run_index() -> str:
    from gantool.training.index import RUN_INDEX_FILE

    return RUN_INDEX_FILE


def list_index(path: Path, spec: str, extra: Sequence[Path] = (), keep: bool = True) -> DataIndex:
    """The index of a list file: cached while the list is unchanged; else its files stat'ed in parallel."""
    import time

    from gantool.training.index import beside_data_path, prepare_index_dir

    found = cached_index("list", spec, path.parent if keep else None, extra)
    if found is not None:
        return found
    try:
        st = path.stat()
    except OSError as e:
        raise InputError(f"cannot read --data {path}: {e.strerror or e}") from None
    built_ns = time.time_ns()
    entries = read_list_file(path)
    root = str(path.parent)
    names = [os.path.normpath(name) for _, name in entries]
    stats = stat_listed(root, names)
    missing = [(number, name) for (number, name), s in zip(entries, stats) if s is None]
    if missing:
        number, name = missing[0]
        raise InputError(
            f"--data {path} names {len(missing)} file(s) that do not exist or are not files "
            f"(first: line {number}: {name}, relative to {root}); fix the list"
        )
    index = DataIndex(
        kind="list",
        spec=spec,
        root=root,
        names=NameTable.from_names(names),
        sizes=np.array([s[0] for s in stats if s is not None], np.int64),
        mtimes=np.array([s[1] for s in stats if s is not None], np.int64),
        checks=[(str(path), st.st_size, st.st_mtime_ns)],
        built_ns=built_ns,
    )
    if keep and prepare_index_dir(path.parent):
        write_index(index, beside_data_path(path.parent, "list", spec))
    return index


class SyntheticSource:
    """Procedural images (gradients, shapes, stripes): for tests and quick demos."""

    kind = SYNTHETIC

    def __init__(self, count: int = 4096, seed: int = 0) -> None:
        self.count, self.seed = count, seed
        self.skipped: list[Path] = []
        self.train_count = count

    def fingerprint(self) -> dict[str, Any]:
        return {"path": SYNTHETIC, "files": self.count, "bytes": 0, "sha256": f"synthetic seed {self.seed}"}

    def __len__(self) -> int:
        return self.count

    def unreadable(self) -> tuple[int, str | None]:
        return 0, None

    def unreadable_indices(self) -> list[int]:
        return []

    def mark_unreadable(self, indices: Sequence[int]) -> None:
        pass

    def status(self) -> dict[str, Any]:
        return {"unreadable_images": 0, "first_unreadable": None}

    def keep_index(self, run_dir: Path) -> None:
        pass  # nothing to index

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


# ------------------------------------------------------------------ --data: which source


def normalise_data(data: str) -> str:
    """``--data`` made absolute and normalised (no ``sub/..``) for recording: a path is resolved;
    each ``::`` part of a pattern has its folder resolved, its file-name pattern kept."""
    if data == SYNTHETIC:
        return data
    if not is_pattern(data):
        return str(Path(data).resolve())
    parts = []
    for part in data.split("::"):
        folder, name = os.path.split(part)
        if is_pattern(folder):  # braces in a folder name: keep as written, made absolute
            parts.append(os.path.normpath(os.path.abspath(part)))
        else:
            parts.append(os.path.join(str(Path(folder or ".").resolve()), name))
    return "::".join(parts)


def source_kind(data: str) -> str:
    """What ``--data`` names: "synthetic", "folder", "list" or "shards" (InputError if nothing)."""
    from gantool.training.shards import MANIFEST_NAME, shard_list_file

    if data == SYNTHETIC:
        return SYNTHETIC
    path = Path(data)
    if path.is_dir():
        return "shards" if (path / MANIFEST_NAME).is_file() else "folder"
    if path.is_file():
        if path.name.lower().endswith(".tar"):
            return "shards"
        return "shards" if shard_list_file(path) else "list"
    if is_pattern(data) or data.lower().endswith(".tar"):
        return "shards"
    if path.suffix:
        raise InputError(f"--data file not found: {data}")
    raise InputError(f"data folder not found: {data}")


AnySource = IndexedSource | SyntheticSource


def open_source(
    data: str,
    seed: int = 0,
    scale_range: tuple[float, float] | None = None,
    index_dirs: Sequence[Path] = (),
    keep_index: bool = True,
) -> Any:
    """The training images named by ``--data``: ``synthetic`` (drawn at the training size), a
    folder, a list file, or shards (a .tar, a brace or glob pattern, ``::``-joined patterns, a
    list of .tar files, or a folder ``gantool data pack`` wrote). Crops at ``scale_range``
    (see :func:`~gantool.training.crops.random_scaled_crop`).

    The file list is read from a current index in ``index_dirs`` (a run folder), the launcher's
    or the one beside the data, else built (and kept beside the data when ``keep_index``)."""
    kind = source_kind(data)
    if kind == SYNTHETIC:
        return SyntheticSource(seed=seed)
    if kind == "folder":
        return ImageFolderSource(data, scale_range, index_dirs, keep_index)
    if kind == "list":
        return ImageListSource(data, scale_range, index_dirs, keep_index)
    from gantool.training.shards import ShardSource

    return ShardSource(data, scale_range, index_dirs, keep_index)


def report_source(source: Any, data: str) -> None:
    """The start-up lines about a data folder: images through links, links skipped, shard samples without images."""
    if isinstance(source, ImageFolderSource):
        if source.linked:
            log.info("data: %d of %d image(s) came through folder links in %s", source.linked, len(source), data)
        if source.repeated:
            log.warning(
                "data: %d linked folder(s) skipped, each already read (a loop or a second link; first: %s)",
                len(source.repeated), source.repeated[0],
            )  # fmt: skip
    notes = getattr(getattr(source, "index", None), "notes", {}) or {}
    if notes.get("without_image"):
        log.warning(
            "data: %d sample(s) in the shards hold no image member and are left out (first: %s)",
            notes["without_image"], notes.get("first_without_image"),
        )  # fmt: skip


def report_unreadable(source: Any, data: str) -> None:
    """The line a run ends with when it met undecodable images (they were warned about one by one)."""
    count, first = source.unreadable()
    if count:
        log.warning("skipped %d unreadable image(s) in %s (first: %s)", count, data, first)


def data_fingerprint(source: Any, data: str) -> dict[str, Any]:
    """What a checkpoint records about its data (:meth:`DataIndex.fingerprint`)."""
    return source.fingerprint()


def check_data_unchanged(saved: Any, now: dict[str, Any], allowed: bool) -> None:
    """Refuse (one line saying what differs) to resume on data other than the checkpoint's.

    ``allowed`` (``--allow-data-change``) turns the refusal into a warning.
    Checkpoints from before fingerprints were recorded are not checked.
    """
    if not isinstance(saved, dict) or "sha256" not in saved:
        return
    differs = []
    what = "shard samples" if now.get("kind") == "shards" else "image files"
    if saved.get("path") != now["path"]:
        differs.append(f"{_kind_word(saved)} {saved.get('path')} -> {now['path']}")
    if saved.get("files") != now["files"]:
        differs.append(f"{saved.get('files')} -> {now['files']} {what}")
    elif saved.get("bytes") != now["bytes"]:
        differs.append(f"{saved.get('bytes')} -> {now['bytes']} bytes")
    if not differs and saved.get("sha256") != now["sha256"]:
        changed = "members, offsets or sizes" if now.get("kind") == "shards" else "names, sizes or modification times"
        differs.append(f"the same number of {what}, but {changed} changed")
    if not differs:
        return
    text = "; ".join(differs)
    if allowed:
        log.warning("resuming on other data (--allow-data-change): %s", text)
        return
    raise InputError(
        f"--resume: the data differs from what the checkpoint trained on ({text}); "
        "to continue on this data, add --allow-data-change"
    )


def _kind_word(saved: dict[str, Any]) -> str:
    return {"shards": "shards", "list": "list"}.get(str(saved.get("kind")), "folder")

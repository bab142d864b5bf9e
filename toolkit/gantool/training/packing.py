"""``gantool data pack`` and ``gantool data check``: images into WebDataset shards, and a data set's health.

:func:`pack_images` writes the images of a folder or a list file into tar shards with
webdataset's ``ShardWriter``, each image's bytes as stored (no re-encode) under a
sequential key (``000000123.jpg``), and a manifest (:data:`~gantool.training.shards.MANIFEST_NAME`)
with each shard's sample count, size and SHA-256, their digest, and the source's
fingerprint. The output folder is written whole (a hidden stage beside it, renamed
into place): a killed pack leaves no partial output, and an existing non-empty
folder is never written into. The shards' index is kept with them, so the first
training run on them starts at once.

:func:`check_data` reads every image of a folder, list or shard set and reports
counts, sizes, unreadable images, samples without an image, and broken shards.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from PIL import Image

from gantool import __version__
from gantool.core.errors import GantoolError, InputError
from gantool.core.fileio import atomic_write_text, commit_staged_folder, staged_folder
from gantool.core.processing import DECODE_FORMATS
from gantool.training.index import RACY_NS, DataIndex, NameTable, scan_folder, stat_listed
from gantool.training.readers import FileSource, IndexedSource, read_list_file
from gantool.training.shards import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    ShardSource,
    build_shard_index,
    expand_shards,
    scan_shard,
    shard_index,
)
from gantool.training.sources import ImageListSource, normalise_data, source_kind

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 500_000_000  # bytes: webdataset's advice is 100 MB to a few GB per shard
DEFAULT_SHARD_SAMPLES = 100_000  # webdataset's own maxcount default
SHARD_MTIME = 0.0  # every member's tar mtime: packing the same images twice gives the same bytes
REPORTED = 20  # problems listed by name in a report (the rest are counted)


# ------------------------------------------------------------------ pack


def _input_index(data: str) -> DataIndex:
    """The images of a folder or list file to pack (no index is written beside them)."""
    kind = source_kind(data)
    if kind == "folder":
        folder = Path(data)
        index = scan_folder(folder.resolve(), str(folder.resolve()))
    elif kind == "list":
        index = ImageListSource(data, keep_index=False).index
    else:
        raise InputError(f"gantool data pack takes a folder of images or a list file, got {kind}: {data}")
    if not len(index):
        raise InputError(f"no image files to pack in {data}")
    return index


def _check_output(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"-o {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(
            f"-o {out} is not empty; gantool data pack never writes into existing files: choose a new folder"
        )


def pack_images(
    data: str | Path,
    out: str | Path,
    shard_size: int = DEFAULT_SHARD_SIZE,
    shard_samples: int = DEFAULT_SHARD_SAMPLES,
    prefix: str = "train",
    progress: bool = True,
) -> dict[str, Any]:
    """Pack the images of the folder or list ``data`` into shards ``out/PREFIX-NNNNNN.tar``; returns the manifest.

    A file Pillow cannot identify as an image is left out (counted and named in the manifest);
    one that is identified but damaged further in is packed and found when training reads it
    (``gantool data check`` finds it before)."""
    import webdataset as wds
    from tqdm.auto import tqdm

    if shard_size < 1 or shard_samples < 1:
        raise InputError("--shard-size and --shard-samples must be positive")
    if not prefix or "/" in prefix or "%" in prefix or prefix.startswith("."):
        raise InputError(f"--prefix {prefix!r}: a plain file name start (no '/', '%' or leading '.')")
    data, out = str(data), Path(out)
    _check_output(out)
    index = _input_index(data)
    root = Path(index.root)
    counts: dict[str, int] = {}
    skipped: list[str] = []
    packed = 0
    total = int(index.sizes.sum())
    started = time.perf_counter()
    with staged_folder(out) as stage:
        pattern = str(stage / f"{prefix}-%06d.tar")
        # disable=None: no bar where stderr is not a terminal (a log file would keep its frames)
        bar = tqdm(
            total=total, unit="B", unit_scale=True, desc="packing", disable=None if progress else True, leave=False
        )
        try:
            with wds.ShardWriter(
                pattern, maxsize=shard_size, maxcount=shard_samples, verbose=0, mtime=SHARD_MTIME
            ) as w:
                for i, name in enumerate(index.names):
                    path = root / name
                    payload = _image_bytes(path)
                    bar.update(int(index.sizes[i]))
                    if payload is None:
                        skipped.append(name)
                        continue
                    extension = path.suffix.lower().lstrip(".")
                    w.write({"__key__": f"{packed:09d}", extension: payload})
                    packed += 1
                    shard = os.path.basename(str(w.fname))
                    counts[shard] = counts.get(shard, 0) + 1
        except OSError as e:
            raise InputError(f"cannot write shards into {out}: {e.strerror or e}") from None
        finally:
            bar.close()
        if not counts:
            raise InputError(f"none of the {len(index)} file(s) in {data} is an image Pillow can identify")
        for leftover in stage.glob(f"{prefix}-*.tar"):  # ShardWriter opens the next shard before it knows it is unused
            if leftover.name not in counts:
                leftover.unlink()
        manifest = _manifest(stage, counts, skipped, index, prefix, shard_size, shard_samples)
        atomic_write_text(stage / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
        commit_staged_folder(stage, out, remove=[])
    manifest["seconds"] = round(time.perf_counter() - started, 3)
    time.sleep(RACY_NS / 1e9)  # the shards' mtimes fall outside the new index's racy window
    try:
        shard_index(str(out.resolve()), keep=True)  # the first training run on them reads it
    except GantoolError as e:
        log.warning("the shards were written, but could not be indexed: %s", e)
    return manifest


def _image_bytes(path: Path) -> bytes | None:
    """The file's bytes when Pillow identifies them as an image of a format gantool decodes; else None."""
    try:
        payload = path.read_bytes()
        with Image.open(io.BytesIO(payload), formats=DECODE_FORMATS):
            pass
    except Exception:  # Pillow raises many types for what is not an image
        return None
    return payload


def _manifest(
    stage: Path,
    counts: dict[str, int],
    skipped: list[str],
    index: DataIndex,
    prefix: str,
    shard_size: int,
    shard_samples: int,
) -> dict[str, Any]:
    shards: list[dict[str, Any]] = []
    for name in sorted(counts):
        digest = hashlib.sha256()
        with (stage / name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        shards.append({"name": name, "images": counts[name], "bytes": (stage / name).stat().st_size,
                       "sha256": digest.hexdigest()})  # fmt: skip
    overall = hashlib.sha256("".join(f"{s['name']} {s['sha256']}\n" for s in shards).encode()).hexdigest()
    last = sorted(counts)[-1].removeprefix(prefix + "-").removesuffix(".tar")
    return {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "gantool_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pattern": f"{prefix}-{{000000..{last}}}.tar",
        "images": sum(counts.values()),
        "bytes": sum(s["bytes"] for s in shards),
        "sha256": overall,
        "shards": shards,
        "shard_size": shard_size,
        "shard_samples": shard_samples,
        "source": index.fingerprint(),
        "skipped": {"count": len(skipped), "first": skipped[:REPORTED]},
    }


# ------------------------------------------------------------------ check


@dataclass
class DataReport:
    """What ``gantool data check`` found."""

    kind: str
    data: str
    entries: int = 0  # images (folder, list) or samples with an image (shards)
    bytes: int = 0
    unreadable: int = 0
    unreadable_first: list[str] = field(default_factory=list)  # "name: why"
    missing: int = 0  # a list's names that are not files
    missing_first: list[str] = field(default_factory=list)
    shards: int = 0
    broken_shards: list[str] = field(default_factory=list)  # "path: why"
    without_image: int = 0  # shard samples without an image member
    linked: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.unreadable or self.missing or self.broken_shards) and self.entries > 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def check_data(data: str, progress: bool = True, threads: int | None = None) -> DataReport:
    """Read and decode every image ``data`` names (a folder, a list file or shards)."""
    started = time.perf_counter()
    kind = source_kind(data)
    if kind == "synthetic":
        raise InputError("gantool data check takes a folder, a list file or shards, not 'synthetic'")
    spec = normalise_data(data)
    report = DataReport(kind=kind, data=spec)
    if kind == "folder":
        index = scan_folder(Path(spec), spec)
        report.linked = index.linked
    elif kind == "list":
        index = _list_for_check(Path(spec), report)
    else:
        index = _shards_for_check(spec, report)
    report.entries, report.bytes = (
        len(index),
        int(sum(s for _, s, _ in index.checks)) if kind == "shards" else int(index.sizes.sum()),
    )
    if len(index):
        source = ShardSource(spec, index=index) if kind == "shards" else FileSource(index)
        source.cache_decoded = False
        _decode_all(source, report, progress, threads or max(2, os.cpu_count() or 2))
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _decode_all(source: IndexedSource, report: DataReport, progress: bool, threads: int) -> None:
    from tqdm.auto import tqdm

    def one(i: int) -> str | None:
        try:
            source.read(i)
        except GantoolError as e:
            return str(e)
        return None

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gantool-check") as pool:
        bar = tqdm(
            total=len(source.index), unit="img", desc="checking", disable=None if progress else True, leave=False
        )
        try:
            for why in pool.map(one, range(len(source.index)), chunksize=64):
                bar.update(1)
                if why is not None:
                    report.unreadable += 1
                    if len(report.unreadable_first) < REPORTED:
                        report.unreadable_first.append(why)
        finally:
            bar.close()


def _list_for_check(path: Path, report: DataReport) -> DataIndex:
    entries = read_list_file(path)
    root = str(path.parent)
    names = [os.path.normpath(name) for _, name in entries]
    stats = stat_listed(root, names)
    kept = [(n, s) for n, s in zip(names, stats) if s is not None]
    for (number, name), s in zip(entries, stats):
        if s is None:
            report.missing += 1
            if len(report.missing_first) < REPORTED:
                report.missing_first.append(f"line {number}: {name}")
    import numpy as np

    return DataIndex(
        kind="list",
        spec=str(path),
        root=root,
        names=NameTable.from_names(n for n, _ in kept),
        sizes=np.array([s[0] for _, s in kept], np.int64),
        mtimes=np.array([s[1] for _, s in kept], np.int64),
        checks=[],
    )


def _shards_for_check(spec: str, report: DataReport) -> DataIndex:
    shards = expand_shards(spec)
    report.shards = len(shards)
    good = []
    for shard in shards:
        try:
            scan_shard(shard)
        except InputError as e:
            report.broken_shards.append(str(e))
            continue
        good.append(shard)
    index = build_shard_index(spec, good) if good else build_shard_index(spec, [])
    report.without_image = int(index.notes.get("without_image", 0))
    return index

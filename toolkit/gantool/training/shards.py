"""WebDataset tar shards as training data, read at random by member offsets.

A shard is a plain tar; the members that share a name up to the first dot of
their file name form a sample (``000123.jpg``, ``000123.json``). Training needs
one image per sample: the first member whose extension is an image's.

Streaming a shard from its start (``webdataset.WebDataset``) gives an order
that is not a function of the global step, so exact resume would be lost. The
shards are indexed instead (:func:`shard_index`): each member's offset and size
from its tar header, found once (the index is kept beside the shards and in the
run folder, like a folder's), so a sample is one ``pread`` of its bytes and the
step-to-sample mapping (:class:`~gantool.training.data.StepBatchSampler`) works
on shards as on a folder: each DDP rank reads only its own samples, and a run
killed and resumed continues bitwise.

``--data`` names shards as a ``.tar`` file, a brace pattern
(``shards/train-{000000..000099}.tar``, expanded by webdataset's own
``expand_urls``), a glob, ``::``-joined patterns, a text file listing ``.tar``
files, or a folder ``gantool data pack`` wrote (its :data:`MANIFEST_NAME`).
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import logging
import os
import posixpath
import tarfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gantool.core.errors import InputError
from gantool.core.processing import IMAGE_EXTENSIONS, read_image
from gantool.training.index import (
    SCAN_THREADS,
    DataIndex,
    NameTable,
    beside_data_path,
    cached_index,
    prepare_index_dir,
    write_index,
)
from gantool.training.readers import IndexedSource, is_pattern, read_list_file

log = logging.getLogger(__name__)

MANIFEST_NAME = "gantool-shards.json"  # what `gantool data pack` writes beside its shards
MANIFEST_FORMAT = "gantool-shards"
TAR_BLOCK = 512
MAX_OPEN_SHARDS = 64  # file descriptors a process keeps open at once


def _is_image_member(extension: str) -> bool:
    return "." + extension.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS


def sample_key(member: str) -> tuple[str, str]:
    """(key, extension) of a tar member, as webdataset splits them: the extension starts at the
    first dot of the file name (``dir/000123.seg.png`` -> ``dir/000123``, ``seg.png``)."""
    folder, name = posixpath.split(member)
    stem, dot, extension = name.partition(".")
    return (posixpath.join(folder, stem) if folder else stem), (extension if dot else "")


# ------------------------------------------------------------------ which shards


def shard_list_file(path: Path) -> list[Path] | None:
    """The shards a text file lists (one ``.tar`` per line, relative to its folder), or None when it
    is not such a list (a list of images, or not text)."""
    try:
        with path.open("rb") as f:
            head = f.read(8192)
    except OSError:
        return None
    if b"\0" in head:
        return None
    entries = read_list_file(path)
    if not entries or not all(name.lower().endswith(".tar") for _, name in entries):
        return None
    return [Path(path.parent, name) for _, name in entries]


def expand_shards(data: str) -> list[Path]:
    """The shard files ``--data`` names, each checked to exist (one-line InputError otherwise)."""
    path = Path(data)
    if path.is_dir():
        return _manifest_shards(path)
    if path.is_file():
        listed = shard_list_file(path)
        if listed is None:
            return [path]
        shards, how = listed, f"the list {path}"
    else:
        from webdataset.shardlists import expand_urls  # braces and '::', as webdataset reads them

        shards, how = [], f"the pattern {data}"
        for name in expand_urls(data):
            if glob.has_magic(name):
                shards += [Path(p) for p in sorted(glob.glob(name))]
            else:
                shards.append(Path(name))
        if not shards:
            raise InputError(f"--data {data}: the pattern matches no shard")
    missing = [p for p in shards if not p.is_file()]
    if missing:
        if len(missing) == len(shards):
            raise InputError(f"--data {data}: {how} matches no existing shard (first: {missing[0]})")
        raise InputError(f"--data {data}: {len(missing)} of the {len(shards)} shards {how} names are missing "
                         f"(first: {missing[0]})")  # fmt: skip
    return shards


def _manifest_shards(folder: Path) -> list[Path]:
    manifest = read_manifest(folder)
    shards = [folder / str(s["name"]) for s in manifest["shards"]]
    missing = [p for p in shards if not p.is_file()]
    if missing:
        raise InputError(
            f"--data {folder}: {len(missing)} of its {len(shards)} shards are missing (first: {missing[0]})"
        )
    return shards


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("shards"), list):
            raise ValueError("not a gantool shard manifest")
        for s in manifest["shards"]:
            name = str(s["name"])
            if "/" in name or name in (".", ".."):
                raise ValueError(f"shard name {name!r} is not a plain file name")
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise InputError(f"--data {folder}: {MANIFEST_NAME} is unreadable ({e})") from None
    return manifest


# ------------------------------------------------------------------ a shard's members


def scan_shard(path: Path) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of each file member of the tar ``path``, from its headers.

    A shard that is not a plain tar, is cut short (a member's data or the end-of-archive
    blocks missing: an interrupted copy) or has a damaged header is a one-line InputError."""
    try:
        size = path.stat().st_size
        tar = tarfile.open(path, "r:")  # noqa: SIM115 (closed by the with below)
    except (OSError, tarfile.TarError) as e:
        why = "compressed shards cannot be read at random" if _compressed(path) else str(e)
        raise InputError(f"shard {path} is not a plain tar file ({why})") from None
    members: list[tuple[str, int, int]] = []
    end = 0
    last = ""
    with tar:
        try:
            for info in tar:
                if info.isfile():
                    members.append((info.name, info.offset_data, info.size))
                end = info.offset_data + -(-info.size // TAR_BLOCK) * TAR_BLOCK
                last = info.name
        except (OSError, tarfile.TarError) as e:
            raise InputError(f"shard {path} is truncated or damaged after member {last or '(none)'} ({e})") from None
    if end > size:
        raise InputError(f"shard {path} is truncated: {size} bytes, but its member {last} ends at byte {end}")
    try:
        with path.open("rb") as f:
            f.seek(end)
            tail = f.read(2 * TAR_BLOCK)
    except OSError as e:
        raise InputError(f"cannot read shard {path}: {e.strerror or e}") from None
    if len(tail) < 2 * TAR_BLOCK or tail.strip(b"\0"):
        after = f"after member {last}" if last else "at its start"
        raise InputError(f"shard {path} is truncated or damaged {after} (no end-of-archive blocks at byte {end})")
    return members


def _compressed(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            magic = f.read(6)
    except OSError:
        return False
    return magic.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"(\xb5/\xfd"))


def build_shard_index(spec: str, shards: Sequence[Path], threads: int = SCAN_THREADS) -> DataIndex:
    """Every sample's image member across ``shards``, in shard order, then tar order."""
    built_ns = time.time_ns()
    stats = []
    for p in shards:
        st = p.stat()
        stats.append((str(p), st.st_size, st.st_mtime_ns))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gantool-tar") as pool:
        tables = list(pool.map(scan_shard, shards))
    names: list[str] = []
    parts: list[int] = []
    offsets: list[int] = []
    sizes: list[int] = []
    without, first_without = 0, None
    members = 0
    for part, table in enumerate(tables):
        members += len(table)
        chosen: dict[str, tuple[str, int, int] | None] = {}
        for name, offset, size in table:
            key, extension = sample_key(name)
            if chosen.get(key) is None:
                chosen[key] = (name, offset, size) if _is_image_member(extension) else None
        for key, member in chosen.items():
            if member is None:
                without += 1
                first_without = first_without or f"{shards[part]}:{key}"
                continue
            names.append(member[0])
            parts.append(part)
            offsets.append(member[1])
            sizes.append(member[2])
    notes: dict[str, Any] = {"members": members}
    if without:
        notes.update(without_image=without, first_without_image=first_without)
    return DataIndex(
        kind="shards",
        spec=spec,
        root="",
        names=NameTable.from_names(names),
        sizes=np.array(sizes, np.int64),
        mtimes=np.zeros(len(names), np.int64),
        checks=stats,
        built_ns=built_ns,
        shards=[str(p) for p in shards],
        parts=np.array(parts, np.int32),
        offsets=np.array(offsets, np.int64),
        notes=notes,
    )


def shard_index(spec: str, extra: Sequence[Path] = (), keep: bool = True) -> DataIndex:
    """The index of the shards ``spec`` names: a current cached one, else built (and kept beside
    the first shard when ``keep`` and that folder is writable)."""
    shards = expand_shards(spec)
    beside = shards[0].parent
    found = cached_index("shards", spec, beside if keep else None, extra)
    if found is not None and found.shards == [str(p) for p in shards]:
        return found
    started = time.perf_counter()
    index = build_shard_index(spec, shards)
    log.debug(
        "data: indexed %d shard(s), %d sample(s) in %.2f s", len(shards), len(index), time.perf_counter() - started
    )
    if keep and prepare_index_dir(beside):
        write_index(index, beside_data_path(beside, "shards", spec))
    return index


class ShardSource(IndexedSource):
    """Samples of WebDataset tar shards, each image member read at its offset (``os.pread``, so
    forked DataLoader workers share no file position)."""

    kind = "shards"

    def __init__(
        self,
        data: str,
        scale_range: tuple[float, float] | None = None,
        index_dirs: Sequence[Path] = (),
        keep_index: bool = False,
        index: DataIndex | None = None,
    ) -> None:
        from gantool.training.index import RUN_INDEX_FILE

        self.data = data
        if index is None:
            index = shard_index(data, [Path(d) / RUN_INDEX_FILE for d in index_dirs], keep_index)
        super().__init__(index, scale_range)
        self._fds: dict[int, int] = {}

    def empty_message(self) -> str:
        notes = self.index.notes
        return (
            f"--data {self.data}: the shards hold no image sample ({notes.get('members', 0)} member(s); "
            f"image extensions: {', '.join(IMAGE_EXTENSIONS)})"
        )

    def describe(self, index: int) -> str:
        return f"{self.index.shards[int(self.index.parts[index])]}:{self.index.names[index]}"

    def read_bytes(self, index: int) -> bytes:
        """The member's bytes. The first MAX_OPEN_SHARDS shards a process reads stay open (a forked
        worker shares its parent's: pread needs no file position); others are opened per read, so
        no descriptor is ever closed under another thread's read."""
        part, offset, size = int(self.index.parts[index]), int(self.index.offsets[index]), int(self.index.sizes[index])
        try:
            fd = self._fds.get(part)
            if fd is not None:
                data = os.pread(fd, size, offset)
            elif len(self._fds) < MAX_OPEN_SHARDS:
                fd = os.open(self.index.shards[part], os.O_RDONLY)
                if self._fds.setdefault(part, fd) != fd:  # another thread opened it first
                    os.close(fd)
                data = os.pread(self._fds[part], size, offset)
            else:
                fd = os.open(self.index.shards[part], os.O_RDONLY)
                try:
                    data = os.pread(fd, size, offset)
                finally:
                    os.close(fd)
        except OSError as e:
            raise InputError(f"cannot read {self.describe(index)}: {e.strerror or e}") from None
        if len(data) != size:
            raise InputError(f"{self.describe(index)}: the shard ends inside this member (truncated since indexed)")
        return data

    def read(self, index: int) -> Image.Image:
        return read_image(io.BytesIO(self.read_bytes(index)), name=self.describe(index))

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def __getstate__(self) -> dict[str, Any]:  # spawned workers open their own descriptors
        state = dict(self.__dict__)
        state["_fds"] = {}
        return state


def is_shard_spec(data: str) -> bool:
    return is_pattern(data) or data.lower().endswith(".tar")

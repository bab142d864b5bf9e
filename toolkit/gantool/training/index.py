"""The data index: the list of training files (name, size, mtime), built once and reused.

Opening a data set of a million images must not cost a million opens or stats
at every start, on every rank and at every ``--resume``. The file list is built
once (:func:`scan_folder`: the folders listed and the files stat'ed by a pool
of threads) and kept as a :class:`DataIndex` in two places:

- beside the data, in a ``.gantool/`` folder (:data:`INDEX_DIR`) inside the data
  folder (or beside a list file or the shards), so any later run reuses it;
- in the run folder (:data:`RUN_INDEX_FILE`), so a ``--resume`` reuses it even
  where the data folder is read-only.

An index is *current* when every folder it walked (a list file, the shards) has
the size and modification time it recorded: adding, removing or renaming a file
changes its folder's mtime. An image rewritten in place under its old name does
not, so it is not noticed (its decode still is; ``gantool data check`` re-reads
everything). A folder changed within :data:`RACY_NS` of the scan could hide a
change in the same clock tick, so such an index is rebuilt instead of reused.

Writing beside the data is best effort: a read-only folder is fine (the index
then lives in the run folder only). The ``.gantool/`` folder is made *before*
the scan, so writing the index later changes no folder the index recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from gantool import __version__
from gantool.core.errors import GantoolError, InputError
from gantool.core.fileio import atomic_write_text
from gantool.core.processing import IMAGE_EXTENSIONS

log = logging.getLogger(__name__)

INDEX_FORMAT = "gantool-data-index"
INDEX_VERSION = 1
INDEX_DIR = ".gantool"  # gantool's folder beside the data (never walked as data)
RUN_INDEX_FILE = "data-index.json"  # the run folder's copy
# The launcher (--nproc-per-node) hands its index to the workers through this file.
INDEX_ENV = "GANTOOL_DATA_INDEX"
# A folder changed this close before the scan may hide a change made in the same clock tick
# (Linux file systems tick in milliseconds; whole-second mtimes mean a coarse one: FAT, HFS+, some NFS).
RACY_NS = 50_000_000
RACY_COARSE_NS = 2_000_000_000
SCAN_THREADS = 16  # listing and stat calls wait on the file system (a network one above all)
STAT_CHUNK = 2048  # files stat'ed per task: a flat folder of 100,000 images spreads over the pool


class NameTable(Sequence[str]):
    """Many names in one bytes blob (UTF-8, surrogateescape) and an end-offset array: a million
    names cost tens of MB instead of hundreds, and forked DataLoader workers share the pages."""

    def __init__(self, blob: bytes, ends: np.ndarray) -> None:
        self.blob, self.ends = blob, ends

    @classmethod
    def from_names(cls, names: Iterable[str]) -> NameTable:
        encoded = [n.encode("utf-8", "surrogateescape") for n in names]
        ends = np.cumsum([len(b) for b in encoded], dtype=np.int64) if encoded else np.zeros(0, np.int64)
        return cls(b"".join(encoded), ends)

    def __len__(self) -> int:
        return len(self.ends)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = int(self.ends[i - 1]) if i else 0
        return self.blob[start : int(self.ends[i])].decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))


@dataclass
class DataIndex:
    """A data set's entries and what tells whether they are still current.

    ``names`` are relative to ``root`` (a folder, a list's folder; absolute names stay absolute).
    For shards, ``shards`` are the tar files and each entry is one member: ``parts[i]`` its shard,
    ``offsets[i]`` where its bytes start; ``names[i]`` the member's name in the tar."""

    kind: str  # "folder", "list" or "shards"
    spec: str  # the resolved --data it describes
    root: str
    names: Sequence[str]
    sizes: np.ndarray
    mtimes: np.ndarray
    checks: list[tuple[str, int, int]]  # (path, size or -1 for a folder, mtime_ns): all must hold
    built_ns: int = 0
    linked: int = 0  # folder: images reached through links
    repeated: list[str] = field(default_factory=list)  # folder: links to folders already walked
    shards: list[str] = field(default_factory=list)
    parts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    notes: dict[str, Any] = field(default_factory=dict)  # kind-specific facts (a list's missing files)
    digest: dict[str, Any] | None = None  # the fingerprint, once computed (kept in the file: no rehash per start)

    def __len__(self) -> int:
        return len(self.names)

    # ------------------------------------------------------------------ what a checkpoint records

    def fingerprint(self) -> dict[str, Any]:
        """The data's path, entry count, bytes and a digest of its names, sizes and mtimes.

        A folder's digest is the one gantool recorded before indexes existed (relative names,
        sizes, mtimes in ns), so older checkpoints resume without a false alarm. Shards are
        digested by their members' names, offsets and sizes, not mtimes: a copy on another
        machine is the same data."""
        if self.digest is not None:
            return dict(self.digest)
        digest = hashlib.sha256()
        if self.kind == "shards":
            for shard in self.shards:
                digest.update(os.path.basename(shard).encode("utf-8", "surrogateescape") + b"\n")
            for part, offset, size, name in zip(
                self.parts.tolist(), self.offsets.tolist(), self.sizes.tolist(), self.names
            ):
                digest.update(f"{part}:{offset}:{size}:".encode() + name.encode("utf-8", "surrogateescape") + b"\n")
        else:
            for name, size, mtime in zip(self.names, self.sizes.tolist(), self.mtimes.tolist()):
                digest.update(name.encode("utf-8", "surrogateescape") + b"\0" + f"{size}:{mtime}".encode() + b"\n")
        total = int(sum(s for _, s, _ in self.checks)) if self.kind == "shards" else int(self.sizes.sum())
        record = {"path": self.spec, "files": len(self), "bytes": total, "sha256": digest.hexdigest()}
        if self.kind != "folder":
            record["kind"] = self.kind
        self.digest = record
        return dict(record)

    # ------------------------------------------------------------------ current or not

    def stale_reason(self) -> str | None:
        """None when every recorded folder / file still has its size and mtime; else what changed."""
        for path, size, mtime in self.checks:
            try:
                st = os.stat(path)
            except OSError:
                return f"{path} is gone"
            if st.st_mtime_ns != mtime or (size >= 0 and st.st_size != size):
                return f"{path} changed"
            if mtime >= self.built_ns - (RACY_COARSE_NS if mtime % 1_000_000_000 == 0 else RACY_NS):
                return f"{path} changed just before the index was built"
        return None

    # ------------------------------------------------------------------ file form

    def to_json(self) -> str:
        blob = self.names.blob if isinstance(self.names, NameTable) else NameTable.from_names(self.names).blob
        ends = self.names.ends if isinstance(self.names, NameTable) else NameTable.from_names(self.names).ends
        record = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "gantool_version": __version__,
            "kind": self.kind,
            "spec": self.spec,
            "root": self.root,
            "entries": len(self),
            "built_ns": self.built_ns,
            "checks": [list(c) for c in self.checks],
            "linked": self.linked,
            "repeated": self.repeated,
            "shards": self.shards,
            "notes": self.notes,
            "fingerprint": self.fingerprint(),
            "names": _b64(blob),
            "name_ends": _b64(ends.astype("<i8").tobytes()),
            "sizes": _b64(self.sizes.astype("<i8").tobytes()),
            "mtimes": _b64(self.mtimes.astype("<i8").tobytes()),
            "parts": _b64(self.parts.astype("<i4").tobytes()),
            "offsets": _b64(self.offsets.astype("<i8").tobytes()),
        }
        return json.dumps(record, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DataIndex:
        """An index from :meth:`to_json`'s text; ValueError (or KeyError, TypeError) when it is not one."""
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format") != INDEX_FORMAT or d.get("version") != INDEX_VERSION:
            raise ValueError("not a gantool data index of this version")
        ends = np.frombuffer(base64.b64decode(d["name_ends"]), "<i8")
        n = int(d["entries"])
        sizes, mtimes = (np.frombuffer(base64.b64decode(d[k]), "<i8") for k in ("sizes", "mtimes"))
        parts = np.frombuffer(base64.b64decode(d["parts"]), "<i4")
        offsets = np.frombuffer(base64.b64decode(d["offsets"]), "<i8")
        blob = base64.b64decode(d["names"])
        if len(ends) != n or len(sizes) != n or (n and int(ends[-1]) != len(blob)):
            raise ValueError("the index's columns do not agree")
        if d["kind"] == "shards" and (len(parts) != n or len(offsets) != n):
            raise ValueError("the index's shard columns do not agree")
        return cls(
            kind=str(d["kind"]),
            spec=str(d["spec"]),
            root=str(d["root"]),
            names=NameTable(blob, ends),
            sizes=sizes,
            mtimes=mtimes,
            checks=[(str(p), int(s), int(m)) for p, s, m in d["checks"]],
            built_ns=int(d["built_ns"]),
            linked=int(d.get("linked", 0)),
            repeated=[str(r) for r in d.get("repeated", [])],
            shards=[str(s) for s in d.get("shards", [])],
            parts=parts,
            offsets=offsets,
            notes=dict(d.get("notes") or {}),
            digest=dict(d["fingerprint"]) if isinstance(d.get("fingerprint"), dict) else None,
        )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# ------------------------------------------------------------------ where indexes live


def beside_data_path(folder: str | Path, kind: str, spec: str) -> Path:
    """The index file of ``spec`` in ``folder``'s :data:`INDEX_DIR` (one per data set)."""
    key = hashlib.sha256(f"{kind}\0{spec}".encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return Path(folder) / INDEX_DIR / f"index-{kind}-{key}.json"


def read_index(path: str | Path, kind: str, spec: str) -> DataIndex | None:
    """The index at ``path`` if it describes ``spec`` and is current; None otherwise (never raises)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        index = DataIndex.from_json(text)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.debug("data index %s unusable: %s", path, e)
        return None
    if index.kind != kind or index.spec != spec:
        return None
    reason = index.stale_reason()
    if reason:
        log.info("data index %s is out of date (%s); rebuilding it", path, reason)
        return None
    return index


def write_index(index: DataIndex, path: str | Path) -> bool:
    """Write ``index`` atomically at ``path``; False (and a debug line) when that cannot be done."""
    try:
        Path(path).parent.mkdir(exist_ok=True)
        atomic_write_text(path, index.to_json())
    except (OSError, GantoolError) as e:
        log.debug("data index not written to %s: %s", path, e)
        return False
    return True


def cached_index(kind: str, spec: str, beside: Path | None, extra: Sequence[Path] = ()) -> DataIndex | None:
    """The first current index of ``spec`` among: the launcher's (:data:`INDEX_ENV`), ``extra``
    (the run folder's), the one beside the data."""
    candidates = [Path(p) for p in (os.environ.get(INDEX_ENV),) if p]
    candidates += list(extra)
    if beside is not None:
        candidates.append(beside_data_path(beside, kind, spec))
    for path in candidates:
        found = read_index(path, kind, spec)
        if found is not None:
            log.debug("data index: %s", path)
            return found
    return None


def prepare_index_dir(folder: Path) -> bool:
    """Make ``folder``'s :data:`INDEX_DIR` (before a scan: see the module's note). False when read-only."""
    try:
        (folder / INDEX_DIR).mkdir(exist_ok=True)
    except OSError:
        return False
    return os.access(folder / INDEX_DIR, os.W_OK | os.X_OK)


# ------------------------------------------------------------------ scanning a folder


@dataclass
class _Listing:
    identity: tuple[int, int]
    mtime_ns: int
    files: list[tuple[str, bool]]  # (name, is a link) of image-named entries
    subdirs: list[tuple[str, bool]]
    stats: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (size, mtime_ns) of regular files


def _list_dir(path: str) -> _Listing | None:
    try:
        st = os.stat(path)
        entries = list(os.scandir(path))
    except OSError:
        return None  # as os.walk: a folder that cannot be listed is left out
    files, subdirs = [], []
    for entry in entries:
        try:
            is_dir = entry.is_dir()  # follows links, as os.walk(followlinks=True)
            link = entry.is_symlink()
        except OSError:
            continue
        if is_dir:
            if entry.name != INDEX_DIR:
                subdirs.append((entry.name, link))
        elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
            files.append((entry.name, link))
    return _Listing((st.st_dev, st.st_ino), st.st_mtime_ns, files, subdirs)


def _stat_files(folder: str, names: list[str]) -> dict[str, tuple[int, int]]:
    found = {}
    for name in names:
        try:
            st = os.stat(os.path.join(folder, name))
        except OSError:
            continue  # a broken link, a file gone since the listing
        if stat.S_ISREG(st.st_mode):
            found[name] = (st.st_size, st.st_mtime_ns)
    return found


def scan_folder(root: str | Path, spec: str | None = None, threads: int = SCAN_THREADS) -> DataIndex:
    """Every image file under ``root``, recursively and through folder links, sorted as paths
    sort (by their parts), with sizes and mtimes: one listing per folder and one stat per file,
    spread over ``threads`` threads.

    A folder is walked once, whatever the links to it (a link to an ancestor, a cycle, two
    links to one folder): which path walks it is decided afterwards, in the order a sorted
    top-down walk meets them (``os.walk``'s), so it never depends on which thread ran first;
    later ones are listed in ``repeated``. The names keep the linked path, so they stay under
    ``root``. Folders named :data:`INDEX_DIR` are gantool's and are not walked."""
    root = Path(root)
    built_ns = time.time_ns()
    listings: dict[tuple[int, int], _Listing] = {}
    child: dict[tuple[tuple[int, int] | None, str], tuple[int, int] | None] = {}
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gantool-scan") as pool:
        pending: dict[Future, tuple[str, Any]] = {}

        def list_later(path: str, parent: tuple[int, int] | None, name: str) -> None:
            pending[pool.submit(_list_dir, path)] = ("list", (path, parent, name))

        list_later(str(root), None, "")
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for future in done:
                what, (path, parent, name) = pending.pop(future)
                if what == "stat":
                    listings[parent].stats.update(future.result())
                    continue
                listing = future.result()
                child[(parent, name)] = listing.identity if listing else None
                if listing is None or listing.identity in listings:
                    continue
                listings[listing.identity] = listing
                for sub, _ in listing.subdirs:
                    list_later(os.path.join(path, sub), listing.identity, sub)
                names = [f for f, _ in listing.files]
                for start in range(0, len(names), STAT_CHUNK):
                    chunk = names[start : start + STAT_CHUNK]
                    pending[pool.submit(_stat_files, path, chunk)] = ("stat", (path, listing.identity, ""))

    # The walk itself, in os.walk's order: which path reaches a folder first is decided here.
    entries: list[tuple[list[str], str, int, int, bool]] = []
    checks: list[tuple[str, int, int]] = []
    repeated: list[str] = []
    visited: set[tuple[int, int]] = set()
    stack: list[tuple[tuple[int, int] | None, str, str, str, bool]] = [(None, "", "", str(root), False)]
    while stack:
        parent, name, rel, path, via_link = stack.pop()
        identity = child.get((parent, name))
        if identity is None:
            continue
        if identity in visited:
            repeated.append(path)
            continue
        visited.add(identity)
        listing = listings[identity]
        checks.append((path, -1, listing.mtime_ns))
        for fname, link in listing.files:
            if fname in listing.stats:
                size, mtime = listing.stats[fname]
                relname = f"{rel}/{fname}" if rel else fname
                entries.append((relname.split("/"), relname, size, mtime, via_link or link))
        for sub, link in sorted(listing.subdirs, reverse=True):  # popped in sorted order
            stack.append((identity, sub, f"{rel}/{sub}" if rel else sub, os.path.join(path, sub), via_link or link))
    entries.sort(key=lambda e: e[0])
    return DataIndex(
        kind="folder",
        spec=spec if spec is not None else str(root),
        root=str(root),
        names=NameTable.from_names(e[1] for e in entries),
        sizes=np.array([e[2] for e in entries], np.int64),
        mtimes=np.array([e[3] for e in entries], np.int64),
        checks=checks,
        built_ns=built_ns,
        linked=sum(e[4] for e in entries),
        repeated=repeated,
    )


def stat_listed(root: str, names: Sequence[str], threads: int = SCAN_THREADS) -> list[tuple[int, int] | None]:
    """(size, mtime_ns) of each of ``names`` (relative to ``root``), None where it is not a
    regular file; stat'ed by ``threads`` threads."""
    chunks = [list(names[i : i + STAT_CHUNK]) for i in range(0, len(names), STAT_CHUNK)]

    def run(chunk: list[str]) -> list[tuple[int, int] | None]:
        out: list[tuple[int, int] | None] = []
        for name in chunk:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                out.append(None)
                continue
            out.append((st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None)
        return out

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gantool-stat") as pool:
        return [item for part in pool.map(run, chunks) for item in part]


def folder_index(root: Path, spec: str, extra: Sequence[Path] = (), keep: bool = True) -> DataIndex:
    """The index of the image folder ``root``: a current cached one, else a new scan (kept beside
    the data when ``keep`` and the folder is writable)."""
    if not root.exists():
        raise InputError(f"data folder not found: {root}")
    if not root.is_dir():
        raise InputError(
            f"--data must be a folder of images (or a list file, shards or 'synthetic'), got a file: {root}"
        )
    found = cached_index("folder", spec, root if keep else None, extra)
    if found is not None:
        return found
    made = keep and not (root / INDEX_DIR).exists()
    writable = keep and prepare_index_dir(root)
    if made and writable:
        time.sleep(2 * RACY_NS / 1e9)  # the folder's mtime (our mkdir) falls outside the new index's racy window
    started = time.perf_counter()
    index = scan_folder(Path(spec), spec)  # the resolved folder: the index holds for any working directory
    log.debug("data: indexed %d image file(s) in %s in %.2f s", len(index), root, time.perf_counter() - started)
    if writable:
        write_index(index, beside_data_path(root, "folder", spec))
    return index

"""Atomic file writes: a temp file in the target folder, then a rename.

A crash or error mid-write leaves the previous file (or nothing) in place, never
a half-written one. ``overwrite=False`` refuses to replace a user's file.

Temp files are named ``.gantool-tmp-<name>.<pid>.<random>``. A write that was
killed (kill -9, power loss) leaves one behind; the first write of a later
process into the same folder removes the ones whose writer process is gone (or
that are older than :data:`STALE_TMP_SECONDS`). A full disk or a permission
error is a one-line :class:`~gantool.core.errors.InputError` naming the path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gantool.core.errors import InputError

log = logging.getLogger(__name__)

TMP_PREFIX = ".gantool-tmp-"
# A temp file this old is a leftover even if its pid was reused by another process.
STALE_TMP_SECONDS = 24 * 3600

_swept: set[Path] = set()  # folders this process has already cleaned
_swept_lock = threading.Lock()


def ensure_writable_dir(folder: str | Path) -> Path:
    """Create ``folder`` if needed and check that files can be written there."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"output path exists and is not a folder: {folder}") from None
    except OSError as e:
        raise InputError(f"cannot create output folder {folder}: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"output folder is not writable: {folder}")
    return folder


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Remove gantool temp files in ``folder`` left by writers that are gone.

    A temp file of a live process (another writer working now) is kept, unless
    it is older than :data:`STALE_TMP_SECONDS`. Returns what was removed.
    """
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(TMP_PREFIX):
            continue
        parts = entry.name.rsplit(".", 2)  # .gantool-tmp-<name>.<pid>.<random>
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if pid == os.getpid() and age < STALE_TMP_SECONDS:
            continue  # this process's own write in progress (another thread)
        if pid is not None and pid_alive(pid) and age < STALE_TMP_SECONDS:
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    if removed:
        log.info(
            "removed %d leftover temp file(s) of killed writes in %s",
            len(removed),
            folder,
        )
    return removed


def _sweep_once(folder: Path) -> None:
    """Clean ``folder`` on this process's first write there (later leftovers can only
    come from a process that dies after this one started writing)."""
    key = folder.resolve()
    with _swept_lock:
        if key in _swept:
            return
        _swept.add(key)
    remove_stale_temp_files(folder)


def _create_temp(path: Path) -> Path:
    """An empty temp file beside ``path``, made with mode 0o666 so the umask applies as for any file."""
    for _ in range(100):
        tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"no free temp file name beside {path}")


@contextlib.contextmanager
def atomic_path(path: str | Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success rename it onto ``path``.

    On any exception the temp file is removed and ``path`` is untouched; an
    OSError (a full disk, no permission) becomes a one-line InputError.
    """
    path = Path(path)
    ensure_writable_dir(path.parent)
    if not overwrite and path.exists():
        raise InputError(f"refusing to overwrite existing file: {path} (use --overwrite)")
    _sweep_once(path.parent)
    try:
        tmp = _create_temp(path)
    except OSError as e:
        raise InputError(f"cannot write to {path.parent}: {e.strerror or e}") from None
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # make the bytes durable before the rename
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes, overwrite: bool = True) -> Path:
    with atomic_path(path, overwrite) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, overwrite: bool = True) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite)


def atomic_save(path: str | Path, save: Callable[[Path], object], overwrite: bool = True) -> Path:
    """Call ``save(tmp_path)`` and move the result onto ``path`` atomically."""
    with atomic_path(path, overwrite) as tmp:
        save(tmp)
    return Path(path)

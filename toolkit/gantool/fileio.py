"""Atomic file writes: a temp file in the target folder, then a rename.

A crash or error mid-write leaves the previous file (or nothing) in place, never
a half-written one. ``overwrite=False`` refuses to replace a user's file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from gantool.errors import InputError


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


@contextlib.contextmanager
def atomic_path(path: str | Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success rename it onto ``path``.

    On any exception the temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    ensure_writable_dir(path.parent)
    if not overwrite and path.exists():
        raise InputError(f"refusing to overwrite existing file: {path} (use --overwrite)")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise InputError(f"cannot write to {path.parent}: {e.strerror or e}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes 0600; outputs get normal permissions
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # make the bytes durable before the rename
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes, overwrite: bool = True) -> Path:
    with atomic_path(path, overwrite) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, overwrite: bool = True) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite)


def atomic_save(path: str | Path, save: Callable[[Path], None], overwrite: bool = True) -> Path:
    """Call ``save(tmp_path)`` and move the result onto ``path`` atomically."""
    with atomic_path(path, overwrite) as tmp:
        save(tmp)
    return Path(path)

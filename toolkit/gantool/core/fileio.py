"""Atomic file writes: a temp file in the target folder, then a rename.

A crash or error mid-write leaves the previous file (or nothing) in place, never
a half-written one. ``overwrite=False`` refuses to replace a user's file.

Temp files are named ``.gantool-tmp-<name>.<pid>.<random>``. A write that was
killed (kill -9, power loss) leaves one behind; the first write of a later
process into the same folder removes the ones whose writer process is gone (or
that are older than :data:`STALE_TMP_SECONDS`). A full disk or a permission
error is a one-line :class:`~gantool.core.errors.InputError` naming the path.

A folder of files that belong together (an export) is written whole with
:func:`staged_folder` and :func:`commit_staged_folder` (see the section below).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
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


def absolute_path(path: str | Path) -> Path:
    """``path`` as recorded for another process or for later: ``~`` expanded, absolute, ``..`` folded.

    Symlinks are kept, not resolved: a linked image keeps its own name (outputs are named after it),
    and a link the user repoints (``models/current``) is followed the next time the record is read.
    """
    return Path(os.path.abspath(Path(path).expanduser()))


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


# ------------------------------------------------------------------ folders written whole
#
# A folder of files that belong together (one export) is written into a hidden staging
# folder, then put in place in one step: renamed onto the target when there is none, else
# committed through a journal in the target that lists what to install and what to remove.
# Whoever opens the target next (export, inpaint, serve) completes a journal whose writer
# is gone, so a kill at any point leaves the old files or the new ones, whole.
#
# The stage is always on the target's own filesystem, so every rename stays on one device:
# beside the target when there is none yet (the target will be made in that parent), inside
# it when it exists (a mount point, ``/dev/shm``, a volume: its parent is another device).

STAGE_PREFIX = ".gantool-stage-"
JOURNAL_NAME = ".gantool-commit.json"
# Tests set this to a step name to SIGKILL the process there (see tests/test_atomicity.py).
KILL_AT_ENV = "GANTOOL_TEST_KILL_AT"
JOURNAL_WAIT_SECONDS = 10.0  # how long a reader waits for a live writer's commit to finish


def _kill_point(step: str) -> None:
    if os.environ.get(KILL_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while cleaning up, so a second Ctrl-C cannot leave half a cleanup."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    blocked = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform opens folders
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, deepest first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    ensure_writable_dir(folder)
    return missing


def _stage_owner(name: str) -> tuple[str, int | None]:
    """(target name, writer pid) of a ``.gantool-stage-<target>.<pid>.<random>`` folder name;
    the target name is empty for a stage inside its own target."""
    parts = name[len(STAGE_PREFIX) :].rsplit(".", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return "", None


def _stage_home(data: dict, folder: Path) -> Path:
    """The folder a journal's stage lives in: ``folder`` itself, or (older journals) its parent."""
    return folder if data.get("stage_in") == "target" else folder.parent


def remove_stale_stages(parent: str | Path) -> list[Path]:
    """Remove staging folders in ``parent`` whose writer is gone; a stage that a journal
    still needs is committed first (its writer died mid-commit). Returns what was removed.

    A commit into another folder that cannot be completed is that folder's business: it is
    reported as a warning and never stops a write elsewhere in ``parent``."""
    parent = Path(parent)
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(STAGE_PREFIX) and e.is_dir()]
    except OSError:
        return removed
    for entry in entries:
        target, pid = _stage_owner(entry.name)
        try:
            young = time.time() - entry.stat(follow_symlinks=False).st_mtime < STALE_TMP_SECONDS
        except OSError:
            continue
        if young and (pid == os.getpid() or (pid is not None and pid_alive(pid))):
            continue  # a live export's (a pid reused by another process counts as gone after a day)
        owner = parent / target if target else parent  # no target name: a stage inside its target
        if (owner / JOURNAL_NAME).is_file():
            try:
                finish_interrupted_commit(owner)
            except InputError as e:
                log.warning("left %s as it is: %s", entry.path, e)
                continue
        if Path(entry.path).exists():
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    if removed:
        log.info("removed %d leftover staging folder(s) of killed exports in %s", len(removed), parent)
    return removed


@contextlib.contextmanager
def staged_folder(target: str | Path) -> Iterator[Path]:
    """Yield an empty hidden sibling of ``target`` to write into; :func:`commit_staged_folder`
    puts it in place. On any exception, or when not committed, the stage and the folders made
    for it are removed, so a failed write leaves nothing behind."""
    target = Path(target)
    try:
        created = _make_folders(target.parent)
    except InputError as e:
        raise InputError(f"cannot create {target}: {e}") from None
    inside = target.is_dir()  # on the target's own filesystem either way (see the section's comment)
    home = target if inside else target.parent
    # Absolute: a compiler run in another working directory writes its scratch files here.
    name = f"{STAGE_PREFIX}{'' if inside else target.name}.{os.getpid()}.{secrets.token_hex(4)}"
    stage = home.absolute() / name
    try:  # from the stage's mkdir on, the cleanup below runs: a Ctrl-C just after it leaves nothing
        try:
            remove_stale_stages(target.parent)
            if inside:
                remove_stale_stages(target)
            stage.mkdir()
        except OSError as e:
            raise InputError(f"cannot write to {home}: {e.strerror or e}") from None
        yield stage
    finally:
        with _signals_deferred():
            if stage.exists() and not _journal_names(target, stage):  # a journal still needs it: keep it
                shutil.rmtree(stage, ignore_errors=True)
            if not target.exists():
                _remove_empty(created)


def _journal_names(target: Path, stage: Path) -> bool:
    """Whether a commit journal in ``target`` refers to ``stage`` (a commit that failed half-way)."""
    try:
        return json.loads((target / JOURNAL_NAME).read_text(encoding="utf-8")).get("stage") == stage.name
    except (OSError, ValueError, AttributeError):
        return False


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()


def commit_staged_folder(stage: Path, target: Path, remove: list[str]) -> None:
    """Put the files of ``stage`` into ``target`` and delete ``remove`` (names in ``target``)
    there, as one step as far as any later reader can tell."""
    _kill_point("staged")
    names = sorted(p.name for p in stage.iterdir() if p.is_file())
    for sub in (p for p in stage.iterdir() if not p.is_file()):
        shutil.rmtree(sub, ignore_errors=True)  # scratch folders (a compiler's) are never installed
    try:
        for name in names:
            with open(stage / name, "rb+") as f:  # durable before anything points at it
                os.fsync(f.fileno())
        if not target.exists():
            _kill_point("rename")
            os.rename(stage, target)  # the whole folder appears at once
            _fsync_dir(target.parent)
            return
        journal = {"stage": stage.name, "install": names, "remove": sorted(set(remove) - set(names))}
        if stage.parent.resolve() == target.resolve():
            journal["stage_in"] = "target"
        atomic_write_text(target / JOURNAL_NAME, json.dumps({**journal, "pid": os.getpid()}))
    except OSError as e:
        raise InputError(f"cannot write {target}: {e.strerror or e}") from None
    _kill_point("journal")
    finish_interrupted_commit(target, own=True)


def _journal(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / JOURNAL_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InputError(f"{folder / JOURNAL_NAME}: unreadable commit journal ({e}); remove it") from None
    names = [*data.get("install", []), *data.get("remove", [])]
    stage = str(data.get("stage", ""))
    plain = all(isinstance(n, str) and n and "/" not in n and "\\" not in n and n not in (".", "..") for n in names)
    if not plain or not stage.startswith(STAGE_PREFIX) or "/" in stage:
        raise InputError(f"{folder / JOURNAL_NAME}: not a gantool commit journal; remove it")
    return data


def finish_interrupted_commit(folder: str | Path, own: bool = False) -> bool:
    """Complete a commit into ``folder`` that was interrupted (or, with ``own``, this
    process's). Waits briefly for a live writer's commit. Returns whether there was one."""
    folder = Path(folder)
    data = _journal(folder)
    if data is None:
        return False
    pid = data.get("pid")
    deadline = time.monotonic() + JOURNAL_WAIT_SECONDS
    while not own and isinstance(pid, int) and pid != os.getpid() and pid_alive(pid):
        if time.monotonic() > deadline:
            raise InputError(f"an export into {folder} is being committed by process {pid}; try again")
        time.sleep(0.05)
        if (data := _journal(folder)) is None:
            return True  # the writer finished
    stage = _stage_home(data, folder) / data["stage"]
    try:
        with _signals_deferred():
            for name in data["install"]:
                if (stage / name).is_file():
                    os.replace(stage / name, folder / name)
                    _kill_point("install")
            for name in data["remove"]:
                (folder / name).unlink(missing_ok=True)
                _kill_point("remove")
            shutil.rmtree(stage, ignore_errors=True)
            _fsync_dir(folder)
            _kill_point("cleanup")
            (folder / JOURNAL_NAME).unlink(missing_ok=True)
    except OSError as e:
        raise InputError(f"cannot complete the interrupted export into {folder}: {e.strerror or e}") from None
    if not own:
        log.warning("completed an interrupted export into %s", folder)
    return True

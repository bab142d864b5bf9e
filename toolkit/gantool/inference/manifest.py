"""The JSON-lines manifest of ``gantool inpaint --ray``: one line per input, its state.

Where it goes (:func:`default_manifest`), that it never replaces a user's file
(:func:`check_manifest_target`), and the writer (:class:`Manifest`): lines are
streamed to a temporary file that is renamed onto the manifest at the end, also
after an interrupt or a failure.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from gantool.core.constants import RAY_MANIFEST_NAME
from gantool.core.errors import InputError
from gantool.core.fileio import ensure_writable_dir
from gantool.core.processing import IMAGE_EXTENSIONS
from gantool.inference.pipeline import FileResult, ImageJob, written
from gantool.inference.ray_connect import settle_ray_threads

log = logging.getLogger(__name__)

MANIFEST_NAME = RAY_MANIFEST_NAME


def default_manifest(jobs: Sequence[ImageJob], output: str | Path | None) -> Path:
    """``<output folder>/gantool-manifest.jsonl``; with -o FILE.png beside it; without -o
    in the deepest folder holding all outputs."""
    if output is not None:
        out = Path(output).expanduser()
        folder = out.parent if out.suffix.lower() in (".png", ".jsonl") and not out.is_dir() else out
    else:
        folder = Path(os.path.commonpath([str(job.output.parent.resolve()) for job in jobs]))
    return folder / MANIFEST_NAME


def check_manifest_target(path: Path) -> None:
    """The manifest may replace an earlier manifest, never another file of the user's."""
    if path.suffix.lower() in IMAGE_EXTENSIONS or path.is_dir():
        raise InputError(f"--manifest {path} must name a .jsonl file")
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with open(path, encoding="utf-8") as f:
            first = json.loads(f.readline())
        ours = isinstance(first, dict) and {"input", "status"} <= first.keys()
    except (OSError, UnicodeDecodeError, ValueError):
        ours = False
    if not ours:
        raise InputError(f"refusing to replace {path}: it is not a gantool manifest (give another --manifest)")


def manifest_status(result: FileResult) -> str:
    """The manifest's status of one input."""
    if not result.ok:
        return "failed"
    return "no hole" if result.no_hole else "inpainted"


class Manifest:
    """JSON lines, one per input, streamed to a temp file and renamed onto the manifest
    at the end (also after an interrupt or failure: what was done is recorded)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        ensure_writable_dir(path.parent)
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.file: IO[str] = open(self.tmp, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def add(self, **entry: Any) -> None:
        self.file.write(json.dumps(entry) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)


def wind_down(
    ray: Any,
    started_here: bool,
    book: Manifest | None,
    todo: Sequence[ImageJob],
    reported: set[str],
    begun: float,
    overwrite: bool,
    missing_cause: str,
    record: Callable[[FileResult, str | None, str | None, float | None], None],
    threads_before: set[threading.Thread] | None = None,
) -> None:
    """Stop Ray, then record every file not reported yet in its true state, and close the manifest.

    ``threads_before``: the threads alive before the run; those it started end first
    (:func:`~gantool.inference.ray_connect.settle_ray_threads`)."""
    try:
        if started_here:
            if threads_before is not None and (still := settle_ray_threads(threads_before)):
                log.debug("Ray Data threads still running at shutdown: %s", ", ".join(still))
            ray.shutdown()  # no worker writes after this: what exists now is the truth
    finally:
        if book is not None:
            for job in todo:
                if str(job.source) in reported:
                    continue
                if finished_by_this_run(job, begun, overwrite):
                    record(written(job), None, None, None)  # its row never reached the driver
                else:
                    record(FileResult(job.source, error=f"{job.source}: {missing_cause}"), None, None, None)
            book.close()


def finished_by_this_run(job: ImageJob, begun: float, overwrite: bool) -> bool:
    """Whether a worker wrote ``job``'s output in this run (outputs are renamed into place whole)."""
    try:
        mtime = job.output.stat().st_mtime
    except OSError:
        return False
    # Without --overwrite the output did not exist when the run was planned; with it, only a
    # file newer than the run's start is this run's.
    return not overwrite or mtime >= begun - 1.0

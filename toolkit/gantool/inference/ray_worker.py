"""The worker side of ``gantool inpaint --ray``: one :class:`InpaintWorker` per Ray actor.

Ray Data calls it (``map_batches`` with a callable class) with rows that are chunks of
files; it runs the local pipeline's per-file steps on them and returns one small row per
file. The driver (:mod:`gantool.inference.ray`) plans the chunks and records the rows.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.constants import DEFAULT_BLEND
from gantool.core.processing import allow_pixels
from gantool.inference.pipeline import (
    FILE_ERRORS,
    FileResult,
    ImageJob,
    MaskSource,
    NoHole,
    file_error,
    fill_loaded,
    finish_and_write,
    load_job,
    no_hole,
    skipped,
    written,
)

# A batch whose worker process dies (a crash, OOM kill, lost node) is retried on a
# restarted actor; after this many tries on a node its unfinished files are reported
# as not processed and the run goes on.
MAX_TRIES = 3
# Test hook (tests/test_ray_inpaint.py): "NAME" or "NAME:MARKER". A worker reaching the
# file NAME exits the process (as a crash would); with MARKER it does so only while
# MARKER does not exist, creating it first (so the retry succeeds).
DIE_ON_ENV = "GANTOOL_TEST_RAY_DIE_ON"
# A row's ms for a file this worker did not time (found done): the manifest records null.
NOT_TIMED = -1.0


class InpaintWorker:
    """The callable class of ``map_batches``: one per actor, the model opened once.

    Each call gets rows that are chunks of files (the driver's grouping) and returns
    one row per file: source, output, error, no_hole, skipped, provider, backend, ms.
    """

    def __init__(
        self,
        model: str,
        provider: str,
        backend_name: str,
        precision: str,
        mask: str | None,
        boxes: Sequence[tuple[int, int, int, int]],
        strategy: str,
        batch_size: int,
        crop_margin: int | None,
        overwrite: bool,
        run_id: str,
        blend: str = DEFAULT_BLEND,
        die_on: str | None = None,
        max_pixels: int | None = None,
    ) -> None:
        import ray  # the optional extra; this runs in a Ray actor

        if max_pixels is not None:
            allow_pixels(max_pixels)  # this actor's process, as the driver's

        from gantool.runtime.backends import load_backend  # delayed: imports onnxruntime/torch in the actor only

        self.backend = load_backend(model, provider, backend_name, precision)
        self.masks = MaskSource(mask, [tuple(b) for b in boxes])  # type: ignore[misc]
        self.mask_files = {p.resolve() for p in self.masks.protected_files()}
        self.strategy, self.batch_size, self.crop_margin, self.blend = strategy, batch_size, crop_margin, blend
        self.overwrite = overwrite
        self.die_on = die_on
        # Tries per chunk, kept where a restarted actor on this node finds them; the folder
        # exists only while a chunk is in progress (see _guarded_chunk), so none is left behind.
        self.tries_dir = Path(ray.get_runtime_context().get_temp_dir()) / "gantool" / run_id

    def _maybe_die(self, job: ImageJob) -> None:
        if not self.die_on:
            return
        name, _, marker = self.die_on.partition(":")
        if job.source.name != name:
            return
        if marker:
            if Path(marker).exists():
                return
            Path(marker).touch()
        os._exit(3)  # a crash, not an exception: Ray sees the actor die

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        rows: dict[str, list[Any]] = {
            k: [] for k in ("source", "output", "error", "no_hole", "skipped", "provider", "backend", "ms")
        }
        for chunk, sources, outputs, relatives in zip(
            batch["chunk"], batch["sources"], batch["outputs"], batch["relatives"]
        ):
            jobs = [ImageJob(Path(s), Path(o), Path(r)) for s, o, r in zip(sources, outputs, relatives)]
            for result, ms in self._guarded_chunk(int(chunk), jobs):
                rows["source"].append(str(result.source))
                rows["output"].append(str(result.output) if result.output is not None else "")
                rows["error"].append(result.error or "")
                rows["no_hole"].append(result.no_hole)
                rows["skipped"].append(result.skipped)
                rows["provider"].append(self.backend.provider)
                rows["backend"].append(self.backend.name)
                rows["ms"].append(NOT_TIMED if ms is None else round(ms, 2))
        return rows

    def _guarded_chunk(self, chunk: int, jobs: list[ImageJob]) -> Iterator[tuple[FileResult, float | None]]:
        """Ray restarts a dead actor and retries its batch without limit: count the tries
        here, and after MAX_TRIES report the chunk's unfinished files instead of looping."""
        record = self.tries_dir / f"chunk-{chunk}"
        tries = int(record.read_text() or 0) if record.exists() else 0
        if tries >= MAX_TRIES:
            for job in jobs:
                if not self.overwrite and job.output.exists():
                    yield written(job), None  # by an earlier try
                else:
                    cause = f"not processed: the worker process died {tries} times on its batch"
                    yield FileResult(job.source, error=f"{job.source}: {cause}"), None
            self._forget(record)
            return
        for _ in range(3):  # another actor on this node may remove the empty folder meanwhile
            try:
                self.tries_dir.mkdir(parents=True, exist_ok=True)
                record.write_text(str(tries + 1))
                break
            except FileNotFoundError:
                continue
        yield from self._run_chunk(jobs, retried=tries > 0)
        self._forget(record)

    def _forget(self, record: Path) -> None:
        record.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: another chunk of this run is in progress here
            self.tries_dir.rmdir()

    def _run_chunk(self, jobs: list[ImageJob], retried: bool = False) -> Iterator[tuple[FileResult, float | None]]:
        """The local loop's steps for one chunk; ms = the file's read and write time
        plus its share of the chunk's model time (None: nothing was timed here)."""
        protected = self.mask_files | {job.source.resolve() for job in jobs}  # the driver checked the rest
        loaded, spent = [], {}
        for job in jobs:
            self._maybe_die(job)
            start = time.perf_counter()
            if not self.overwrite and job.output.exists():
                # The driver saw no output here when it planned the run. On a retried batch an
                # earlier try, whose worker died after this write, made it: done by this run. On
                # a first try another process wrote it since (e.g. a worker of an interrupted run
                # still finishing): kept untouched, and reported as skipped, not as this run's work.
                yield (written(job) if retried else skipped(job)), None
                continue
            try:
                loaded.append((job, *load_job(job, self.masks, self.overwrite, protected)))
            except NoHole:
                yield no_hole(job), (time.perf_counter() - start) * 1e3
            except FILE_ERRORS as e:
                yield file_error(job, e), (time.perf_counter() - start) * 1e3
            spent[job] = time.perf_counter() - start
        start = time.perf_counter()
        outputs = fill_loaded(
            self.backend,
            [(image, mask) for _, image, mask in loaded],
            self.strategy,
            self.batch_size,
            self.crop_margin,
        )
        share = (time.perf_counter() - start) / max(len(loaded), 1)
        for (job, image, mask), fills in zip(loaded, outputs):
            start = time.perf_counter()
            if isinstance(fills, Exception):
                result = file_error(job, fills)
            else:
                try:
                    finish_and_write(job, image, mask, fills, self.blend, self.overwrite)
                    result = written(job)
                except FILE_ERRORS as e:
                    result = file_error(job, e)
            yield result, (spent[job] + share + time.perf_counter() - start) * 1e3

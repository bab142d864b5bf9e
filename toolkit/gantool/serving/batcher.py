"""The model worker of ``gantool serve``: one thread runs the model, requests batch.

:class:`ModelRunner` runs a batch (same-size inputs together, retried one by one when it
fails, skipping requests whose client left); :class:`Batcher` collects the batches on its
own thread; ``gantool serve --ray`` collects them with Ray Serve's ``@serve.batch``
(:mod:`gantool.serving.ray_serve`) and runs them with the same :class:`ModelRunner`.

Blending and compositing are the caller's (:func:`gantool.inference.inpainter.finish_image`
on a request's worker thread), so this thread runs nothing but the model.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from gantool.core.errors import GantoolError, first_line
from gantool.inference.inpainter import ModelFills, fill_images, inpaint_images

if TYPE_CHECKING:
    from gantool.runtime.backends import Backend

log = logging.getLogger(__name__)


class QueueFullError(GantoolError):
    """The server holds ``max_queue`` requests already, or is shutting down."""


@dataclass
class _Job:
    image: Image.Image
    mask: np.ndarray
    strategy: str
    future: Future[ModelFills]
    model_pixels: int = 0


class ModelRunner:
    """Runs batches of jobs through the model, shared by every way of collecting them: the
    :class:`Batcher` (plain ``gantool serve``: its own thread and queue) and Ray Serve's
    ``@serve.batch`` method (``gantool serve --ray``, :mod:`gantool.serving.ray_serve`).

    A batch goes through :func:`gantool.inference.inpainter.fill_images`, which batches
    same-size model inputs. One bad job does not fail its batch: the batch is retried job by
    job. A job whose future was cancelled (its client left) is skipped. The counters and the
    warm-up state are what ``/healthz`` and ``/readyz`` report.
    """

    def __init__(
        self,
        backend: Backend,
        max_batch: int,
        crop_margin: int | None = None,
        max_batch_pixels: int | None = None,
        release_memory_pixels: int = 0,
    ) -> None:
        self.backend = backend
        self.release_memory_pixels = release_memory_pixels  # passed to every model run (Backend.run)
        self.max_batch = max_batch
        self.crop_margin = crop_margin
        self.max_batch_pixels = max_batch_pixels
        self.ready = threading.Event()
        self.warmup_error: str | None = None
        self.batches = 0
        self.images = 0
        self.skipped = 0  # jobs whose client left before the model ran

    @property
    def queued(self) -> int:
        """Jobs waiting for the model (not counting the batch that runs)."""
        return 0

    def split_by_pixels(self, jobs: Sequence[_Job]) -> list[list[_Job]]:
        """``jobs`` in order, cut into batches of at most ``max_batch_pixels`` model pixels
        together (a job over it alone runs alone), so one batch's memory stays within what
        one request may use."""
        batches: list[list[_Job]] = []
        pixels = 0
        for job in jobs:
            if not batches or (self.max_batch_pixels is not None and pixels + job.model_pixels > self.max_batch_pixels):
                batches.append([])
                pixels = 0
            batches[-1].append(job)
            pixels += job.model_pixels
        return batches

    # What the app calls (build_app): each way of collecting jobs defines these.
    def start(self) -> None:
        """Begin: the warm-up inference, then take jobs."""
        raise NotImplementedError

    def drain(self) -> None:
        """Shutting down: refuse new jobs and fail the queued ones now (503); the running batch finishes."""
        raise NotImplementedError

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the running batch, fail the queued jobs."""
        raise NotImplementedError

    def submit(self, image: Image.Image, mask: np.ndarray, strategy: str, model_pixels: int = 0) -> Future[ModelFills]:
        """Queue one image for the model; raises :class:`QueueFullError` when it cannot take it.

        The future holds the model's output (:func:`gantool.inference.inpainter.fill_images`).
        Cancelling it (the client left) before the model takes it skips its work.
        """
        raise NotImplementedError

    def _warm_up(self) -> None:
        size = self.backend.train_size
        image = Image.new("RGB", (size, size), (128, 128, 128))
        mask = np.zeros((size, size), np.float32)
        mask[size // 4 : size // 2, size // 4 : size // 2] = 1.0
        started = time.perf_counter()
        try:
            inpaint_images(self.backend, [(image, mask)], "full", 1)
        except Exception as e:  # reported by /readyz; the worker keeps serving
            self.warmup_error = first_line(e)
            log.error("warm-up inference failed: %s", self.warmup_error)
        else:
            log.info("ready: warm-up inference took %.2f s", time.perf_counter() - started)
        self.ready.set()

    @staticmethod
    def _fail(job: _Job) -> None:
        if job.future.set_running_or_notify_cancel():
            job.future.set_exception(QueueFullError("the server is shutting down"))

    def _run(self, batch: Sequence[_Job]) -> None:
        # A cancelled future is a request whose client went away: skip its work.
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        self.skipped += len(batch) - len(live)
        by_strategy: dict[str, list[_Job]] = {}
        for job in live:
            by_strategy.setdefault(job.strategy, []).append(job)
        for strategy, jobs in by_strategy.items():
            try:
                results: list[ModelFills] | None = self._fill(
                    [(j.image, j.mask) for j in jobs], strategy, self.max_batch
                )
            except Exception:  # retried one by one below, so one bad job fails alone
                results = None
            for index, job in enumerate(jobs):
                try:
                    if results is None:
                        result = self._fill([(job.image, job.mask)], strategy, 1)[0]
                    else:
                        result = results[index]
                except Exception as e:  # the worker thread must survive any job; the request gets the error
                    job.future.set_exception(e)
                else:
                    job.future.set_result(result)
        self.batches += 1
        self.images += len(live)

    def _fill(self, items: list[tuple[Image.Image, np.ndarray]], strategy: str, batch_size: int) -> list[ModelFills]:
        return fill_images(self.backend, items, strategy, batch_size, self.crop_margin, self.release_memory_pixels)


class Batcher(ModelRunner):
    """Runs the model on one worker thread (plain ``gantool serve``).

    The thread first runs a warm-up inference (then :attr:`ready` is set). It
    then takes the oldest job, collects the jobs that arrive within ``wait_s``
    (up to ``max_batch``, and up to ``max_batch_pixels`` model pixels together, so
    one batch's memory stays within what one request may use) and runs them
    (:meth:`ModelRunner._run`).
    """

    def __init__(
        self,
        backend: Backend,
        max_batch: int,
        wait_s: float,
        max_queue: int,
        crop_margin: int | None = None,
        max_batch_pixels: int | None = None,
        release_memory_pixels: int = 0,
    ) -> None:
        super().__init__(backend, max_batch, crop_margin, max_batch_pixels, release_memory_pixels)
        self.wait_s = wait_s
        self.max_queue = max_queue
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._held: _Job | None = None  # taken but over the batch's pixel budget: first of the next
        self._queued = 0
        self._draining = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="gantool-serve-model", daemon=True)

    @property
    def queued(self) -> int:
        """Jobs waiting for the model (not counting the batch that runs)."""
        return self._queued

    def start(self) -> None:
        self._thread.start()

    def drain(self) -> None:
        """Shutting down: refuse new jobs and fail the queued ones now (503); the running batch finishes."""
        with self._lock:
            self._draining = True
        while True:  # from this thread, so they answer now, not after the running batch
            try:
                job = self._take(0)
            except queue.Empty:
                break
            if job is not None:
                self._fail(job)
        self._queue.put(None)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the running batch, fail the queued jobs, end the thread."""
        self.drain()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, image: Image.Image, mask: np.ndarray, strategy: str, model_pixels: int = 0) -> Future[ModelFills]:
        """Queue one image for the model; raises :class:`QueueFullError` when ``max_queue`` jobs wait.

        The future holds the model's output (:func:`gantool.inference.inpainter.fill_images`).
        Cancelling it (the client left) before the model takes it skips its work.
        """
        job = _Job(image, mask, strategy, Future(), model_pixels)
        with self._lock:
            if self._draining:
                raise QueueFullError("the server is shutting down")
            if self._queued >= self.max_queue:
                raise QueueFullError(f"the server is busy ({self._queued} images queued); retry shortly")
            self._queued += 1
        self._queue.put(job)
        return job.future

    def _take(self, timeout: float | None) -> _Job | None:
        job = self._queue.get(timeout=timeout) if timeout is None or timeout > 0 else self._queue.get_nowait()
        if job is not None:
            with self._lock:
                self._queued -= 1
        return job

    def _collect(self) -> list[_Job] | None:
        first, self._held = (self._held, None) if self._held is not None else (self._take(None), None)
        if first is None or self._draining:
            if first is not None:
                self._fail(first)
            return None
        batch = [first]
        pixels = first.model_pixels
        deadline = time.monotonic() + self.wait_s
        while len(batch) < self.max_batch:
            try:
                job = self._take(deadline - time.monotonic())
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # stop after this batch
                break
            if self.max_batch_pixels is not None and pixels + job.model_pixels > self.max_batch_pixels:
                self._held = job  # over one batch's memory: it starts the next batch
                break
            batch.append(job)
            pixels += job.model_pixels
        return batch

    def _work(self) -> None:
        self._warm_up()
        while True:
            batch = self._collect()
            if batch is None:
                break
            self._run(batch)
            # Not kept while the next _collect waits: the batch holds its images and the model's output.
            del batch
        while True:  # stopped: fail whatever still waits
            try:
                job = self._take(0)
            except queue.Empty:
                break
            if job is not None:
                self._fail(job)

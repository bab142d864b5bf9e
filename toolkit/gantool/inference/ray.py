"""``gantool inpaint --ray``: the file pipeline on a Ray cluster, with Ray Data as the engine.

The driver lists the inputs and names the outputs (:func:`gantool.inference.pipeline.plan_jobs`,
the same names and rules as ``gantool inpaint``), skips inputs whose output already
exists (so a re-run resumes an interrupted one), and sends *paths* to an actor pool
(``Dataset.map_batches`` with a callable class). Each actor opens the model once,
then for each chunk of ``batch_size`` files reads them, inpaints them and writes the
PNGs atomically with the same per-file steps as the local pipeline
(:func:`~gantool.inference.pipeline.load_job`, :func:`~gantool.inference.pipeline.fill_loaded`,
:func:`~gantool.inference.pipeline.finish_and_write`). Pixels never pass through the driver: only
one small result row per file comes back, and the driver writes it to a JSON-lines
manifest and the progress bar.

The driver groups the files into chunks exactly as the local loop does, so each
model batch holds the same images and the PNGs are byte-identical to ``gantool
inpaint`` with the same model, backend and provider.

Ray is an optional extra (``pip install "gantool[ray]"``), imported only when this
runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gantool.core.artifacts import resolve_model
from gantool.core.constants import (
    BACKEND_CHOICES,
    DEFAULT_BACKEND,
    DEFAULT_BLEND,
    DEFAULT_INPAINT_BATCH,
    DEFAULT_PRECISION,
    DEFAULT_PROVIDER,
    DEFAULT_RAY_TIMEOUT_S,
    DEFAULT_STRATEGY,
    PRECISIONS,
    PROVIDERS,
    STRATEGIES,
)
from gantool.core.errors import InputError, check_choice, first_line
from gantool.core.fileio import absolute_path
from gantool.core.processing import allow_pixels, check_blend
from gantool.core.signals import signals_deferred
from gantool.inference.manifest import Manifest, check_manifest_target, default_manifest, manifest_status, wind_down
from gantool.inference.pipeline import (
    FileResult,
    ImageJob,
    MaskSource,
    RunSummary,
    already_done,
    check_output,
    check_skip_options,
    collect_images,
    file_error,
    plan_jobs,
    protected_paths,
    skipped,
)
from gantool.inference.ray_connect import (
    FolderLock,
    Terminated,
    check_reachable,
    connect,
    quiet_logger,
    release_interrupted,
    shielded,
    sigterm_as_interrupt,
)
from gantool.inference.ray_worker import DIE_ON_ENV, NOT_TIMED, InpaintWorker

log = logging.getLogger(__name__)

RAY_MISSING = 'Ray is not installed: pip install "gantool[ray]"'
MAX_BLOCKS = 10_000


def import_ray() -> Any:
    """The ``ray`` module, or a one-line InputError naming the extra to install."""
    try:
        import ray  # the optional extra: imported only when --ray is used
        import ray.data
    except ImportError:
        raise InputError(RAY_MISSING) from None
    return ray


# ---------------------------------------------------------------------------- plan


@dataclass
class RayPlan:
    """What the run will do, known once Ray is up (passed to ``on_start``)."""

    where: str  # "local Ray cluster (2 CPUs, 0 GPUs)" or "Ray cluster at ADDRESS (...)"
    actors: int
    gpus_per_actor: float
    batch_size: int
    jobs: list[ImageJob]  # to run
    skipped: list[ImageJob]  # output exists (resumed run)
    manifest: Path


@dataclass
class RayRunSummary(RunSummary):
    manifest: Path | None = None
    startup_seconds: float = 0.0  # Ray start/connect until the first result came back
    where: str = ""
    finished_at: list[float] = field(default_factory=list)  # perf_counter of each result (benchmarks)

    def line(self) -> str:
        return (
            f"{self.inpainted} inpainted, {self.failed} failed{self.skip_notes()} in {self.seconds:.1f} s "
            f"(provider {self.provider or '-'}, backend {self.backend or '-'}); manifest: {self.manifest}"
        )


def _cluster_resources(ray: Any) -> tuple[float, float, int]:
    resources = ray.cluster_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    return float(resources.get("CPU", 0)), float(resources.get("GPU", 0)), max(nodes, 1)


def plan_actors(
    provider: str, cpus: float, gpus: float, nodes: int, actors: int | None, gpus_per_actor: float | None
) -> tuple[int, float]:
    """(actors, GPUs per actor). GPU actors when the provider is cuda/tensorrt, or auto
    on a cluster with GPUs: one per GPU by default. CPU actors: one per node by default
    (ONNX Runtime already uses all of a node's cores). Fails instead of waiting forever
    for resources the cluster does not have."""
    if gpus_per_actor is None:
        gpus_per_actor = 1.0 if provider in ("cuda", "tensorrt") or (provider == "auto" and gpus > 0) else 0.0
    if gpus_per_actor < 0:
        raise InputError(f"--gpus-per-actor must be >= 0, got {gpus_per_actor}")
    if gpus_per_actor > 0 and gpus < gpus_per_actor:
        raise InputError(
            f"the Ray cluster has {gpus:g} GPUs; {gpus_per_actor:g} per actor cannot be met "
            "(use --provider cpu, or a cluster with GPUs)"
        )
    if actors is None:
        actors = int(gpus // gpus_per_actor) if gpus_per_actor > 0 else nodes
    if actors < 1:
        raise InputError(f"--actors must be at least 1, got {actors}")
    if gpus_per_actor > 0 and actors * gpus_per_actor > gpus + 1e-9:
        raise InputError(f"{actors} actors x {gpus_per_actor:g} GPUs need more than the cluster's {gpus:g} GPUs")
    if actors > cpus:
        raise InputError(f"{actors} actors need one CPU each; the Ray cluster has {cpus:g}")
    return actors, gpus_per_actor


# -------------------------------------------------------------------------- driver


def _chunk_rows(chunks: Sequence[Sequence[ImageJob]]) -> list[dict[str, Any]]:
    """One dataset row per chunk of files."""
    rows = []
    for number, chunk in enumerate(chunks):
        rows.append({
            "chunk": number,
            "sources": [str(j.source) for j in chunk],
            "outputs": [str(j.output) for j in chunk],
            "relatives": [str(j.relative) for j in chunk],
        })  # fmt: skip
    return rows


def _check_choices(provider: str, backend_name: str, precision: str, strategy: str) -> None:
    for what, value, choices in (
        ("provider", provider, PROVIDERS),
        ("backend", backend_name, BACKEND_CHOICES),
        ("precision", precision, PRECISIONS),
        ("strategy", strategy, STRATEGIES),
    ):
        check_choice(what, value, choices)


# long: the driver's whole run (checks, the plan, the actor pool, results streamed into the manifest)
# sits inside the try/finally blocks that own the Ray cluster and the manifest, so Ctrl-C cleans up both.
def ray_inpaint(
    images: Sequence[str | Path],
    *,
    model: str | Path | None = None,
    provider: str = DEFAULT_PROVIDER,
    backend_name: str = DEFAULT_BACKEND,
    precision: str = DEFAULT_PRECISION,
    mask: str | Path | None = None,
    boxes: Sequence[tuple[int, int, int, int]] = (),
    output: str | Path | None = None,
    strategy: str = DEFAULT_STRATEGY,
    batch_size: int = DEFAULT_INPAINT_BATCH,
    crop_margin: int | None = None,
    blend: str = DEFAULT_BLEND,
    overwrite: bool = False,
    skip_existing: bool = False,
    max_pixels: int | None = None,
    address: str | None = None,
    timeout: float = DEFAULT_RAY_TIMEOUT_S,
    actors: int | None = None,
    gpus_per_actor: float | None = None,
    manifest: str | Path | None = None,
    on_start: Callable[[RayPlan], None] | None = None,
    on_result: Callable[[FileResult], None] | None = None,
) -> RayRunSummary:
    """``gantool inpaint --ray`` as one call. Returns when every input is accounted for
    in the manifest (inpainted, failed, skipped, or not processed after a worker died).

    Uses the Ray of this process when it is already initialized (and leaves it up);
    else connects to ``address`` (within ``timeout`` seconds, or an InputError naming
    it), or starts a local cluster with this machine's CPUs and GPUs and shuts it down
    at the end. The output folders are locked for the run: a concurrent run on them is
    refused. Ctrl-C or SIGTERM (raised as :class:`Terminated`) ends the run with every
    input in the manifest in its true state (an output that a worker finished counts
    as inpainted).
    """
    _check_choices(provider, backend_name, precision, strategy)
    check_blend(blend)  # an unknown mode, or no OpenCV, fails before Ray starts
    check_skip_options(overwrite, skip_existing)
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    if not timeout > 0:
        raise InputError(f"--ray-timeout must be positive, got {timeout}")
    if max_pixels is not None:
        allow_pixels(max_pixels)
    # Absolute paths from here on: Ray's workers may run in another folder (a cluster joined by
    # address, or Ray started by another process), and the manifest is read from anywhere.
    images = [absolute_path(i) for i in images]
    output, mask = (absolute_path(p) if p is not None else None for p in (output, mask))
    masks = MaskSource(mask, boxes)
    found = collect_images(images, skip=[masks.path] if masks.path is not None else [])
    jobs = plan_jobs(found, output)
    model_path, _ = resolve_model(model, backend_name)  # a typo fails here, before Ray starts
    model_path = absolute_path(model_path)
    manifest_path = Path(manifest).expanduser() if manifest is not None else default_manifest(jobs, output)
    check_manifest_target(manifest_path)
    ray = import_ray()
    if address:  # also when this process's Ray is up: a wrong address is a mistake either way
        timeout = check_reachable(address, timeout)  # what is left of it bounds ray.init
    lock = FolderLock([manifest_path.parent, default_manifest(jobs, output).parent])
    try:
        return _run(ray, jobs, masks, model_path, manifest_path, address, timeout, actors, gpus_per_actor,
                    on_start, on_result, provider=provider, backend_name=backend_name, precision=precision,
                    boxes=boxes, strategy=strategy, batch_size=batch_size, crop_margin=crop_margin, blend=blend,
                    overwrite=overwrite, skip_existing=skip_existing, max_pixels=max_pixels)  # fmt: skip
    finally:
        lock.release()


# long: the Ray run from connection to wind-down in order; its signal and manifest steps must stay visibly in sequence
def _run(
    ray: Any,
    jobs: list[ImageJob],
    masks: MaskSource,
    model_path: Path,
    manifest_path: Path,
    address: str | None,
    timeout: float,
    actors: int | None,
    gpus_per_actor: float | None,
    on_start: Callable[[RayPlan], None] | None,
    on_result: Callable[[FileResult], None] | None,
    **options: Any,
) -> RayRunSummary:
    overwrite, skip_existing, batch_size = options["overwrite"], options["skip_existing"], options["batch_size"]
    start, begun = time.perf_counter(), time.time()
    summary = RayRunSummary()
    protected = protected_paths(jobs, masks)
    pre_failed: list[FileResult] = []
    done_before: list[ImageJob] = []
    runnable: list[ImageJob] = []  # in input order, as the local loop would see them
    for job in jobs:
        if already_done(job, skip_existing, protected):
            done_before.append(job)  # done by an earlier run: resume
            continue
        try:
            check_output(job, overwrite, protected)
        except InputError as e:
            pre_failed.append(file_error(job, e))  # exists, or its output would replace an input or mask
        runnable.append(job)
    # The local loop's chunks of batch_size; a refused file leaves its chunk (locally it fails
    # on loading and never reaches the model), so every model batch holds the same images.
    refused = {result.source for result in pre_failed}
    chunks = [
        [job for job in runnable[i : i + batch_size] if job.source not in refused]
        for i in range(0, len(runnable), batch_size)
    ]
    chunks = [chunk for chunk in chunks if chunk]
    todo = [job for chunk in chunks for job in chunk]

    started_here = not ray.is_initialized()
    if started_here:
        connect(ray, address, timeout)
    # After ray.init, which installs Ray's own SIGTERM handler in the driver (it would end the
    # run as a failed Ray job, with a manifest of false failures).
    signals = contextlib.ExitStack()
    signals.enter_context(sigterm_as_interrupt())
    book: Manifest | None = None
    reported: set[str] = set()
    missing_cause = "not processed: its batch failed in Ray (see the log above)"
    interrupted: BaseException | None = None
    threads_before = set(threading.enumerate())

    def record(result: FileResult, provider: str | None, backend: str | None, ms: float | None) -> None:
        # Whole or not at all: a signal between marking a file reported and writing its line lost the
        # line (the wind-down skips reported files), so the handler's exception waits for the block's end.
        with signals_deferred():
            reported.add(str(result.source))
            summary.results.append(result)
            summary.finished_at.append(time.perf_counter())
            status = "skipped" if result.skipped else manifest_status(result)
            assert book is not None
            book.add(input=str(result.source), output=str(result.output) if result.output is not None else None,
                     status=status, error=result.error, provider=provider, ms=ms)  # fmt: skip
        if on_result is not None and not result.skipped:
            on_result(result)

    try:
        cpus, gpus, nodes = _cluster_resources(ray)
        context = ray.get_runtime_context()
        if address or not started_here:
            summary.where = f"Ray cluster at {getattr(context, 'gcs_address', address)} ({cpus:g} CPUs, {gpus:g} GPUs, {nodes} nodes)"
        else:
            summary.where = f"local Ray cluster ({cpus:g} CPUs, {gpus:g} GPUs)"
        n_actors, n_gpus = plan_actors(options["provider"], cpus, gpus, nodes, actors, gpus_per_actor)
        # No more actors than batches: each extra one would load the model for nothing (and Ray warns).
        n_actors = min(n_actors, max(1, len(chunks)))
        plan = RayPlan(summary.where, n_actors, n_gpus, batch_size, todo, done_before, manifest_path)
        if on_start is not None:
            on_start(plan)
        summary.manifest = manifest_path
        book = Manifest(manifest_path)
        for job in done_before:
            record(skipped(job), None, None, None)
        for result in pre_failed:
            record(result, None, None, None)
        worker_options = {k: v for k, v in options.items() if k != "skip_existing"}
        rows = _execute(ray, chunks, model_path, masks, n_actors, n_gpus, **worker_options)
        try:
            for row in rows if todo else ():
                if not summary.startup_seconds:
                    summary.startup_seconds = time.perf_counter() - start
                if row["source"] in reported:
                    continue  # a retried batch's second report of a file
                summary.provider, summary.backend = row["provider"], row["backend"]
                result = FileResult(Path(row["source"]), output=Path(row["output"]) if row["output"] else None,
                                    error=row["error"] or None, no_hole=bool(row["no_hole"]),
                                    skipped=bool(row["skipped"]))  # fmt: skip
                ms = None if row["ms"] == NOT_TIMED else float(row["ms"])
                record(result, row["provider"], row["backend"], ms)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as Terminated
            interrupted = e
            missing_cause = f"not processed: interrupted ({'SIGTERM' if isinstance(e, Terminated) else 'SIGINT'})"
        except Exception as e:  # the Ray job itself failed: every file it did not report is recorded, not lost
            missing_cause = f"not processed: {first_line(e)}"
            log.error("Ray job failed: %s", first_line(e))
        finally:
            rows.close()  # stops the Ray Data execution (and its actors) now, not at garbage collection
    except KeyboardInterrupt as e:
        interrupted = e
        missing_cause = f"not processed: interrupted ({'SIGTERM' if isinstance(e, Terminated) else 'SIGINT'})"
    finally:
        with shielded():
            if interrupted is not None:
                release_interrupted(interrupted, threads_before)
            wind_down(ray, started_here, book, todo, reported, begun, overwrite, missing_cause, record, threads_before)
        signals.close()
    if interrupted is not None:
        raise interrupted
    summary.seconds = time.perf_counter() - start
    return summary


def _execute(
    ray: Any,
    chunks: Sequence[Sequence[ImageJob]],
    model_path: Path,
    masks: MaskSource,
    actors: int,
    gpus_per_actor: float,
    *,
    provider: str,
    backend_name: str,
    precision: str,
    boxes: Sequence[tuple[int, int, int, int]],
    strategy: str,
    batch_size: int,
    crop_margin: int | None,
    blend: str,
    overwrite: bool,
    max_pixels: int | None,
) -> Generator[dict[str, Any], None, None]:
    """Stream one result row per file from the actor pool."""
    from ray.data import ActorPoolStrategy, DataContext

    with warnings.catch_warnings():
        # Ray's own DataContext() sets its deprecated fields (use_polars, ...) to their
        # defaults and warns for each; the first get_current() in a process builds it.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.data\.context")
        data = DataContext.get_current()
    saved = (data.enable_progress_bars, data.max_errored_blocks, data.print_on_execution_start)
    data.enable_progress_bars = False  # one bar, the caller's
    data.print_on_execution_start = False
    data.max_errored_blocks = -1  # a batch that fails inside Ray is reported by the driver; the rest goes on
    try:
        with quiet_logger("ray.data"), quiet_logger("ray.data._internal.progress", _DropProgressBarNotice()):
            rows = _chunk_rows(chunks)
            # A Ray task hands back its results when its whole input block is done: one chunk
            # per block keeps the progress bar and the manifest moving, and a dying worker
            # redoes little; MAX_BLOCKS bounds the scheduling work for millions of files.
            dataset = ray.data.from_items(rows, override_num_blocks=min(len(rows), MAX_BLOCKS))
            results = dataset.map_batches(
                InpaintWorker,
                fn_constructor_kwargs={
                    "model": str(model_path),
                    "provider": provider,
                    "backend_name": backend_name,
                    "precision": precision,
                    "mask": str(masks.path) if masks.path is not None else None,
                    "boxes": [list(b) for b in boxes],
                    "strategy": strategy,
                    "batch_size": batch_size,
                    "crop_margin": crop_margin,
                    "blend": blend,
                    "overwrite": overwrite,
                    "run_id": uuid.uuid4().hex,
                    "die_on": os.environ.get(DIE_ON_ENV) or None,
                    "max_pixels": max_pixels,
                },
                batch_size=1,  # one chunk of files per call
                batch_format="numpy",
                compute=ActorPoolStrategy(size=actors),
                num_gpus=gpus_per_actor or None,  # CUDA actors: Ray gives each its own GPU(s)
            )
            yield from results.iter_rows()
    finally:
        data.enable_progress_bars, data.max_errored_blocks, data.print_on_execution_start = saved


class _DropProgressBarNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Progress bars disabled" not in record.getMessage()  # we show our own bar

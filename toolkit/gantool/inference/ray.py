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
import json
import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from gantool.core.artifacts import resolve_model
from gantool.core.constants import (
    BACKEND_CHOICES,
    DEFAULT_BACKEND,
    DEFAULT_BLEND,
    DEFAULT_INPAINT_BATCH,
    DEFAULT_PRECISION,
    DEFAULT_PROVIDER,
    DEFAULT_STRATEGY,
    PRECISIONS,
    PROVIDERS,
    RAY_MANIFEST_NAME,
    STRATEGIES,
)
from gantool.core.errors import InputError, check_choice, first_line
from gantool.core.fileio import ensure_writable_dir
from gantool.core.processing import IMAGE_EXTENSIONS, check_blend
from gantool.inference.pipeline import (
    FILE_ERRORS,
    FileResult,
    ImageJob,
    MaskSource,
    NoHole,
    RunSummary,
    check_output,
    collect_images,
    file_error,
    fill_loaded,
    finish_and_write,
    load_job,
    no_hole,
    plan_jobs,
    protected_paths,
    written,
)

log = logging.getLogger(__name__)

MANIFEST_NAME = RAY_MANIFEST_NAME
RAY_MISSING = 'Ray is not installed: pip install "gantool[ray]"'
# A batch whose worker process dies (a crash, OOM kill, lost node) is retried on a
# restarted actor; after this many tries on a node its unfinished files are reported
# as not processed and the run goes on.
MAX_TRIES = 3
# Test hook (tests/test_ray_inpaint.py): "NAME" or "NAME:MARKER". A worker reaching the
# file NAME exits the process (as a crash would); with MARKER it does so only while
# MARKER does not exist, creating it first (so the retry succeeds).
DIE_ON_ENV = "GANTOOL_TEST_RAY_DIE_ON"
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
    skipped: int = 0
    manifest: Path | None = None
    startup_seconds: float = 0.0  # Ray start/connect until the first result came back
    where: str = ""
    finished_at: list[float] = field(default_factory=list)  # perf_counter of each result (benchmarks)

    def line(self) -> str:
        skipped = f", {self.skipped} skipped (output exists)" if self.skipped else ""
        skipped += f", {self.no_hole} skipped (no hole)" if self.no_hole else ""
        return (
            f"{self.inpainted} inpainted, {self.failed} failed{skipped} in {self.seconds:.1f} s "
            f"(provider {self.provider or '-'}, backend {self.backend or '-'}); manifest: {self.manifest}"
        )


def default_manifest(jobs: Sequence[ImageJob], output: str | Path | None) -> Path:
    """``<output folder>/gantool-manifest.jsonl``; with -o FILE.png beside it; without -o
    in the deepest folder holding all outputs."""
    if output is not None:
        out = Path(output).expanduser()
        folder = out.parent if out.suffix.lower() == ".png" and not out.is_dir() else out
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


# -------------------------------------------------------------------------- worker


class InpaintWorker:
    """The callable class of ``map_batches``: one per actor, the model opened once.

    Each call gets rows that are chunks of files (the driver's grouping) and returns
    one row per file: source, output, error, provider, ms.
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
    ) -> None:
        import ray  # the optional extra; this runs in a Ray actor

        from gantool.runtime.backends import load_backend  # delayed: imports onnxruntime/torch in the actor only

        self.backend = load_backend(model, provider, backend_name, precision)
        self.masks = MaskSource(mask, [tuple(b) for b in boxes])  # type: ignore[misc]
        self.mask_files = {p.resolve() for p in self.masks.protected_files()}
        self.strategy, self.batch_size, self.crop_margin, self.blend = strategy, batch_size, crop_margin, blend
        self.overwrite = overwrite
        self.die_on = die_on
        # Tries per chunk, kept where a restarted actor on this node finds them.
        self.tries_dir = Path(ray.get_runtime_context().get_temp_dir()) / "gantool" / run_id
        self.tries_dir.mkdir(parents=True, exist_ok=True)

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
            k: [] for k in ("source", "output", "error", "no_hole", "provider", "backend", "ms")
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
                rows["provider"].append(self.backend.provider)
                rows["backend"].append(self.backend.name)
                rows["ms"].append(round(ms, 2))
        return rows

    def _guarded_chunk(self, chunk: int, jobs: list[ImageJob]) -> Iterator[tuple[FileResult, float]]:
        """Ray restarts a dead actor and retries its batch without limit: count the tries
        here, and after MAX_TRIES report the chunk's unfinished files instead of looping."""
        record = self.tries_dir / f"chunk-{chunk}"
        tries = int(record.read_text() or 0) if record.exists() else 0
        if tries >= MAX_TRIES:
            for job in jobs:
                if not self.overwrite and job.output.exists():
                    yield FileResult(job.source, output=job.output), 0.0
                else:
                    cause = f"not processed: the worker process died {tries} times on its batch"
                    yield FileResult(job.source, error=f"{job.source}: {cause}"), 0.0
            return
        record.write_text(str(tries + 1))
        yield from self._run_chunk(jobs)
        record.unlink(missing_ok=True)

    def _run_chunk(self, jobs: list[ImageJob]) -> Iterator[tuple[FileResult, float]]:
        """The local loop's steps for one chunk; ms = the file's read and write time
        plus its share of the chunk's model time."""
        protected = self.mask_files | {job.source.resolve() for job in jobs}  # the driver checked the rest
        loaded, spent = [], {}
        for job in jobs:
            self._maybe_die(job)
            start = time.perf_counter()
            if not self.overwrite and job.output.exists():
                # The driver saw no output here: an earlier try of this batch, whose worker
                # died after this write, made it. Done, not a failure.
                yield FileResult(job.source, output=job.output), 0.0
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


# -------------------------------------------------------------------------- driver


def _status(result: FileResult) -> str:
    """The manifest's status of one input."""
    if not result.ok:
        return "failed"
    return "no hole" if result.no_hole else "inpainted"


class _Manifest:
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
    address: str | None = None,
    actors: int | None = None,
    gpus_per_actor: float | None = None,
    manifest: str | Path | None = None,
    on_start: Callable[[RayPlan], None] | None = None,
    on_result: Callable[[FileResult], None] | None = None,
) -> RayRunSummary:
    """``gantool inpaint --ray`` as one call. Returns when every input is accounted for
    in the manifest (inpainted, failed, skipped, or not processed after a worker died).

    Uses the Ray of this process when it is already initialized (and leaves it up);
    else connects to ``address``, or starts a local cluster with this machine's CPUs
    and GPUs and shuts it down at the end.
    """
    _check_choices(provider, backend_name, precision, strategy)
    check_blend(blend)  # an unknown mode, or no OpenCV, fails before Ray starts
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    masks = MaskSource(mask, boxes)
    found = collect_images(images, skip=[masks.path] if masks.path is not None else [])
    jobs = plan_jobs(found, output)
    model_path, _ = resolve_model(model, backend_name)  # a typo fails here, before Ray starts
    manifest_path = Path(manifest).expanduser() if manifest is not None else default_manifest(jobs, output)
    check_manifest_target(manifest_path)
    ray = import_ray()

    start = time.perf_counter()
    summary = RayRunSummary()
    protected = protected_paths(jobs, masks)
    pre_failed: list[FileResult] = []
    skipped: list[ImageJob] = []
    runnable: list[ImageJob] = []  # in input order, as the local loop would see them
    for job in jobs:
        try:
            check_output(job, overwrite, protected)
        except InputError as e:
            if job.output.exists() and job.output.resolve() not in protected:
                skipped.append(job)  # done by an earlier run: resume
                continue
            pre_failed.append(file_error(job, e))  # its output would replace an input or mask
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
        with _quiet_logger("ray"):
            if address:
                ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            else:
                ray.init(include_dashboard=False, logging_level=logging.WARNING)
    try:
        cpus, gpus, nodes = _cluster_resources(ray)
        context = ray.get_runtime_context()
        if address or not started_here:
            summary.where = f"Ray cluster at {getattr(context, 'gcs_address', address)} ({cpus:g} CPUs, {gpus:g} GPUs, {nodes} nodes)"
        else:
            summary.where = f"local Ray cluster ({cpus:g} CPUs, {gpus:g} GPUs)"
        n_actors, n_gpus = plan_actors(provider, cpus, gpus, nodes, actors, gpus_per_actor)
        plan = RayPlan(summary.where, n_actors, n_gpus, batch_size, todo, skipped, manifest_path)
        if on_start is not None:
            on_start(plan)
        summary.manifest, summary.skipped = manifest_path, len(skipped)
        book = _Manifest(manifest_path)
        interrupted: BaseException | None = None
        try:
            for job in skipped:
                book.add(input=str(job.source), output=str(job.output), status="skipped", error=None,
                         provider=None, ms=None)  # fmt: skip

            def record(result: FileResult, provider: str | None, backend: str | None, ms: float | None) -> None:
                summary.results.append(result)
                summary.finished_at.append(time.perf_counter())
                book.add(input=str(result.source), output=str(result.output) if result.output is not None else None,
                         status=_status(result), error=result.error, provider=provider,
                         ms=ms)  # fmt: skip
                if on_result is not None:
                    on_result(result)

            for result in pre_failed:
                record(result, None, None, None)
            done: set[str] = set()
            rows = _execute(ray, chunks, model_path, provider, backend_name, precision, masks, boxes, strategy,
                            batch_size, crop_margin, blend, overwrite, n_actors, n_gpus)  # fmt: skip
            try:
                for row in rows if todo else ():
                    if not summary.startup_seconds:
                        summary.startup_seconds = time.perf_counter() - start
                    summary.provider, summary.backend = row["provider"], row["backend"]
                    result = FileResult(Path(row["source"]), output=Path(row["output"]) if row["output"] else None,
                                        error=row["error"] or None, no_hole=bool(row["no_hole"]))  # fmt: skip
                    done.add(row["source"])
                    record(result, row["provider"], row["backend"], float(row["ms"]))
                missing_cause = "not processed: its batch failed in Ray (see the log above)"
            except (KeyboardInterrupt, Exception) as e:
                if isinstance(e, KeyboardInterrupt):
                    interrupted, missing_cause = e, "not processed: interrupted"
                else:  # the Ray job itself failed: every file it did not report is recorded, not lost
                    missing_cause = f"not processed: {first_line(e)}"
                    log.error("Ray job failed: %s", first_line(e))
            finally:
                rows.close()  # stops the Ray Data execution (and its actors) now, not at garbage collection
            for job in todo:
                if str(job.source) not in done:
                    record(FileResult(job.source, error=f"{job.source}: {missing_cause}"), None, None, None)
        finally:
            book.close()
        if interrupted is not None:
            raise interrupted
    finally:
        if started_here:
            ray.shutdown()
    summary.seconds = time.perf_counter() - start
    return summary


def _execute(
    ray: Any,
    chunks: Sequence[Sequence[ImageJob]],
    model_path: Path,
    provider: str,
    backend_name: str,
    precision: str,
    masks: MaskSource,
    boxes: Sequence[tuple[int, int, int, int]],
    strategy: str,
    batch_size: int,
    crop_margin: int | None,
    blend: str,
    overwrite: bool,
    actors: int,
    gpus_per_actor: float,
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
        with _quiet_logger("ray.data"), _quiet_logger("ray.data._internal.progress", _DropProgressBarNotice()):
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


@contextlib.contextmanager
def _quiet_logger(name: str, drop: logging.Filter | None = None) -> Iterator[None]:
    """Ray's INFO chatter (start-up banner, "execution finished") off the CLI's output, while Ray runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    if drop is not None:
        logger.addFilter(drop)
    try:
        yield
    finally:
        logger.setLevel(level)
        if drop is not None:
            logger.removeFilter(drop)

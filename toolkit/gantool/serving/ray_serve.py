"""``gantool serve --ray``: the same FastAPI app on Ray Serve (the ``ray`` extra).

- :class:`GantoolReplica` is the deployment: ``@serve.deployment`` with a late-bound
  ``@serve.ingress``, whose app is :func:`gantool.serving.app.build_app` itself (the same
  routes, page, guard, limits and answers as plain ``gantool serve``). Each replica opens the
  model once, from the model's files carried in its init arguments (:class:`ModelFiles`), so
  no node needs a shared filesystem.
- Requests are batched by Ray Serve's ``@serve.batch`` (``--max-batch``, ``--batch-wait-ms``)
  and each batch runs on the replica's model thread with the same
  :class:`gantool.serving.batcher.ModelRunner` as plain serve (same-size inputs together, one
  by one when a batch fails, requests whose client left skipped): :class:`ServeBatchRunner`.
- :func:`app_builder` is the application builder for Ray's own CLI
  (``serve run gantool.serving.ray_serve:app_builder model=PATH replicas=2``) and for the config
  file :func:`serve_config` writes (``serve deploy``, KubeRay's RayService).

The driver side (starting or joining Ray, deploying, stopping on signals) is
:mod:`gantool.serving.ray_launch`; the answers of Ray's own proxy, :mod:`gantool.serving.ray_proxy`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from ray import serve

from gantool.core.artifacts import export_files, resolve_model
from gantool.core.constants import DEFAULT_BACKEND, DEFAULT_BLEND, DEFAULT_PRECISION, DEFAULT_PROVIDER
from gantool.core.errors import InputError, first_line
from gantool.core.fileio import absolute_path
from gantool.inference.inpainter import Inpainter, ModelFills
from gantool.runtime.threads import set_inference_threads
from gantool.serving.app import build_app
from gantool.serving.batcher import ModelRunner, QueueFullError, _Job
from gantool.serving.settings import ServeSettings

APP_NAME = "gantool"
DEPLOYMENT_NAME = "gantool"
BUILDER_PATH = "gantool.serving.ray_serve:app_builder"
# Test hook (tests/test_serve_ray.py): while the file this names exists, a replica's batches wait
# (at most 60 s), so a test can hold requests inside a replica.
GATE_ENV = "GANTOOL_TEST_SERVE_GATE"


# --------------------------------------------------------------------------- the model's files


@dataclass(frozen=True)
class ModelFiles:
    """The model as bytes, for a replica on any node: the opened file and the rest of its
    export (the folder's table files, which its checks read), and how it was asked for."""

    folder: str  # the folder's name (what /v1/model reports: folder/file)
    files: dict[str, bytes]
    open_file: str | None  # the file the user named, or None: the folder (resolved as the driver did)
    provider: str = DEFAULT_PROVIDER
    backend: str = DEFAULT_BACKEND
    precision: str = DEFAULT_PRECISION

    @property
    def digest(self) -> str:
        sha = hashlib.sha256()
        for name in sorted(self.files):
            sha.update(name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return sha.hexdigest()[:16]

    @property
    def size(self) -> int:
        return sum(len(data) for data in self.files.values())

    def materialise(self, root: Path) -> Path:
        """The files written once under ``root`` (by content, so replicas on a node and their
        restarts share one copy); returns what to open: the folder, or the named file in it."""
        folder = root / self.digest / self.folder
        if not folder.is_dir():
            folder.parent.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=".stage-", dir=folder.parent))
            for name, data in self.files.items():
                (stage / name).write_bytes(data)
            try:
                os.rename(stage, folder)  # atomic: another replica on this node may have won the race
            except OSError:
                for path in stage.iterdir():
                    path.unlink()
                stage.rmdir()
        return folder / self.open_file if self.open_file else folder


def read_model_files(
    model: str | Path | None, provider: str = DEFAULT_PROVIDER, backend: str = DEFAULT_BACKEND,
    precision: str = DEFAULT_PRECISION, opened: Path | None = None,
) -> ModelFiles:  # fmt: skip
    """The files a replica needs to open ``model`` as ``gantool serve`` does here: the model file
    (``opened``, the file the driver's backend opened, else resolved now) and its export's files."""
    path = opened if opened is not None else resolve_model(model, backend)[0]
    path = absolute_path(path)  # links kept: a Hugging Face snapshot's files link to blobs named by hash
    folder = path.parent
    files = {p.name: p for p in export_files(folder).values()}
    files[path.name] = path
    given_file = model is not None and Path(model).expanduser().is_file()
    try:
        data = {name: p.read_bytes() for name, p in sorted(files.items())}
    except OSError as e:
        raise InputError(f"cannot read the model's files in {folder}: {e.strerror or e}") from None
    return ModelFiles(folder.name, data, path.name if given_file else None, provider, backend, precision)


# ------------------------------------------------------------------------------ the replica


class ServeBatchRunner(ModelRunner):
    """The app's model runner inside a replica: :meth:`submit` hands each job to the replica's
    ``@serve.batch`` method, which runs each batch (:meth:`ModelRunner._run`) on the replica's
    one model thread, never on its event loop."""

    def __init__(self, replica: GantoolReplica, inpainter: Inpainter, settings: ServeSettings) -> None:
        super().__init__(
            inpainter.backend,
            settings.max_batch,
            inpainter.crop_margin,
            max_batch_pixels=settings.max_model_pixels,
            release_memory_pixels=settings.release_memory_pixels,
        )
        self.replica = replica
        self.max_queue = settings.max_queue
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="gantool-serve-model")
        self._pending: dict[int, _Job] = {}  # by id(): jobs submitted and not answered
        self._tasks: set[asyncio.Task[Any]] = set()
        self._draining = False

    @property
    def queued(self) -> int:
        return sum(1 for job in list(self._pending.values()) if not job.future.running())

    def start(self) -> None:
        pass  # the replica warmed up in its constructor: Serve routes nothing to it before

    def drain(self) -> None:
        self._draining = True
        for job in list(self._pending.values()):
            self._fail(job)

    def stop(self, timeout: float = 30.0) -> None:
        self.drain()
        self.model_thread.shutdown(wait=False, cancel_futures=True)

    def submit(self, image: Image.Image, mask: np.ndarray, strategy: str, model_pixels: int = 0) -> Future[ModelFills]:
        if self._draining:
            raise QueueFullError("the server is shutting down")
        if len(self._pending) >= self.max_queue:  # a backstop: the guard admits at most max_queue
            raise QueueFullError(f"the server is busy ({len(self._pending)} images queued); retry shortly")
        job = _Job(image, mask, strategy, Future(), model_pixels)
        self._pending[id(job)] = job
        job.future.add_done_callback(lambda _: self._pending.pop(id(job), None))
        # The job goes to the batch even if its client leaves meanwhile: _run skips it, and counts it.
        task = asyncio.ensure_future(self.replica.batched(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job.future

    async def run(self, jobs: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        gate = os.environ.get(GATE_ENV)
        deadline = loop.time() + 60
        while gate and os.path.exists(gate) and loop.time() < deadline:  # a test holds the model
            await asyncio.sleep(0.05)
        for batch in self.split_by_pixels(jobs):
            await loop.run_in_executor(self.model_thread, self._run, batch)


def replica_identity() -> dict[str, Any]:
    """Which replica answered, on which node and process (``/healthz`` under Ray)."""
    import ray

    try:
        replica_id = serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica (tests that build the class by hand)
        replica_id = None
    return {"id": replica_id, "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


@serve.deployment(name=DEPLOYMENT_NAME)
@serve.ingress()
class GantoolReplica:
    """One replica: the model opened once (warm before Serve routes to it), the app of plain serve."""

    def __init__(
        self, model: ModelFiles, settings: ServeSettings, strategy: str, blend: str, threads: int | None
    ) -> None:
        import ray

        set_inference_threads(threads)
        root = Path(ray.get_runtime_context().get_temp_dir()) / "gantool-models"
        self.inpainter = Inpainter(
            model.materialise(root), model.provider, model.backend, precision=model.precision,
            strategy=strategy, batch_size=settings.max_batch, blend=blend,
        )  # fmt: skip
        self.settings = settings
        self.runner = ServeBatchRunner(self, self.inpainter, settings)
        self.runner._warm_up()
        self.identity = replica_identity()
        batched: Any = type(self).batched  # @serve.batch's setters (one queue per replica process)
        batched.set_max_batch_size(settings.max_batch)
        batched.set_batch_wait_timeout_s(settings.batch_wait_ms / 1000.0)

    def __serve_build_asgi_app__(self) -> Any:
        return build_app(self.inpainter, self.settings, self.runner, lambda: {"replica": self.identity})

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)  # set from the settings in __init__
    async def batched(self, jobs: list[_Job]) -> list[None]:
        await self.runner.run(jobs)
        return [None] * len(jobs)


# ------------------------------------------------------------------------ replicas and options


@dataclass(frozen=True)
class ReplicaPlan:
    """How many replicas, what each reserves, and the model threads each runs."""

    replicas: int | None  # fixed; None with autoscaling
    min_replicas: int | None = None
    max_replicas: int | None = None
    cpus: float = 1.0
    gpus: float = 0.0
    threads: int = 1

    @property
    def most(self) -> int:
        return self.max_replicas if self.replicas is None else self.replicas  # type: ignore[return-value]

    def line(self) -> str:
        count = (
            f"{self.replicas}"
            if self.replicas is not None
            else f"{self.min_replicas}-{self.max_replicas} (autoscaling)"
        )
        gpus = f", {self.gpus:g} GPU" if self.gpus else ""
        return (
            f"replicas: {count} x {self.cpus:g} CPU{gpus}, {self.threads} inference thread(s) each "
            f"(at most {self.most} x {self.threads} = {self.most * self.threads} threads)"
        )


def plan_replicas(
    cluster_cpus: float,
    cluster_gpus: float,
    replicas: int | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    replica_cpus: float | None = None,
    replica_gpus: float = 0.0,
) -> ReplicaPlan:
    """The replicas asked for, checked against the cluster; threads per replica = the CPUs Ray
    gives it (at least 1), so that replicas x threads stays within the cores (``--replica-cpus``
    defaults to the cluster's CPUs shared by the most replicas there can be)."""
    autoscaling = min_replicas is not None or max_replicas is not None
    if autoscaling and replicas is not None:
        raise InputError("give --replicas, or --min-replicas and --max-replicas (autoscaling), not both")
    if autoscaling:
        if min_replicas is None or max_replicas is None:
            raise InputError("autoscaling needs both --min-replicas and --max-replicas")
        if min_replicas < 0 or max_replicas < 1 or min_replicas > max_replicas:
            raise InputError(
                f"--min-replicas {min_replicas} and --max-replicas {max_replicas}: need 0 <= min <= max and max >= 1"
            )
    elif replicas is None:
        replicas = 1
    elif replicas < 1:
        raise InputError(f"--replicas must be at least 1, got {replicas}")
    most = max_replicas if autoscaling else replicas
    assert most is not None
    if replica_gpus < 0:
        raise InputError(f"--replica-gpus must be >= 0, got {replica_gpus:g}")
    if replica_cpus is None:
        replica_cpus = max(1.0, float(int(cluster_cpus // most))) if cluster_cpus >= most else 1.0
    elif replica_cpus <= 0:
        raise InputError(f"--replica-cpus must be positive, got {replica_cpus:g}")
    least = min_replicas if autoscaling else replicas
    assert least is not None
    if least * replica_cpus > cluster_cpus + 1e-9:
        raise InputError(
            f"{least} replica(s) x {replica_cpus:g} CPU need more than the Ray cluster's {cluster_cpus:g} CPUs "
            "(lower --replicas or --replica-cpus)"
        )
    if replica_gpus and least * replica_gpus > cluster_gpus + 1e-9:
        raise InputError(
            f"{least} replica(s) x {replica_gpus:g} GPU need more than the Ray cluster's {cluster_gpus:g} GPUs"
        )
    threads = max(1, int(replica_cpus))
    return ReplicaPlan(
        replicas if not autoscaling else None, min_replicas, max_replicas, replica_cpus, replica_gpus, threads
    )


def deployment_options(settings: ServeSettings, plan: ReplicaPlan) -> dict[str, Any]:
    """Ray Serve's options for the deployment.

    gantool's own admission (``--max-queue`` requests inside a replica, then 503 JSON with
    ``Retry-After``) answers first: Ray lets twice as many requests into a replica
    (``max_ongoing_requests``: the rest are bodies still arriving, or the page and health
    checks), and queues at most four times ``--max-queue`` more in each proxy
    (``max_queued_requests``: Ray counts a request there until a replica is chosen for it, so
    a burst passes through it), over which Ray's proxy answers 503 itself."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": plan.cpus, "num_gpus": plan.gpus},
        "max_ongoing_requests": max(2 * settings.max_queue, settings.max_batch),
        "max_queued_requests": 4 * settings.max_queue,
        "graceful_shutdown_timeout_s": settings.shutdown_timeout,
        "graceful_shutdown_wait_loop_s": 0.2,
    }
    if plan.replicas is None:
        options["autoscaling_config"] = {
            "min_replicas": plan.min_replicas,
            "max_replicas": plan.max_replicas,
            "target_ongoing_requests": settings.max_batch,  # a replica is busiest with one full batch
        }
    else:
        options["num_replicas"] = plan.replicas
    return options


def bind_app(model: ModelFiles, settings: ServeSettings, plan: ReplicaPlan, strategy: str, blend: str) -> Any:
    """The Serve application (what ``serve.run`` deploys)."""
    options = deployment_options(settings, plan)
    deployment: Any = GantoolReplica  # a serve.Deployment (the decorator's type is lost to mypy)
    return deployment.options(**options).bind(model, settings, strategy, blend, plan.threads)


# ----------------------------------------------------------------- Ray's CLI and config files

PLAN_KEYS = ("replicas", "min_replicas", "max_replicas", "replica_cpus", "replica_gpus")
MODEL_KEYS = ("model", "provider", "backend", "precision", "blend")
SETTINGS_FIELDS = {f.name: f for f in dataclasses.fields(ServeSettings)}


def _parse(key: str, value: Any, kind: Any) -> Any:
    """A builder argument (a string from ``serve run key=value``, or YAML's own type) as ``kind``."""
    if value is None:
        return None
    try:
        if kind in (int, "int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if kind in (float, "float"):
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{key}={value!r}: expected a {getattr(kind, '__name__', kind)}") from None
    return value


def _tuple(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v for v in value.split(",") if v)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise InputError(f"{key}={value!r}: expected names separated by commas, or a list")


def settings_from_args(args: Mapping[str, Any]) -> ServeSettings:
    """The :class:`ServeSettings` named in builder arguments (unknown keys are refused by the caller)."""
    values: dict[str, Any] = {}
    for key, value in args.items():
        if key not in SETTINGS_FIELDS:
            continue
        kind = SETTINGS_FIELDS[key].type
        if "tuple" in str(kind):
            values[key] = _tuple(key, value)
        elif "int" in str(kind) and "None" not in str(kind):
            values[key] = _parse(key, value, int)
        elif "float" in str(kind):
            values[key] = _parse(key, value, float)
        else:
            values[key] = None if value in (None, "") else str(value)
    return ServeSettings(**values)


def app_builder(args: Mapping[str, Any]) -> Any:
    """The application for Ray's CLI and config files:
    ``serve run gantool.serving.ray_serve:app_builder model=PATH replicas=2``.

    Keys: ``model`` (a path on the node that builds the app; default: the shipped model),
    ``provider``, ``backend``, ``precision``, ``blend``, ``replicas`` (or ``min_replicas`` and
    ``max_replicas``), ``replica_cpus``, ``replica_gpus``, and every :class:`ServeSettings`
    field under its own name (``max_batch``, ``max_queue``, ``api_key``, ``allowed_hosts``
    as names separated by commas, ...). An unknown key is refused, naming it."""
    import ray

    args = dict(args)
    known = set(PLAN_KEYS) | set(MODEL_KEYS) | set(SETTINGS_FIELDS)
    unknown = sorted(set(args) - known)
    if unknown:
        raise InputError(f"unknown gantool serve argument(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if not args.get("api_key") and os.environ.get("GANTOOL_API_KEY"):  # never written into config files
        args["api_key"] = os.environ["GANTOOL_API_KEY"]
    settings = settings_from_args(args)
    model = read_model_files(
        args.get("model") or None,
        str(args.get("provider") or DEFAULT_PROVIDER),
        str(args.get("backend") or DEFAULT_BACKEND),
        str(args.get("precision") or DEFAULT_PRECISION),
    )
    resources = ray.cluster_resources() if ray.is_initialized() else {}
    plan = plan_replicas(
        float(resources.get("CPU", os.cpu_count() or 1)),
        float(resources.get("GPU", 0)),
        replicas=_parse("replicas", args.get("replicas"), int),
        min_replicas=_parse("min_replicas", args.get("min_replicas"), int),
        max_replicas=_parse("max_replicas", args.get("max_replicas"), int),
        replica_cpus=_parse("replica_cpus", args.get("replica_cpus"), float),
        replica_gpus=_parse("replica_gpus", args.get("replica_gpus"), float) or 0.0,
    )
    return bind_app(model, settings, plan, settings.strategy, str(args.get("blend") or DEFAULT_BLEND))


@dataclass(frozen=True)
class ConfigRequest:
    """What ``gantool serve --ray --write-config`` writes: the builder's arguments and Serve's HTTP options."""

    args: dict[str, Any]
    host: str
    port: int
    extra: dict[str, Any] = field(default_factory=dict)


def serve_config(request: ConfigRequest) -> dict[str, Any]:
    """A Serve config (``serve run FILE``, ``serve deploy FILE``, a RayService's ``serveConfigV2``)."""
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": request.host, "port": request.port},
        "applications": [
            {"name": APP_NAME, "route_prefix": "/", "import_path": BUILDER_PATH, "args": dict(request.args)}
        ],
    }


def write_serve_config(path: str | Path, request: ConfigRequest) -> Path:
    """The config as YAML at ``path``, written atomically; an existing file is refused (never replaced)."""
    import yaml  # comes with Ray

    from gantool.core.fileio import atomic_write_text

    target = Path(path).expanduser()
    if target.exists():
        raise InputError(f"--write-config {target} exists: give a new file name (it is never replaced)")
    header = (
        "# Ray Serve config written by `gantool serve --ray --write-config`: run it with `serve run FILE`\n"
        "# or `serve deploy FILE` (a KubeRay RayService takes `applications` as its serveConfigV2).\n"
    )
    try:
        atomic_write_text(target, header + yaml.safe_dump(serve_config(request), sort_keys=False), overwrite=False)
    except OSError as e:
        raise InputError(f"cannot write --write-config {target}: {e.strerror or first_line(e)}") from None
    return target.resolve()

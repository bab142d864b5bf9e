"""``gantool serve --ray`` from the driver's side: Ray up (a local instance, or a cluster
joined within ``--ray-timeout``), the application deployed (:mod:`gantool.serving.ray_serve`),
then serving until SIGINT or SIGTERM, and a bounded stop.

- Without ``--ray-address`` a local Ray instance is started (``address="local"``: never a
  cluster another program started on this machine) with Ray's proxy hook set
  (:mod:`gantool.serving.ray_proxy`), and it is stopped on exit; with one, the address is
  probed first (:func:`gantool.inference.ray_connect.check_reachable`: the one-line, bounded
  errors of ``gantool inpaint --ray``), and only gantool's application is deleted on exit.
- The first signal: running requests get ``--shutdown-timeout`` (Serve's graceful shutdown of
  the replicas), then the Ray instance started here is stopped, all within that time plus
  Ray's own stop; a second signal stops the local Ray processes at once and exits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gantool.core.constants import DEFAULT_RAY_TIMEOUT_S
from gantool.core.errors import InputError, first_line
from gantool.core.fileio import absolute_path
from gantool.core.signals import STOP_SIGNALS, handlers_installed
from gantool.serving.settings import ServeSettings

RAY_SERVE_MISSING = 'gantool serve --ray needs Ray Serve: pip install "gantool[ray]"'
# Ray's proxy calls this at start (an environment variable of Ray's): gantool's protocol and answers there.
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "gantool.serving.ray_proxy:proxy_middlewares"


def import_ray_serve() -> Any:
    """The ``ray`` module with Ray Serve importable, or one line naming the extra."""
    try:
        import ray
        import ray.serve
        import yaml  # noqa: F401 (comes with Ray Serve)
    except ImportError:
        raise InputError(RAY_SERVE_MISSING) from None
    return ray


@dataclass(frozen=True)
class RayServeRequest:
    """``gantool serve --ray``'s options beyond the app's settings."""

    model: str | None
    provider: str
    backend: str
    precision: str
    blend: str
    settings: ServeSettings
    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    timeout: float = DEFAULT_RAY_TIMEOUT_S
    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    replica_cpus: float | None = None
    replica_gpus: float = 0.0

    def builder_args(self) -> dict[str, Any]:
        """The same service as arguments of :func:`gantool.serving.ray_serve.app_builder`."""
        from gantool.serving.ray_serve import SETTINGS_FIELDS

        args: dict[str, Any] = {"model": str(absolute_path(self.model)) if self.model else None}
        args |= {"provider": self.provider, "backend": self.backend, "precision": self.precision, "blend": self.blend}
        for key in ("replicas", "min_replicas", "max_replicas", "replica_cpus", "replica_gpus"):
            args[key] = getattr(self, key)
        for key in SETTINGS_FIELDS:
            value = getattr(self.settings, key)
            args[key] = list(value) if isinstance(value, tuple) else value
        return {k: v for k, v in args.items() if v is not None}


def free_port(host: str) -> int:
    """A port free on ``host`` now (Ray's proxy binds it itself, a moment later)."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Stop:
    """The signal handlers while Ray runs: the first signal is recorded (the driver then stops
    in order); a second one ends the local Ray processes at once and exits with one line."""

    def __init__(self, kill_local: Callable[[], None]) -> None:
        self.signal: int | None = None
        self.event = threading.Event()
        self.kill_local = kill_local

    def __call__(self, sig: int, frame: Any) -> None:
        if self.signal is not None:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"gantool serve: {signal.Signals(sig).name} again, exiting now\n")
                sys.stderr.flush()
            with contextlib.suppress(Exception):
                self.kill_local()
            os._exit(128 + sig)
        self.signal = sig
        self.event.set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        with handlers_installed(dict.fromkeys(STOP_SIGNALS, self), restore=lambda: self.signal is None):
            yield


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux /proc; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_local_ray() -> None:
    """The Ray processes this driver started, killed now (the second signal): Ray's own kill of
    its node's processes, then SIGKILL for any below this process still there (their workers)."""
    from ray._private import worker  # Ray has no public call for it; ray.shutdown() waits

    below = _descendants(os.getpid())
    node = getattr(worker, "_global_node", None)
    if node is None:
        return  # joined a cluster: its processes are not ours
    with contextlib.suppress(Exception):
        node.kill_all_processes(check_alive=False, allow_graceful=False)
    for pid in below + _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Token authentication is enabled" not in record.getMessage()  # a local instance of our own


def start_ray(ray: Any, request: RayServeRequest) -> tuple[bool, str]:
    """Ray up: (started here, a line saying where). A local instance gets gantool's proxy hook."""
    from gantool.inference.ray_connect import check_reachable, connect, quiet_logger

    if request.address:  # also when this process's Ray is up (as inpaint --ray): a wrong address is one line
        timeout = check_reachable(request.address, request.timeout)
    if ray.is_initialized():  # a Python program that called ray.init itself: its cluster, left up
        return False, "Ray cluster of this process"
    if request.address:
        connect(ray, request.address, timeout)
        resources = ray.cluster_resources()
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        return False, (
            f"ray: Ray cluster at {request.address} ({resources.get('CPU', 0):g} CPUs, "
            f"{resources.get('GPU', 0):g} GPUs, {nodes} node(s)); gantool's application is deleted on exit"
        )
    os.environ[PROXY_CALLBACK_ENV] = PROXY_CALLBACK  # inherited by the instance's processes: its proxies
    from gantool.serving.ray_proxy import PROXY_SETTINGS_ENV, proxy_settings

    os.environ[PROXY_SETTINGS_ENV] = json.dumps(proxy_settings(request.settings))
    with quiet_logger("ray", _DropTokenNotice()):
        context = ray.init(
            address="local",
            include_dashboard=None,  # when Ray's dashboard packages are there (ray[serve] has them)
            dashboard_host="127.0.0.1",
            logging_level=logging.ERROR,
            log_to_driver=False,  # the replicas' and proxies' logs stay in Ray's log folder
        )
    resources = ray.cluster_resources()
    dashboard = getattr(context, "dashboard_url", None)
    where = f"dashboard http://{dashboard}" if dashboard else 'no dashboard (pip install "ray[default]")'
    address = (getattr(context, "address_info", None) or {}).get("gcs_address", "?")
    return True, (
        f"ray: started a local Ray instance at {address} ({resources.get('CPU', 0):g} CPUs, "
        f"{resources.get('GPU', 0):g} GPUs; {where}); it stops when gantool serve does"
    )


def deploy(ray: Any, request: RayServeRequest, model_files: Any, notify: Callable[[str], None]) -> str:
    """The application deployed and running on Ray Serve; returns its URL."""
    from ray import serve

    from gantool.inference.ray_connect import quiet_logger
    from gantool.serving.ray_serve import APP_NAME, bind_app, plan_replicas

    resources = ray.cluster_resources()
    plan = plan_replicas(
        float(resources.get("CPU", 0)), float(resources.get("GPU", 0)), request.replicas, request.min_replicas,
        request.max_replicas, request.replica_cpus, request.replica_gpus,
    )  # fmt: skip
    notify(plan.line())
    port = request.port or free_port(request.host)
    logging_config = {"log_level": "WARNING", "enable_access_log": False}  # the replicas' and proxies' logs
    with quiet_logger("ray.serve"):  # Serve's INFO lines in this process ("Started Serve", ...)
        serve.start(
            http_options={"host": request.host, "port": port, "keep_alive_timeout_s": request.settings.read_timeout},
            proxy_location="EveryNode",
            logging_config=logging_config,
        )
        application = bind_app(model_files, request.settings, plan, request.settings.strategy, request.blend)
        try:
            serve.run(application, name=APP_NAME, route_prefix="/", logging_config=logging_config)
        except Exception as e:  # a replica that cannot open the model: Serve gives up after its retries
            raise InputError(f"the gantool application did not start on Ray Serve: {first_line(e)}") from None
    return _url(request.host, port)


def stop_serving(ray: Any, started_here: bool, deployed: bool, budget_s: float) -> None:
    """The application, if its deployment began, stopped (running requests get Serve's graceful
    shutdown) within ``budget_s``; then the local Ray instance, if it was started here (its
    processes end with it)."""
    # Not deployed (a wrong address, say): nothing of ours to delete, and serve.delete would start Ray.
    if deployed and ray.is_initialized():
        from ray import serve

        from gantool.inference.ray_connect import quiet_logger
        from gantool.serving.ray_serve import APP_NAME

        def teardown() -> None:
            with contextlib.suppress(Exception), quiet_logger("ray.serve"):
                serve.delete(APP_NAME)  # the replicas drain; a local instance's Serve then ends with Ray

        worker = threading.Thread(target=teardown, name="gantool-serve-stop", daemon=True)
        worker.start()
        worker.join(max(budget_s, 0.5))
    if started_here:
        with contextlib.suppress(Exception):
            ray.shutdown()


def serve_on_ray(
    request: RayServeRequest,
    model_files: Any,
    notify: Callable[[str], None],
    on_serving: Callable[[str], None],
    on_stopping: Callable[[str], None] | None = None,
) -> int | None:
    """Deploy ``model_files`` (:func:`gantool.serving.ray_serve.read_model_files`) as ``request``
    says and serve until SIGINT or SIGTERM; returns that signal (None if it ended otherwise).
    ``notify`` gets the lines said on the way, ``on_serving`` the URL once it answers, and
    ``on_stopping`` the line said at the first signal (default: ``notify``)."""
    ray = import_ray_serve()
    stop = _Stop(_kill_local_ray)
    started_here = deployed = False
    with stop.installed():
        try:
            started_here, where = start_ray(ray, request)
            notify(where)
            with stop.installed():  # again: ray.init put its own SIGTERM handler in
                if stop.signal is None:
                    started, deployed = time.perf_counter(), True
                    url = deploy(ray, request, model_files, notify)
                    if stop.signal is None:
                        on_serving(url)
                        notify(f"ready: {time.perf_counter() - started:.1f} s to deploy")
                    stop.event.wait()
                if stop.signal is not None:
                    (on_stopping or notify)(
                        f"{signal.Signals(stop.signal).name}: stopping; running requests get up to "
                        f"{request.settings.shutdown_timeout:g} s (press Ctrl-C again to exit now)"
                    )
        finally:
            stop_serving(ray, started_here, deployed, request.settings.shutdown_timeout)
    return stop.signal

"""``gantool serve --ray``: its options and the thin step from the command to the library
(:mod:`gantool.serving.ray_launch`, :mod:`gantool.serving.ray_serve`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gantool.cli.options import ray_address_option, ray_timeout_option

RAY_OPTIONS = ("ray_address", "ray_timeout", "replicas", "min_replicas", "max_replicas", "replica_cpus",
               "replica_gpus", "write_config")  # fmt: skip


def ray_serve_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of ``serve --ray`` (each needs --ray)."""
    for decorate in reversed(
        [
            click.option(
                "--ray",
                "use_ray",
                is_flag=True,
                help='Serve on Ray Serve (replicas, autoscaling); needs pip install "gantool[ray]".',
            ),
            ray_address_option,
            ray_timeout_option,
            click.option(
                "--replicas",
                type=click.IntRange(min=1),
                default=None,
                help="With --ray: model replicas. Default: 1 (or --min-replicas/--max-replicas).",
            ),
            click.option(
                "--min-replicas",
                type=click.IntRange(min=0),
                default=None,
                help="With --ray and --max-replicas: autoscale between these (Ray Serve's autoscaling_config).",
            ),
            click.option(
                "--max-replicas", type=click.IntRange(min=1), default=None, help="With --ray: see --min-replicas."
            ),
            click.option(
                "--replica-cpus",
                type=click.FloatRange(min=0, min_open=True),
                default=None,
                help="With --ray: CPUs each replica reserves; its inference threads are this many (at least 1). "
                "Default: the cluster's CPUs shared by the replicas.",
            ),
            click.option(
                "--replica-gpus",
                type=click.FloatRange(min=0),
                default=None,
                help="With --ray: GPUs each replica reserves (0.5 = two per GPU). Default: 0.",
            ),
            click.option(
                "--write-config",
                metavar="FILE",
                help="With --ray: write a Ray Serve config for this service (serve run FILE, serve deploy FILE, "
                "KubeRay) and exit.",
            ),
        ]
    ):
        command = decorate(command)
    return command


def check_ray_options(use_ray: bool, options: dict[str, Any]) -> None:
    if not use_ray:
        given = [f"--{name.replace('_', '-')}" for name in RAY_OPTIONS if options.get(name) is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} needs --ray")


def serve_on_ray(model: str | None, provider: str, backend: str, precision: str, blend: str, settings: Any,
                 host: str, port: int, options: dict[str, Any]) -> None:  # fmt: skip
    """Deploy on Ray Serve and serve until a signal (or only write the config file)."""
    from gantool.cli import exit_stopped
    from gantool.core.constants import DEFAULT_RAY_TIMEOUT_S
    from gantool.serving.ray_launch import RayServeRequest, import_ray_serve, serve_on_ray

    import_ray_serve()  # one line without the extra, before the model opens
    request = RayServeRequest(
        model, provider, backend, precision, blend, settings, host, port,
        address=options.get("ray_address"), timeout=options.get("ray_timeout") or DEFAULT_RAY_TIMEOUT_S,
        replicas=options.get("replicas"), min_replicas=options.get("min_replicas"),
        max_replicas=options.get("max_replicas"), replica_cpus=options.get("replica_cpus"),
        replica_gpus=options.get("replica_gpus") or 0.0,
    )  # fmt: skip
    if options.get("write_config"):
        _write_config(request, options["write_config"])
        return
    from gantool import Inpainter
    from gantool.serving.ray_serve import read_model_files

    inpainter = Inpainter(model, provider, backend, precision=precision, strategy=settings.strategy,
                          batch_size=settings.max_batch, blend=blend)  # fmt: skip
    runner = inpainter.backend
    click.echo(f"model: {runner.path}")
    click.echo(
        f"backend: {runner.name}; precision: {runner.precision} ({runner.precision_note}); "
        f"provider: {runner.provider} ({runner.provider_note})"
    )
    files = read_model_files(model, provider, backend, precision, opened=runner.path)
    click.echo(
        f"model files: {len(files.files)} ({files.size / 2**20:.1f} MB), sent to the replicas through Ray's object store"
    )
    del inpainter, runner  # the replicas run the model; the driver keeps none of it

    def serving(url: str) -> None:
        click.echo(f"serving on {url}/ (API {url}/v1/inpaint, docs {url}/docs); Ctrl-C stops")

    stopped_by = serve_on_ray(request, files, click.echo, serving, lambda line: click.echo(line, err=True))
    if stopped_by is not None:
        click.echo("stopped", err=True)
        exit_stopped(128 + stopped_by)


def _write_config(request: Any, path: str) -> None:
    from gantool.core.artifacts import resolve_model
    from gantool.core.fileio import absolute_path
    from gantool.serving.ray_serve import ConfigRequest, write_serve_config

    opened, _ = resolve_model(request.model, request.backend)  # a typo fails here, not on the cluster
    args = request.builder_args()
    # The folder (or file) by its absolute path: the node that builds the app reads it there.
    args["model"] = str(absolute_path(request.model or opened.parent))
    key = args.pop("api_key", None)
    written = write_serve_config(path, ConfigRequest(args, request.host, request.port or 8000))
    click.echo(f"wrote {written}: run it with `serve run {written}` (or `serve deploy` on a running cluster)")
    if key:
        click.echo("the API key is not written into the file: give the application GANTOOL_API_KEY "
                   "(runtime_env: env_vars) where it runs", err=True)  # fmt: skip

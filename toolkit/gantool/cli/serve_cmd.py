"""``gantool serve``: open the model once, then serve the API and the page (gantool.serving)."""

from __future__ import annotations

import importlib.util
from typing import Any

import click

from gantool.cli import exit_stopped
from gantool.cli.options import (
    backend_option,
    batch_wait_option,
    blend_option,
    max_batch_option,
    precision_option,
    provider_option,
    strategy_option,
)
from gantool.cli.serve_ray import check_ray_options, ray_serve_options, serve_on_ray
from gantool.core.constants import (
    DEFAULT_MAX_BLEND_PIXELS,
    DEFAULT_SERVE_HOST,
    DEFAULT_SERVE_MAX_HEADER_KB,
    DEFAULT_SERVE_MAX_HOLES,
    DEFAULT_SERVE_MAX_MODEL_PIXELS,
    DEFAULT_SERVE_MAX_PIXELS,
    DEFAULT_SERVE_MAX_QUEUE,
    DEFAULT_SERVE_MAX_UPLOAD_MB,
    DEFAULT_SERVE_MIN_UPLOAD_RATE_KB,
    DEFAULT_SERVE_PORT,
    DEFAULT_SERVE_READ_TIMEOUT,
    DEFAULT_SERVE_RELEASE_MEMORY_PIXELS,
    DEFAULT_SERVE_SHUTDOWN_TIMEOUT,
)

# Modules of the serve extra; any one name of a tuple will do (python-multipart
# is imported as python_multipart, older releases as multipart).
SERVE_MODULES: tuple[tuple[str, ...], ...] = (("fastapi",), ("uvicorn",), ("python_multipart", "multipart"))
INSTALL_HINT = 'gantool serve needs FastAPI, uvicorn and python-multipart: pip install "gantool[serve]"'


def missing_serve_packages() -> list[str]:
    """The serve extra's modules that cannot be imported."""
    return [names[0] for names in SERVE_MODULES if all(importlib.util.find_spec(n) is None for n in names)]


# long: its parameters are the server's flags, one line each; the work is in gantool.serving (--ray: cli/serve_ray.py)
@click.command("serve")
@click.option(
    "--model",
    metavar="PATH",
    help="Export folder or model file, or an MLflow URI (models:/NAME/VERSION, models:/NAME@ALIAS, "
    "runs:/RUN_ID/PATH). Default: the model in models/.",
)
@click.option(
    "--host",
    default=DEFAULT_SERVE_HOST,
    show_default=True,
    help="Address to listen on; anything but loopback without --api-key gets a warning.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_SERVE_PORT,
    show_default=True,
    help="0 picks a free port (printed).",
)
@provider_option
@backend_option
@precision_option
@strategy_option
@blend_option
@max_batch_option
@batch_wait_option
@click.option(
    "--max-queue",
    type=click.IntRange(min=1),
    default=DEFAULT_SERVE_MAX_QUEUE,
    show_default=True,
    help="Inpaint requests inside the server at once; more are answered 503 with Retry-After.",
)
@click.option(
    "--max-upload-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_SERVE_MAX_UPLOAD_MB,
    show_default=True,
    help="Largest request body (413 while it streams in).",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(min=1),
    default=DEFAULT_SERVE_MAX_PIXELS,
    show_default=True,
    help="Largest image or mask, checked from its header before decoding (413).",
)
@click.option(
    "--max-model-pixels",
    type=click.IntRange(min=1),
    default=DEFAULT_SERVE_MAX_MODEL_PIXELS,
    show_default=True,
    help="Pixels one request may run through the model (all its windows), checked before it runs (413).",
)
@click.option(
    "--max-holes",
    type=click.IntRange(min=1),
    default=DEFAULT_SERVE_MAX_HOLES,
    show_default=True,
    help="Separate holes one request may have, checked before the model runs (413).",
)
@click.option(
    "--max-blend-pixels",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_BLEND_PIXELS,
    show_default=True,
    help="Pixels the Poisson blend of one request may solve over (each hole's box plus a margin), "
    "checked before the model runs (413).",
)
@click.option(
    "--release-memory-pixels",
    type=click.IntRange(min=0),
    default=DEFAULT_SERVE_RELEASE_MEMORY_PIXELS,
    show_default=True,
    help="After a request or model run of at least this many pixels, give its memory back to the system "
    "(ONNX Runtime's CPU arena, the C heap); 0: never.",
)
@click.option(
    "--read-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_SERVE_READ_TIMEOUT,
    show_default=True,
    help="Seconds for a request's headers, and for its body plus 1 s per --min-upload-rate-kb (408).",
)
@click.option(
    "--min-upload-rate-kb",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_SERVE_MIN_UPLOAD_RATE_KB,
    show_default=True,
    help="Slowest upload kept past --read-timeout, in KB/s.",
)
@click.option(
    "--max-header-kb",
    type=click.IntRange(min=1),
    default=DEFAULT_SERVE_MAX_HEADER_KB,
    show_default=True,
    help="Largest request line and headers (431).",
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_SERVE_SHUTDOWN_TIMEOUT,
    show_default=True,
    help="Seconds running requests get after the first Ctrl-C or SIGTERM; a second one exits at once.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Host header names answered (repeatable; * any). Default: on loopback, the address and localhost.",
)
@click.option(
    "--api-key",
    envvar="GANTOOL_API_KEY",
    metavar="KEY",
    help="Require Authorization: Bearer KEY or X-API-Key: KEY on /v1/ (also GANTOOL_API_KEY).",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Allow browser pages from ORIGIN to call the API (repeatable). Default: CORS off.",
)
@click.option(
    "--access-log",
    type=click.Choice(["off", "text", "json"]),
    default="off",
    show_default=True,
    help="One line per request on stderr (request ID, status, bytes in and out, holes, ms); json: JSON lines.",
)
@ray_serve_options
def serve(
    model: str | None,
    host: str,
    port: int,
    provider: str,
    backend: str,
    precision: str,
    strategy: str,
    blend: str,
    max_batch: int,
    batch_wait_ms: float,
    max_queue: int,
    max_upload_mb: float,
    max_pixels: int,
    max_model_pixels: int,
    max_holes: int,
    max_blend_pixels: int,
    release_memory_pixels: int,
    read_timeout: float,
    min_upload_rate_kb: float,
    max_header_kb: int,
    shutdown_timeout: float,
    allowed_hosts: tuple[str, ...],
    api_key: str | None,
    cors_origins: tuple[str, ...],
    access_log: str,
    use_ray: bool,
    **ray_options: Any,
) -> None:
    """Serve inpainting over HTTP: the API at /v1/inpaint and a page at /.

    \b
    The model loads once; requests that arrive together run as one batch.
    API docs: /docs. Health: /healthz, /readyz.
    With --ray the same service runs on Ray Serve: replicas, autoscaling, several nodes.
    """
    check_ray_options(use_ray, ray_options)
    if missing_serve_packages():
        raise click.ClickException(INSTALL_HINT)
    # Imported here: the serve extra (FastAPI) and the model runtimes are heavy.
    from gantool import Inpainter
    from gantool.serving.app import build_app
    from gantool.serving.server import bind_socket, run_server, url_of
    from gantool.serving.settings import ServeSettings, check_api_key, default_allowed_hosts, is_loopback

    check_api_key(api_key, _api_key_source())
    settings = ServeSettings(
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        max_queue=max_queue,
        max_upload_mb=max_upload_mb,
        max_pixels=max_pixels,
        api_key=api_key or None,
        cors_origins=cors_origins,
        strategy=strategy,
        read_timeout=read_timeout,
        min_upload_rate_kb=min_upload_rate_kb,
        max_header_kb=max_header_kb,
        shutdown_timeout=shutdown_timeout,
        max_model_pixels=max_model_pixels,
        max_holes=max_holes,
        max_blend_pixels=max_blend_pixels,
        release_memory_pixels=release_memory_pixels,
        allowed_hosts=allowed_hosts or default_allowed_hosts(host),
        access_log=access_log,
    )
    if use_ray:
        serve_on_ray(model, provider, backend, precision, blend, settings, host, port, ray_options)
        return
    inpainter = Inpainter(
        model, provider, backend, precision=precision, strategy=strategy, batch_size=max_batch, blend=blend
    )
    runner = inpainter.backend
    sock = bind_socket(host, port)
    click.echo(f"model: {runner.path}")
    click.echo(
        f"backend: {runner.name}; precision: {runner.precision} ({runner.precision_note}); "
        f"provider: {runner.provider} ({runner.provider_note})"
    )
    if not is_loopback(host) and settings.api_key is None:
        click.echo(
            f"warning: listening on {host} without an API key: anyone who can reach this port can use "
            "the model (set --api-key or GANTOOL_API_KEY)",
            err=True,
        )
    click.echo(
        f"serving on {url_of(sock)}/ (API {url_of(sock)}/v1/inpaint, docs {url_of(sock)}/docs); Ctrl-C stops",
        nl=True,
    )
    stopped_by = run_server(build_app(inpainter, settings), sock, settings, lambda line: click.echo(line, err=True))
    if stopped_by is not None:
        click.echo("stopped", err=True)
        exit_stopped(128 + stopped_by)  # 130 for SIGINT, 143 for SIGTERM, as a shell reports


def _api_key_source() -> str:
    """How the key was given, for its messages: the option, or the environment variable."""
    source = click.get_current_context().get_parameter_source("api_key")
    return "GANTOOL_API_KEY" if source == click.core.ParameterSource.ENVIRONMENT else "--api-key"

"""``gantool serve``: open the model once, then serve the API and the page (gantool.serving.app)."""

from __future__ import annotations

import importlib.util

import click

from gantool.cli.options import (
    backend_option,
    batch_wait_option,
    blend_option,
    max_batch_option,
    precision_option,
    provider_option,
    strategy_option,
)
from gantool.core.constants import (
    DEFAULT_SERVE_HOST,
    DEFAULT_SERVE_MAX_PIXELS,
    DEFAULT_SERVE_MAX_QUEUE,
    DEFAULT_SERVE_MAX_UPLOAD_MB,
    DEFAULT_SERVE_PORT,
)

# Modules of the serve extra; any one name of a tuple will do (python-multipart
# is imported as python_multipart, older releases as multipart).
SERVE_MODULES: tuple[tuple[str, ...], ...] = (("fastapi",), ("uvicorn",), ("python_multipart", "multipart"))
INSTALL_HINT = 'gantool serve needs FastAPI, uvicorn and python-multipart: pip install "gantool[serve]"'


def missing_serve_packages() -> list[str]:
    """The serve extra's modules that cannot be imported."""
    return [names[0] for names in SERVE_MODULES if all(importlib.util.find_spec(n) is None for n in names)]


@click.command("serve")
@click.option(
    "--model",
    metavar="PATH",
    help="Export folder or model file. Default: the model in models/.",
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
    api_key: str | None,
    cors_origins: tuple[str, ...],
) -> None:
    """Serve inpainting over HTTP: the API at /v1/inpaint and a page at /.

    \b
    The model loads once; requests that arrive together run as one batch.
    API docs: /docs. Health: /healthz, /readyz.
    """
    if missing_serve_packages():
        raise click.ClickException(INSTALL_HINT)
    # Imported here: the serve extra (FastAPI) and the model runtimes are heavy.
    from gantool import Inpainter
    from gantool.serving.app import (
        ServeSettings,
        bind_socket,
        build_app,
        is_loopback,
        run_server,
        url_of,
    )

    settings = ServeSettings(
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        max_queue=max_queue,
        max_upload_mb=max_upload_mb,
        max_pixels=max_pixels,
        api_key=api_key or None,
        cors_origins=cors_origins,
        strategy=strategy,
    )
    inpainter = Inpainter(
        model,
        provider,
        backend,
        precision=precision,
        strategy=strategy,
        batch_size=max_batch,
        blend=blend,
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
    run_server(build_app(inpainter, settings), sock)

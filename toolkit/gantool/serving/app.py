"""``gantool serve``: an HTTP inpainting service and a browser page (the ``serve`` extra).

- :func:`build_app` makes the FastAPI app around one opened :class:`gantool.Inpainter`;
- :class:`gantool.serving.batcher.Batcher` runs the model on one worker thread, never on
  the event loop; each request finishes (blend, known pixels) and encodes its own image on
  a worker thread;
- :class:`gantool.serving.limits.Guard` (ASGI middleware) decides what needs no work:
  Host, Origin, API key, lengths, the body read under a deadline, then admission;
- :mod:`gantool.serving.server` runs it (TCP_NODELAY, header limits, signals).

Uploads are decoded and results composited by the library's own functions
(:func:`gantool.core.processing.read_image`, :func:`gantool.inference.inpainter.load_mask`,
:func:`~gantool.inference.inpainter.boxes_to_mask`), so the API follows the CLI's rules exactly,
and each request's cost (:func:`gantool.inference.cost.estimate_cost`, as ``gantool inpaint``)
is checked against ``--max-model-pixels`` and ``--max-holes`` before it is queued.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, BinaryIO

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from PIL import Image, features
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from gantool import __version__
from gantool.core.constants import BLEND_MODES, DECODE_FORMATS, SERVE_OUTPUT_FORMATS, STRATEGIES
from gantool.core.errors import GantoolError, InputError, SizeLimitError, check_choice, first_line
from gantool.core.mask_input import mask_to_array
from gantool.core.processing import read_image, save_png
from gantool.inference.cost import Cost, check_cost, check_holes, estimate_cost
from gantool.inference.inpainter import (
    Inpainter,
    ModelFills,
    boxes_to_mask,
    check_mask_size,
    finish_image,
    load_mask,
    parse_box,
)
from gantool.runtime.memory import trim_heap
from gantool.serving.answers import EXPOSED_HEADERS, HOLES_HEADER, REQUEST_ID_HEADER, install_request_id_filter
from gantool.serving.batcher import Batcher, ModelRunner, QueueFullError
from gantool.serving.checks import (
    UnsupportedOutput,
    check_full_strategy_from_header,
    check_header_sizes,
    check_output_format,
)
from gantool.serving.limits import Counters, Guard
from gantool.serving.settings import INPAINT_PATH, ServeSettings

log = logging.getLogger(__name__)

MEDIA_TYPES = {"png": "image/png", "webp": "image/webp"}
# The page: fixed URL -> file in gantool/serving/static. No path ever comes from a client.
STATIC_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
# Everything the page loads comes from this server: no CDN, works offline.
PAGE_CSP = (
    "default-src 'self'; img-src 'self' blob: data:; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
FILE_FIELDS = ("image", "mask")
TEXT_FIELDS = ("boxes", "strategy", "blend", "format")
# The client went away (nginx's code); never seen by a client, kept for logs.
CLIENT_CLOSED = 499


# ------------------------------------------------------------------------ decode / encode


def decode_request(
    image_file: BinaryIO,
    mask_file: BinaryIO | None,
    boxes: Sequence[str],
    max_pixels: int,
    max_holes: int | None = None,
) -> tuple[Image.Image, np.ndarray]:
    """The upload as the CLI reads a file: the image upright, the holes from the mask
    and the boxes (combined), else from the image's alpha channel.

    With ``max_holes``, a mask (without boxes, which could join its holes) with more
    separate holes is refused (:class:`SizeLimitError`) before the image is decoded:
    the mask is small to decode and one connected-components pass counts its holes,
    while the image is most of the upload's decoding time."""
    try:
        mask = None
        if mask_file is not None:
            check_header_sizes(image_file, mask_file, max_pixels)
            mask = mask_to_array(read_image(mask_file, max_pixels=max_pixels, name="the uploaded mask"))
            if max_holes is not None and not boxes:
                check_holes(mask, max_holes)
        image = read_image(image_file, lossless=True, max_pixels=max_pixels, name="the uploaded image")
        parts = []
        if mask is not None:
            parts.append(check_mask_size(mask, image, "image", "the image"))
        if boxes:
            parts.append(boxes_to_mask([parse_box(box, "boxes") for box in boxes], image.width, image.height))
        if not parts:
            parts.append(load_mask(None, image))
    except GantoolError:
        raise
    except MemoryError:
        raise SizeLimitError("the upload does not fit in the server's memory") from None
    except Exception as e:  # a decoder's own error on a malformed upload is still bad input
        raise InputError(f"cannot decode the upload: {first_line(e)}") from None
    return image, (np.maximum.reduce(parts) if len(parts) > 1 else parts[0])


def finish_and_encode(image: Image.Image, mask: np.ndarray, fills: ModelFills, blend: str, fmt: str) -> bytes:
    """The answer's bytes: the model's output finished (blend, known pixels) and encoded."""
    return encode_image(finish_image(image, mask, fills, blend), fmt)


def encode_image(image: Image.Image, fmt: str) -> bytes:
    """PNG (as ``gantool inpaint`` writes, :func:`gantool.core.processing.save_png`) or lossless WebP."""
    buffer = io.BytesIO()
    if fmt == "webp":
        if image.mode == "I;16":
            raise InputError("WebP cannot hold a 16-bit image: ask for format=png")
        image.save(buffer, format="WEBP", lossless=True, exact=True)
    else:
        save_png(image, buffer)
    return buffer.getvalue()


# ---------------------------------------------------------------------------- the form


MAX_FORM_FIELDS = 256  # 999 `boxes` are refused "Too many fields" (400); docs/serving.md lists it
MULTIPART_HEADER_BYTES = 4096 + 128  # python-multipart's limit on one header line of a part


def _boundary(request: Request) -> bytes:
    kind, _, params = request.headers.get("content-type", "").partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise InputError(
            "send the upload as multipart/form-data with an `image` file field "
            f"(got {kind.strip() or 'no Content-Type'})"
        )
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "boundary" and value.strip('"'):
            return value.strip('"').encode("latin-1")
    raise InputError("the multipart/form-data Content-Type has no boundary")


async def read_form(request: Request) -> tuple[dict[str, UploadFile], dict[str, list[str]], Any]:
    """The upload's files and text fields, each checked: a body cut short, a text where a
    file belongs (or the reverse), a field sent twice or unknown are one clear 400 each."""
    boundary = _boundary(request)
    body = await request.body()  # already read in full by the guard
    if not body.rstrip(b"\r\n").endswith(b"--" + boundary + b"--"):
        raise InputError("the multipart body is incomplete (no closing boundary): the upload was cut short")
    try:
        form = await request.form(max_files=len(FILE_FIELDS) + 1, max_fields=MAX_FORM_FIELDS)
    except StarletteHTTPException as e:  # Starlette says "Invalid multipart data."; its parser's cause says why
        parser_error = getattr(e.__context__, "__cause__", None)
        if parser_error is None:
            raise
        why = first_line(parser_error)
        if "header size" in why:
            why += f" (a part's header line, its file name included, is over {MULTIPART_HEADER_BYTES} bytes)"
        raise InputError(f"the multipart body is malformed: {why}") from None
    files: dict[str, UploadFile] = {}
    texts: dict[str, list[str]] = {}
    for name, value in form.multi_items():
        if name in FILE_FIELDS:
            if not isinstance(value, UploadFile):
                raise InputError(f"`{name}` must be a file part (with a filename), got a text field")
            if name in files:
                raise InputError(f"`{name}` was sent twice: send one")
            files[name] = value
        elif name in TEXT_FIELDS:
            if isinstance(value, UploadFile):
                raise InputError(f"`{name}` must be a text field, got a file")
            if name != "boxes" and name in texts:
                raise InputError(f"`{name}` was sent twice: send one")
            texts.setdefault(name, []).append(value)
        else:
            raise InputError(f"unknown field `{name}` (fields: {', '.join(FILE_FIELDS + TEXT_FIELDS)})")
    if "image" not in files:
        raise InputError("`image` is missing: send the image as a file part named image")
    return files, texts, form


async def _client_left(request: Request) -> None:
    """Returns when the client closes its connection (the guard replays the body first)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# ---------------------------------------------------------------------------------- app


def _status_for(error: GantoolError) -> int:
    if isinstance(error, UnsupportedOutput):
        return 422
    if isinstance(error, SizeLimitError):
        return 413
    if isinstance(error, QueueFullError):
        return 503
    if isinstance(error, InputError):
        return 400
    return 500


def _error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    """Every error is JSON ``{"error": "one line"}``; no traceback ever reaches a client."""

    async def gantool_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GantoolError)
        status = _status_for(exc)
        return _error_response(status, first_line(exc), {"Retry-After": "1"} if status == 503 else None)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        elif exc.status_code == 404:
            message = f"no such path: {request.url.path}"
        return _error_response(exc.status_code, message, dict(exc.headers or {}))

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = []
        for item in exc.errors():
            where = ".".join(str(part) for part in item.get("loc", ()) if part not in ("body", "query"))
            problems.append(f"{where}: {item.get('msg', 'invalid')}" if where else str(item.get("msg", "invalid")))
        return _error_response(400, "; ".join(problems) or "invalid request")

    async def decoder_error(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(400, f"bad input: {first_line(exc)}")

    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s: %s", request.method, request.url.path, first_line(exc), exc_info=exc)
        return _error_response(500, f"internal server error ({type(exc).__name__})")

    app.add_exception_handler(GantoolError, gantool_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    # Pillow and numpy raise these on malformed data that slipped past the decoder checks.
    for kind in (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        app.add_exception_handler(kind, decoder_error)
    app.add_exception_handler(Exception, server_error)


def _static_files() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("gantool.serving") / "static"
    return {url: (folder.joinpath(name).read_bytes(), media) for url, (name, media) in STATIC_FILES.items()}


def model_info(inpainter: Inpainter, settings: ServeSettings) -> dict[str, Any]:
    backend = inpainter.backend
    return {
        "model": f"{backend.path.parent.name}/{backend.path.name}",
        "backend": backend.name,
        "provider": backend.provider,
        "provider_note": backend.provider_note,
        "precision": backend.precision,
        "train_size": backend.train_size,
        "size_multiple": backend.size_multiple,
        "metadata": backend.metadata,
        "strategies": list(STRATEGIES),
        "default_strategy": settings.strategy,
        "default_blend": inpainter.blend,
        "formats": [f for f in SERVE_OUTPUT_FORMATS if f != "webp" or features.check("webp")],
        "input_formats": list(DECODE_FORMATS),
        "limits": {
            "max_upload_mb": settings.max_upload_mb,
            "max_pixels": settings.max_pixels,
            "max_model_pixels": settings.max_model_pixels,
            "max_holes": settings.max_holes,
            "max_blend_pixels": settings.max_blend_pixels,
            "max_batch": settings.max_batch,
            "batch_wait_ms": settings.batch_wait_ms,
            "max_queue": settings.max_queue,
            "read_timeout": settings.read_timeout,
            "min_upload_rate_kb": settings.min_upload_rate_kb,
            "max_header_kb": settings.max_header_kb,
        },
        "api_key_required": settings.api_key is not None,
        "version": __version__,
    }


INPAINT_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "format": "binary", "description": "the image (PNG, JPEG, ...)"},
                        "mask": {"type": "string", "format": "binary", "description": "a pixel > 127 (or 1) is a hole"},
                        "boxes": {"type": "array", "items": {"type": "string"}, "description": "X,Y,W,H holes"},
                        "strategy": {"type": "string", "enum": list(STRATEGIES)},
                        "blend": {"type": "string", "enum": list(BLEND_MODES)},
                        "format": {"type": "string", "enum": list(SERVE_OUTPUT_FORMATS)},
                    },
                }
            }
        },
    }
}
INPAINT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/png": {}, "image/webp": {}}, "description": "the inpainted image"},
    400: {"description": "bad input"},
    401: {"description": "missing or wrong API key"},
    403: {"description": "a page from another origin"},
    408: {"description": "the body did not arrive in time"},
    411: {"description": "no Content-Length"},
    413: {"description": "upload, image or cost over the limits"},
    503: {"description": "the queue is full, or shutting down (Retry-After)"},
}


# long: the routes share the app's state through closures; one function keeps every route of the API in one place
def build_app(
    inpainter: Inpainter,
    settings: ServeSettings | None = None,
    runner: ModelRunner | None = None,
    health: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """The FastAPI app serving ``inpainter`` (already opened; its ``.backend`` runs).

    ``runner`` collects the requests into model batches and runs them: by default a
    :class:`Batcher` (its own thread); ``gantool serve --ray`` passes one whose batches come
    from Ray Serve's ``@serve.batch``. ``health`` adds its fields to ``/healthz`` (which
    replica answered, under Ray)."""
    settings = settings or ServeSettings()
    batcher = runner or Batcher(
        inpainter.backend,
        settings.max_batch,
        settings.batch_wait_ms / 1000.0,
        settings.max_queue,
        inpainter.crop_margin,
        max_batch_pixels=settings.max_model_pixels,
        release_memory_pixels=settings.release_memory_pixels,
    )
    counters = Counters()
    static = _static_files()
    info = model_info(inpainter, settings)
    backend = inpainter.backend

    def begin_shutdown() -> None:
        counters.draining = True
        batcher.drain()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            # A batch still running is not waited for long: the thread is a daemon.
            await run_in_threadpool(batcher.stop, 1.0)

    app = FastAPI(
        title="gantool",
        version=__version__,
        description="Inpainting with a GLCIC generator. Masks: a pixel > 127 (or 1) is a hole.",
        lifespan=lifespan,
        redirect_slashes=False,  # a redirect would be built from the client's Host
    )
    app.state.batcher = batcher
    app.state.counters = counters
    app.state.settings = settings
    app.state.begin_shutdown = begin_shutdown

    def plan(image: Image.Image, holes: np.ndarray, strategy: str, blend: str) -> Cost:
        cost = estimate_cost(
            holes, strategy, backend.train_size, backend.size_multiple, inpainter.crop_margin,
            max_holes=settings.max_holes, blend=blend,
        )  # fmt: skip
        return check_cost(cost, max_model_pixels=settings.max_model_pixels, max_blend_pixels=settings.max_blend_pixels)

    @app.post(
        INPAINT_PATH,
        response_class=Response,
        responses=INPAINT_RESPONSES,
        summary="Fill the holes of an image",
        openapi_extra=INPAINT_DOC,
    )
    async def inpaint(request: Request) -> Response:
        """The image with its holes filled: the input's size and orientation, known
        pixels identical to the decoded input. Holes come from the mask and/or the
        boxes (combined), else from the image's transparent pixels."""
        files, texts, form = await read_form(request)
        try:
            strategy = texts.get("strategy", [settings.strategy])[0]
            blend = texts.get("blend", [inpainter.blend])[0]
            output_format = texts.get("format", ["png"])[0]
            check_choice("strategy", strategy, STRATEGIES)
            check_choice("blend", blend, BLEND_MODES)
            check_choice("format", output_format, tuple(info["formats"]))
            mask = files.get("mask")
            await run_in_threadpool(
                check_full_strategy_from_header,
                files["image"].file, strategy, backend.size_multiple, settings.max_model_pixels,
            )  # fmt: skip
            decoded, holes = await run_in_threadpool(
                decode_request,
                files["image"].file,
                mask.file if mask is not None else None,
                texts.get("boxes", []),
                settings.max_pixels,
                settings.max_holes,
            )
        finally:
            await form.close()
        check_output_format(decoded, output_format)
        cost = await run_in_threadpool(plan, decoded, holes, strategy, blend)
        future = batcher.submit(decoded, holes, strategy, cost.model_pixels)
        waiting: asyncio.Future[Any] = asyncio.wrap_future(future)
        left: asyncio.Future[Any] = asyncio.ensure_future(_client_left(request))
        try:
            await asyncio.wait({waiting, left}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the shutdown timeout ran out: answer rather than vanish
            future.cancel()
            return _error_response(503, "the server is shutting down", {"Retry-After": "1"})
        finally:
            left.cancel()
        if not waiting.done():  # the client left: its image is skipped if the model has not taken it
            future.cancel()
            waiting.cancel()
            return Response(status_code=CLIENT_CLOSED)
        fills = waiting.result()
        # Blending and encoding run here, beside the model thread's next batch.
        body = await run_in_threadpool(finish_and_encode, decoded, holes, fills, blend, output_format)
        # A large request: once it is answered (and its arrays freed), the C heap goes back to the system.
        large = 0 < settings.release_memory_pixels <= max(decoded.width * decoded.height, cost.model_pixels)
        return Response(
            body,
            media_type=MEDIA_TYPES[output_format],
            headers={HOLES_HEADER: str(cost.holes)},  # 0: the mask (or alpha) had no hole; the image comes back as sent
            background=BackgroundTask(trim_heap) if large else None,
        )

    @app.get("/v1/model", summary="The model that runs")
    async def get_model() -> dict[str, Any]:
        return info

    @app.get("/healthz", summary="Alive, with queue figures")
    async def healthz() -> dict[str, Any]:
        return {
            "status": "stopping" if counters.draining else "ok",
            "in_flight": counters.in_flight,
            "reading": counters.reading,
            "queued": batcher.queued,
            "batches": batcher.batches,
            "images": batcher.images,
            "skipped": batcher.skipped,
            **(health() if health is not None else {}),
        }

    @app.get("/readyz", summary="Model loaded and a warm-up inference done", response_model=None)
    async def readyz() -> dict[str, Any] | JSONResponse:
        if counters.draining:
            return _error_response(503, "shutting down")
        if not batcher.ready.is_set():
            return _error_response(503, "warming up", {"Retry-After": "1"})
        if batcher.warmup_error is not None:
            return _error_response(503, f"warm-up inference failed: {batcher.warmup_error}")
        return {"ready": True}

    def static_route(url: str) -> Callable[[], Awaitable[Response]]:
        body, media = static[url]

        async def page() -> Response:
            headers = {"Cache-Control": "no-cache", "Content-Security-Policy": PAGE_CSP}
            return Response(body, media_type=media, headers=headers)

        return page

    for url in STATIC_FILES:
        app.get(url, include_in_schema=False)(static_route(url))
    # HEAD answers as GET does, without the body (uvicorn drops it).
    for url, route in (("/healthz", healthz), ("/readyz", readyz), *((u, static_route(u)) for u in STATIC_FILES)):
        app.head(url, include_in_schema=False, response_model=None)(route)

    _install_error_handlers(app)
    install_request_id_filter()
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", REQUEST_ID_HEADER],
            expose_headers=list(EXPOSED_HEADERS),
        )
    app.add_middleware(Guard, settings=settings, counters=counters)  # outermost: before CORS and the app
    return app

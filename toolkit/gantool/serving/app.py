"""``gantool serve``: an HTTP inpainting service and a browser page (the ``serve`` extra).

- :func:`build_app` makes the FastAPI app around one opened :class:`gantool.Inpainter`;
- :class:`Batcher` runs the model on one worker thread, never on the event loop:
  requests that arrive within ``batch_wait_ms`` of the first are run together
  (same-size model inputs as one batch, by :func:`gantool.inference.inpainter.fill_images`);
  each request then finishes its own image (blend, known pixels:
  :func:`~gantool.inference.inpainter.finish_image`) and encodes it on a worker thread, so
  the model thread runs nothing but the model;
- :class:`_Guard` (ASGI middleware) answers before any body is read: 401 without
  the API key, 413 for a declared or streamed body over the limit, 503 with
  ``Retry-After`` when ``max_queue`` inpaint requests are already inside.

Uploads are decoded and results composited by the library's own functions
(:func:`gantool.core.processing.read_image`, :func:`gantool.inference.inpainter.load_mask`,
:func:`~gantool.inference.inpainter.boxes_to_mask`), so the API follows the CLI's rules exactly:
masks > 127 (or 0/1) are holes, alpha marks holes when there is no mask, and
known pixels come back as decoded.
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import logging
import queue
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO

import numpy as np
import uvicorn
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from PIL import Image, features
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from gantool import __version__
from gantool.core.constants import (
    BLEND_MODES,
    DEFAULT_SERVE_BATCH_WAIT_MS,
    DEFAULT_SERVE_MAX_BATCH,
    DEFAULT_SERVE_MAX_PIXELS,
    DEFAULT_SERVE_MAX_QUEUE,
    DEFAULT_SERVE_MAX_UPLOAD_MB,
    DEFAULT_STRATEGY,
    SERVE_OUTPUT_FORMATS,
    STRATEGIES,
)
from gantool.core.errors import (
    GantoolError,
    InputError,
    SizeLimitError,
    check_choice,
    first_line,
)
from gantool.core.processing import read_image, save_png
from gantool.inference.inpainter import (
    Inpainter,
    ModelFills,
    boxes_to_mask,
    fill_images,
    finish_image,
    inpaint_images,
    load_mask,
    parse_box,
)

if TYPE_CHECKING:
    from gantool.runtime.backends import Backend

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INPAINT_PATH = "/v1/inpaint"
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


@dataclass(frozen=True)
class ServeSettings:
    """The server's limits and options (the ``gantool serve`` flags)."""

    max_batch: int = DEFAULT_SERVE_MAX_BATCH
    batch_wait_ms: float = DEFAULT_SERVE_BATCH_WAIT_MS
    max_queue: int = DEFAULT_SERVE_MAX_QUEUE
    max_upload_mb: float = DEFAULT_SERVE_MAX_UPLOAD_MB
    max_pixels: int = DEFAULT_SERVE_MAX_PIXELS
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    strategy: str = DEFAULT_STRATEGY

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 1:
            raise InputError("--max-batch and --max-queue must be at least 1")
        if self.batch_wait_ms < 0 or self.max_upload_mb <= 0 or self.max_pixels < 1:
            raise InputError("--batch-wait-ms must be >= 0, --max-upload-mb and --max-pixels positive")
        check_choice("strategy", self.strategy, STRATEGIES)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost: addresses other machines cannot reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------ batcher


class QueueFullError(GantoolError):
    """The server holds ``max_queue`` requests already."""


@dataclass
class _Job:
    image: Image.Image
    mask: np.ndarray
    strategy: str
    future: Future[ModelFills]


class Batcher:
    """Runs the model on one worker thread.

    The thread first runs a warm-up inference (then :attr:`ready` is set). It
    then takes the oldest job, collects the jobs that arrive within ``wait_s``
    (up to ``max_batch``) and runs them through
    :func:`gantool.inference.inpainter.fill_images`, which batches same-size model
    inputs. One bad job does not fail its batch: the batch is retried job by job.
    Blending and compositing are the caller's (:func:`finish_and_encode`).
    """

    def __init__(
        self,
        backend: Backend,
        max_batch: int,
        wait_s: float,
        max_queue: int,
        crop_margin: int | None = None,
    ) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.max_queue = max_queue
        self.crop_margin = crop_margin
        self.ready = threading.Event()
        self.warmup_error: str | None = None
        self.batches = 0
        self.images = 0
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._queued = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="gantool-serve-model", daemon=True)

    @property
    def queued(self) -> int:
        """Jobs waiting for the model (not counting the batch that runs)."""
        return self._queued

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the running batch, fail the queued jobs, end the thread."""
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, image: Image.Image, mask: np.ndarray, strategy: str) -> Future[ModelFills]:
        """Queue one image for the model; raises :class:`QueueFullError` when ``max_queue`` jobs wait.

        The future holds the model's output (:func:`gantool.inference.inpainter.fill_images`):
        the caller finishes it (blend, known pixels) on its own thread, so this
        thread only runs the model.
        """
        job = _Job(image, mask, strategy, Future())
        with self._lock:
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

    def _collect(self) -> list[_Job] | None:
        first = self._take(None)
        if first is None:
            return None
        batch = [first]
        deadline = time.monotonic() + self.wait_s
        while len(batch) < self.max_batch:
            try:
                job = self._take(deadline - time.monotonic())
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # stop after this batch
                break
            batch.append(job)
        return batch

    def _work(self) -> None:
        self._warm_up()
        while (batch := self._collect()) is not None:
            self._run(batch)
        while True:  # stopped: fail whatever still waits
            try:
                job = self._take(0)
            except queue.Empty:
                break
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(QueueFullError("the server is shutting down"))

    def _run(self, batch: Sequence[_Job]) -> None:
        # A cancelled future is a request whose client went away: skip its work.
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        by_strategy: dict[str, list[_Job]] = {}
        for job in live:
            by_strategy.setdefault(job.strategy, []).append(job)
        for strategy, jobs in by_strategy.items():
            try:
                results: list[ModelFills] | None = fill_images(
                    self.backend, [(j.image, j.mask) for j in jobs], strategy, self.max_batch, self.crop_margin
                )
            except Exception:  # retried one by one below, so one bad job fails alone
                results = None
            for index, job in enumerate(jobs):
                try:
                    if results is None:
                        result = fill_images(self.backend, [(job.image, job.mask)], strategy, 1, self.crop_margin)[0]
                    else:
                        result = results[index]
                except Exception as e:  # the worker thread must survive any job; the request gets the error
                    job.future.set_exception(e)
                else:
                    job.future.set_result(result)
        self.batches += 1
        self.images += len(live)


# ------------------------------------------------------------------------ decode / encode


def decode_request(
    image_file: BinaryIO,
    mask_file: BinaryIO | None,
    boxes: Sequence[str],
    max_pixels: int,
) -> tuple[Image.Image, np.ndarray]:
    """The upload as the CLI reads a file: the image upright, the holes from the mask
    and the boxes (combined), else from the image's alpha channel."""
    try:
        image = read_image(image_file, lossless=True, max_pixels=max_pixels, name="the uploaded image")
        parts = []
        if mask_file is not None:
            parts.append(
                load_mask(
                    read_image(mask_file, max_pixels=max_pixels, name="the uploaded mask"),
                    image,
                )
            )
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


# ------------------------------------------------------------------------------ ASGI guard


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _send_error(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = error_body(message)
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class _BodyTooLargeError(Exception):
    pass


class _Guard:
    """Checks that need no body: the API key, the declared size, admission.

    The body is counted while it streams in; past the limit the request ends
    with 413 whatever the app was doing with it (FastAPI turns errors while
    parsing a form into its own 400, so the app's answer is replaced).
    """

    def __init__(self, app: ASGIApp, settings: ServeSettings, state: dict[str, int]) -> None:
        self.app = app
        self.max_body = settings.max_body_bytes
        self.max_upload_mb = settings.max_upload_mb
        self.max_queue = settings.max_queue
        self.api_key = settings.api_key.encode() if settings.api_key else None
        self.state = state

    def _authorized(self, scope: Scope) -> bool:
        assert self.api_key is not None
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given is not None and secrets.compare_digest(given, self.api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        protected = self.api_key is not None and scope["path"].startswith("/v1/") and scope["method"] != "OPTIONS"
        if protected and not self._authorized(scope):
            await _send_error(
                send,
                401,
                "missing or wrong API key (send Authorization: Bearer KEY or X-API-Key: KEY)",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        too_large = f"the upload is over the limit of {self.max_upload_mb:g} MB"
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await _send_error(send, 413, too_large)
            return
        admitted = scope["path"] == INPAINT_PATH and scope["method"] == "POST"
        if admitted:
            if self.state["in_flight"] >= self.max_queue:
                await _send_error(
                    send,
                    503,
                    f"the server is busy ({self.max_queue} requests inside); retry shortly",
                    {"Retry-After": "1"},
                )
                return
            self.state["in_flight"] += 1
        received = 0
        overflow = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, overflow
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    overflow = True
                    raise _BodyTooLargeError
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if overflow:  # the app's answer to a cut-off body is replaced by the 413
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLargeError:
            pass
        finally:
            if admitted:
                self.state["in_flight"] -= 1
        if overflow and not started:
            await _send_error(send, 413, too_large)


# ---------------------------------------------------------------------------------- app


def _status_for(error: GantoolError) -> int:
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
        log.error(
            "internal error on %s %s: %s",
            request.method,
            request.url.path,
            first_line(exc),
            exc_info=exc,
        )
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
        "limits": {
            "max_upload_mb": settings.max_upload_mb,
            "max_pixels": settings.max_pixels,
            "max_batch": settings.max_batch,
            "batch_wait_ms": settings.batch_wait_ms,
            "max_queue": settings.max_queue,
        },
        "api_key_required": settings.api_key is not None,
        "version": __version__,
    }


def build_app(inpainter: Inpainter, settings: ServeSettings | None = None) -> FastAPI:
    """The FastAPI app serving ``inpainter`` (already opened; its ``.backend`` runs)."""
    settings = settings or ServeSettings()
    batcher = Batcher(
        inpainter.backend,
        settings.max_batch,
        settings.batch_wait_ms / 1000.0,
        settings.max_queue,
        inpainter.crop_margin,
    )
    state = {"in_flight": 0}
    static = _static_files()
    info = model_info(inpainter, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            await run_in_threadpool(batcher.stop)

    app = FastAPI(
        title="gantool",
        version=__version__,
        description="Inpainting with a GLCIC generator. Masks: a pixel > 127 (or 1) is a hole.",
        lifespan=lifespan,
    )
    app.state.batcher = batcher

    @app.post(
        INPAINT_PATH,
        response_class=Response,
        responses={
            200: {
                "content": {"image/png": {}, "image/webp": {}},
                "description": "the inpainted image",
            },
            400: {"description": "bad input"},
            401: {"description": "missing or wrong API key"},
            413: {"description": "upload or image over the limits"},
            503: {"description": "the queue is full (Retry-After)"},
        },
        summary="Fill the holes of an image",
    )
    async def inpaint(
        image: Annotated[UploadFile, File(description="The image (any format Pillow reads).")],
        mask: Annotated[
            UploadFile | None,
            File(description="Hole mask: a pixel > 127 (or 1) is a hole."),
        ] = None,
        boxes: Annotated[
            list[str] | None,
            Form(description="Rectangular holes X,Y,W,H (repeatable)."),
        ] = None,
        strategy: Annotated[str, Form(description="auto, full, crop or resize.")] = settings.strategy,
        blend: Annotated[str, Form(description="poisson (GLCIC's post-processing) or none.")] = inpainter.blend,
        output_format: Annotated[str, Form(alias="format", description="png, or webp (lossless).")] = "png",
    ) -> Response:
        """The image with its holes filled: the input's size and orientation, known
        pixels identical to the decoded input. Holes come from the mask and/or the
        boxes (combined), else from the image's transparent pixels."""
        check_choice("strategy", strategy, STRATEGIES)
        check_choice("blend", blend, BLEND_MODES)
        check_choice("format", output_format, tuple(info["formats"]))
        decoded, holes = await run_in_threadpool(
            decode_request,
            image.file,
            mask.file if mask is not None else None,
            boxes or [],
            settings.max_pixels,
        )
        fills = await asyncio.wrap_future(batcher.submit(decoded, holes, strategy))
        # Blending and encoding run here, beside the model thread's next batch.
        body = await run_in_threadpool(finish_and_encode, decoded, holes, fills, blend, output_format)
        return Response(body, media_type=MEDIA_TYPES[output_format])

    @app.get("/v1/model", summary="The model that runs")
    async def get_model() -> dict[str, Any]:
        return info

    @app.get("/healthz", summary="Alive, with queue figures")
    async def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "in_flight": state["in_flight"],
            "queued": batcher.queued,
            "batches": batcher.batches,
            "images": batcher.images,
        }

    @app.get(
        "/readyz",
        summary="Model loaded and a warm-up inference done",
        response_model=None,
    )
    async def readyz() -> dict[str, Any] | JSONResponse:
        if not batcher.ready.is_set():
            return _error_response(503, "warming up", {"Retry-After": "1"})
        if batcher.warmup_error is not None:
            return _error_response(503, f"warm-up inference failed: {batcher.warmup_error}")
        return {"ready": True}

    def static_route(url: str) -> Callable[[], Awaitable[Response]]:
        body, media = static[url]

        async def page() -> Response:
            return Response(
                body,
                media_type=media,
                headers={
                    "Cache-Control": "no-cache",
                    "Content-Security-Policy": PAGE_CSP,
                },
            )

        return page

    for url in STATIC_FILES:
        app.get(url, include_in_schema=False)(static_route(url))

    _install_error_handlers(app)
    app.add_middleware(_Guard, settings=settings, state=state)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 picks a free one); connections wait in its backlog until the server runs."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(app: FastAPI, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until Ctrl-C / SIGTERM (uvicorn; access log off)."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])

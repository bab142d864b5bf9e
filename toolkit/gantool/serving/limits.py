"""The ASGI guard in front of the app: everything decided before any work.

In order, for every HTTP request: the common headers on the answer, whoever sends it
(``nosniff``, ``X-Request-ID``, CORS for an allowed origin: :mod:`gantool.serving.answers`),
and a line in the access log; headers over ``--max-header-kb`` (431: behind a front that
parses headers of any size, such as Ray Serve's proxy); the ``Host`` allow-list
(400, DNS rebinding); ``Origin`` neither this server's nor a ``--cors-origin`` (403,
cross-site form posts need no preflight); the API key (401). Then, for a request with
a body: its length (411 without one, 413 over ``--max-upload-mb``), and the body read
in full under a deadline (``--read-timeout`` plus one second per ``--min-upload-rate-kb``
KB received; 408 past it) *before* the request takes a queue slot, so slow or silent
clients hold a connection, never a slot. Only then admission (503 with ``Retry-After``
when ``--max-queue`` requests are inside) and the app, which sees the body replayed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from gantool.serving.answers import (
    HOLES_HEADER,
    NOSNIFF,
    AccessLog,
    AccessRecord,
    _host_name,
    common_headers,
    origin_key,
    request_id_from,
    request_id_var,
)
from gantool.serving.settings import INPAINT_PATH, ServeSettings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BODY_METHODS = ("POST", "PUT", "PATCH")
# How often a body read looks at the shutdown flag while it waits for a slow client.
POLL_S = 0.25


@dataclass
class Counters:
    """Shared by the guard, the app and the server: what is inside, and whether it is stopping."""

    in_flight: int = 0  # requests admitted (body read) and not answered
    reading: int = 0  # bodies being read
    buffered: int = 0  # bytes reserved by the bodies being read or held
    draining: bool = False  # the first signal came: new work gets 503


def header_bytes(scope: Scope) -> int:
    """The size of a request's line and headers as a client sent them (about: the parsed form)."""
    line = len(scope.get("method", "")) + len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 12
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers") or ())


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def send_error(
    send: Send, status: int, message: str, headers: dict[str, str] | None = None, close: bool = False
) -> None:
    body = error_body(message)
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        NOSNIFF,
    ]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if close:  # the rest of the body was not read: this connection cannot carry another request
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class Refused(Exception):
    """A request answered by the guard: status, message, headers, and whether to close."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.headers, self.close = status, message, headers, close


class _ClientGone(Exception):
    pass


class Guard:
    """The checks above, as ASGI middleware around the FastAPI app (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: ServeSettings, counters: Counters) -> None:
        self.app = app
        self.settings = settings
        self.counters = counters
        self.api_key = settings.api_key.encode() if settings.api_key else None
        hosts = settings.allowed_hosts
        self.any_host = not hosts or "*" in hosts
        self.hosts = {h.lower() for h in hosts}
        self.origins = set(settings.cors_origins)
        self.origin_keys = {origin_key(o) for o in settings.cors_origins}
        self.access_log = AccessLog(settings.access_log)
        # Bodies being read may reserve this much together; more wait outside (503).
        self.buffer_budget = settings.max_queue * settings.max_body_bytes

    # -------------------------------------------------------------------- header checks

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        assert self.api_key is not None
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given is not None and secrets.compare_digest(given, self.api_key)

    def check_headers(self, scope: Scope, headers: dict[bytes, bytes]) -> None:
        # gantool's own protocol refuses these before parsing them (431, gantool.serving.server);
        # a front that parses headers of any size (Ray Serve's proxy: uvicorn with httptools) is checked here.
        if header_bytes(scope) > self.settings.max_header_bytes:
            raise Refused(431, f"the request headers are over {self.settings.max_header_kb} KB", close=True)
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.any_host and _host_name(host).lower() not in self.hosts and host.lower() not in self.hosts:
            raise Refused(400, f"Host {host!r} is not served here (see --allowed-host)")
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1")
            key = origin_key(text)
            own = origin_key(f"{scope.get('scheme', 'http')}://{host}")
            if key != own and key not in self.origin_keys:
                raise Refused(403, f"requests from pages at {text} are not allowed (see --cors-origin)")
        protected = self.api_key is not None and scope["path"].startswith("/v1/") and scope["method"] != "OPTIONS"
        if protected and not self._authorized(headers):
            raise Refused(
                401,
                "missing or wrong API key (send Authorization: Bearer KEY or X-API-Key: KEY)",
                {"WWW-Authenticate": "Bearer"},
            )

    def declared_length(self, scope: Scope, headers: dict[bytes, bytes]) -> int | None:
        """The body's declared length; None for a chunked body (counted while it streams)."""
        declared = headers.get(b"content-length")
        if declared is None:
            if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                return None
            raise Refused(411, "a request body needs a Content-Length (or chunked transfer encoding)")
        if not declared.strip().isdigit():
            raise Refused(400, "Content-Length must be a whole number", close=True)
        length = int(declared)
        if length > self.settings.max_body_bytes:
            raise Refused(413, self._too_large(), close=True)
        return length

    def _too_large(self) -> str:
        return f"the upload is over the limit of {self.settings.max_upload_mb:g} MB (--max-upload-mb)"

    # ----------------------------------------------------------------------- body read

    async def read_body(self, receive: Receive, declared: int | None, reserve: Callable[[int], None]) -> bytes:
        """The whole body, under the deadline and the minimum rate; :class:`Refused` otherwise."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        settings = self.settings
        chunks: list[bytes] = []
        received = 0
        pending: asyncio.Future[Message] | None = None
        try:
            while True:
                if self.counters.draining:
                    raise Refused(503, "the server is shutting down", {"Retry-After": "1"}, close=True)
                left = start + settings.read_timeout + received / settings.min_upload_rate - loop.time()
                if left <= 0:
                    raise Refused(
                        408,
                        f"the body did not arrive in time ({received} bytes in {loop.time() - start:.1f} s; "
                        f"--read-timeout {settings.read_timeout:g} s, --min-upload-rate-kb "
                        f"{settings.min_upload_rate_kb:g})",
                        close=True,
                    )
                if pending is None:
                    pending = asyncio.ensure_future(receive())
                done, _ = await asyncio.wait({pending}, timeout=min(left, POLL_S))
                if not done:
                    continue
                message, pending = pending.result(), None
                if message["type"] == "http.disconnect":
                    raise _ClientGone
                body = message.get("body", b"")
                received += len(body)
                if received > settings.max_body_bytes:
                    raise Refused(413, self._too_large(), close=True)
                if declared is None:  # chunked: reserve as it streams
                    reserve(len(body))
                chunks.append(body)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        finally:
            if pending is not None:
                pending.cancel()

    def _reserve(self, size: int) -> None:
        if self.counters.buffered + size > self.buffer_budget:
            raise Refused(503, "the server is busy reading other uploads; retry shortly", {"Retry-After": "1"}, True)
        self.counters.buffered += size

    # ---------------------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        headers = dict(scope.get("headers") or [])
        request_id = request_id_from(headers.get(b"x-request-id"))
        scope.setdefault("state", {})["request_id"] = request_id
        origin = headers.get(b"origin")
        client = scope.get("client") or ("", 0)
        record = AccessRecord(request_id, scope["method"], scope["path"], f"{client[0]}:{client[1]}")
        token = request_id_var.set(request_id)  # the warnings logged on the request's behalf name it

        async def answer_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = list(message.get("headers", []))
                message["headers"] = [*present, *common_headers(present, request_id, origin, self.origins)]
                record.status = int(message["status"])
                holes = [v for k, v in present if k.lower() == HOLES_HEADER.lower().encode()]
                record.holes = int(holes[0]) if holes else None
            elif message["type"] == "http.response.body":
                record.bytes_out += len(message.get("body", b""))
            await send(message)

        counters = self.counters
        reserved = 0

        def reserve(size: int) -> None:
            nonlocal reserved
            self._reserve(size)
            reserved += size

        try:
            self.check_headers(scope, headers)
            if scope["method"] not in BODY_METHODS:
                await self.app(scope, receive, answer_send)
                return
            admitted = scope["path"] == INPAINT_PATH and scope["method"] == "POST"
            if admitted and counters.draining:
                raise Refused(503, "the server is shutting down", {"Retry-After": "1"}, close=True)
            declared = self.declared_length(scope, headers)
            if declared is not None:
                reserve(declared)
            counters.reading += 1
            try:
                body = await self.read_body(receive, declared, reserve)
            finally:
                counters.reading -= 1
            record.bytes_in = len(body)
            if admitted:
                if counters.in_flight >= self.settings.max_queue:
                    raise Refused(
                        503,
                        f"the server is busy ({self.settings.max_queue} requests inside); retry shortly",
                        {"Retry-After": "1"},
                    )
                counters.in_flight += 1
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # the next message is http.disconnect, when the client leaves

            try:
                await self.app(scope, replay, answer_send)
            finally:
                if admitted:
                    counters.in_flight -= 1
        except Refused as refused:
            await send_error(answer_send, refused.status, refused.message, refused.headers, refused.close)
        except _ClientGone:
            pass
        finally:
            counters.buffered -= reserved
            request_id_var.reset(token)
            self.access_log.write(record)

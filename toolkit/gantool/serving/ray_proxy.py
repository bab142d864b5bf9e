"""gantool inside Ray Serve's HTTP proxy: its protocol limits and its answers.

Ray's proxy (one per node) is uvicorn with httptools: it reads request headers of any size,
with no deadline, and answers its own errors (a replica that died, a full queue, a request
timeout, no application yet) as plain text without gantool's headers. Ray calls a function
named by its ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` variable when a proxy starts, and
adds the ASGI middlewares it returns in front of its routing. ``gantool serve --ray`` sets it
for the Ray instance it starts (on a cluster of your own, set it in the environment of
``ray start`` on every node; docs/ray.md), so that :func:`proxy_middlewares`:

- makes uvicorn's ``auto`` protocol in that proxy process gantool's own
  (:class:`gantool.serving.server.GuardedProtocol`: 431 over ``--max-header-kb``, 408 when the
  headers do not arrive within ``--read-timeout``, TCP_NODELAY, JSON for malformed requests);
- returns :class:`RayAnswers`, which turns Ray's own answers into gantool's: JSON
  ``{"error": ...}`` with ``nosniff``, one ``X-Request-ID`` and the CORS headers; a request
  whose replica died under it is ``503`` with ``Retry-After`` (Ray says 500), and so is a
  request that reaches the proxy while no gantool application runs (Ray says 404).

The settings come in :data:`PROXY_SETTINGS_ENV` (JSON), set by the driver before Ray starts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import MutableMapping
from typing import Any

from gantool.core.errors import first_line
from gantool.serving.answers import NOSNIFF, common_headers, request_id_from
from gantool.serving.limits import ASGIApp, Message, Receive, Scope, Send, error_body
from gantool.serving.server import GuardedProtocol
from gantool.serving.settings import ServeSettings

PROXY_SETTINGS_ENV = "GANTOOL_RAY_PROXY_SETTINGS"
PROTOCOL_PATH = "gantool.serving.ray_proxy:ProxyProtocol"
# Ray's own answers: which ones a client should retry, and what gantool says about them.
RETRY = {
    500: (503, "the replica running this request stopped before it answered; retry"),
    404: (503, "no gantool application runs behind this proxy (starting or stopping); retry shortly"),
    503: (503, "the service is busy (Ray Serve's queue is full); retry shortly"),
    408: (408, "the request took longer than Ray Serve's request timeout"),
}

log = logging.getLogger(__name__)


def proxy_settings(settings: ServeSettings) -> dict[str, Any]:
    """What the proxies need of the app's settings (JSON for :data:`PROXY_SETTINGS_ENV`)."""
    return {
        "max_header_kb": settings.max_header_kb,
        "read_timeout": settings.read_timeout,
        "cors_origins": list(settings.cors_origins),
    }


class ProxyProtocol(GuardedProtocol):
    """gantool's protocol in Ray's proxy; its limits are set by :func:`proxy_middlewares`."""


def _settings() -> dict[str, Any]:
    try:
        values = json.loads(os.environ.get(PROXY_SETTINGS_ENV) or "{}")
    except ValueError:
        values = {}
    return values if isinstance(values, dict) else {}


def proxy_middlewares() -> list[Any]:
    """Ray's proxy callback (see the module docstring): gantool's protocol, and :class:`RayAnswers`."""
    import uvicorn.config
    from starlette.middleware import Middleware

    values = _settings()
    defaults = ServeSettings()
    ProxyProtocol.max_header_bytes = int(values.get("max_header_kb", defaults.max_header_kb)) * 1024
    ProxyProtocol.header_timeout = float(values.get("read_timeout", defaults.read_timeout))
    ProxyProtocol.cors_origins = tuple(values.get("cors_origins", ()))
    uvicorn.config.HTTP_PROTOCOLS["auto"] = PROTOCOL_PATH  # read when Ray's proxy starts its uvicorn server
    return [Middleware(RayAnswers, cors_origins=ProxyProtocol.cors_origins)]


class RayAnswers:
    """ASGI middleware in front of Ray's proxy routing: one request ID from the client to the
    replica and back, and Ray's own answers (no ``nosniff``: not from gantool's app) as gantool's."""

    def __init__(self, app: ASGIApp, cors_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.cors_origins = cors_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = list(scope.get("headers") or [])
        given = next((v for k, v in headers if k == b"x-request-id"), None)
        request_id = request_id_from(given)
        # The ID every part uses: Ray's logs, the replica's guard (which echoes it) and the answer.
        scope["headers"] = [(k, v) for k, v in headers if k != b"x-request-id"] + [
            (b"x-request-id", request_id.encode())
        ]
        origin = next((v for k, v in headers if k == b"origin"), None)
        state: dict[str, Any] = {"ray": None, "started": False}

        async def gantool_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
                present = list(message.get("headers") or [])
                if not _from_ray(present):  # the app's answer: Ray appended its X-Request-ID again
                    present = _one_request_id(present)
                    message["headers"] = present + common_headers(present, request_id, origin, self.cors_origins)
                    await send(message)
                    return
                state["ray"] = {"status": int(message["status"]), "headers": present, "body": b""}
                return
            if message["type"] == "http.response.body" and state["ray"] is not None:
                state["ray"]["body"] += message.get("body", b"")
                if message.get("more_body", False):
                    return
                await self._answer_for_ray(send, state["ray"], request_id, origin)
                return
            await send(message)

        try:
            await self.app(scope, receive, gantool_send)
        except Exception as e:
            if state["started"]:
                raise
            log.warning("request %s: %s", request_id, first_line(e))
        if not state["started"]:
            # Ray's routing ended without an answer (a replica that died under the request: Ray
            # logs the error and sends nothing, so uvicorn would say "Internal Server Error").
            await self._answer_for_ray(send, {"status": 500, "body": b""}, request_id, origin)

    async def _answer_for_ray(
        self, send: Send, ray: MutableMapping[str, Any], request_id: str, origin: bytes | None
    ) -> None:
        status = ray["status"]
        said = ray["body"].decode("utf-8", "replace").strip().splitlines()
        status, message = RETRY.get(status, (status, "Ray Serve could not answer this request"))
        if said:
            message += f" (Ray: {said[0][:200]})"
        body = error_body(message)
        present = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 503:
            present.append((b"retry-after", b"1"))
        present += common_headers(present, request_id, origin, self.cors_origins)
        await send({"type": "http.response.start", "status": status, "headers": present})
        await send({"type": "http.response.body", "body": body})


def _from_ray(headers: list[tuple[bytes, bytes]]) -> bool:
    """Ray's own answers are plain text (its messages, or uvicorn's "Internal Server Error");
    gantool's app answers JSON, images, the page, and carries ``nosniff``."""
    kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    return NOSNIFF not in headers and kind.startswith(b"text/plain")


def _one_request_id(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept: list[tuple[bytes, bytes]] = []
    seen = False
    for name, value in headers:
        if name.lower() == b"x-request-id":
            if seen:
                continue
            seen = True
        kept.append((name, value))
    return kept

"""What every answer carries, whoever sends it (the app, the guard, the protocol's own 408/431):
``nosniff``, an ``X-Request-ID`` (the client's, when it is a plain token, else a new one), the CORS
headers for an allowed ``Origin``; and the access log's line per request.

The request ID is also a context variable while the request runs, so a warning logged on its
behalf (``blend: the hole covers more than 99 %``) names it: see :class:`RequestIdFilter`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import secrets
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

REQUEST_ID_HEADER = "X-Request-ID"
HOLES_HEADER = "X-Gantool-Holes"  # the hole count of an inpaint answer: 0 says no hole was found
# Headers a page on another origin may read (CORS hides the rest from its script).
EXPOSED_HEADERS = (REQUEST_ID_HEADER, HOLES_HEADER, "Retry-After")
NOSNIFF = (b"x-content-type-options", b"nosniff")
ACCESS_LOG_FORMATS = ("off", "text", "json")
# A client's ID is echoed only when it is a plain token: no header or log injection.
_VALID_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("gantool_request_id", default=None)


def request_id_from(given: bytes | None) -> str:
    """The client's ``X-Request-ID`` when it is a plain token of at most 128 characters, else a new one."""
    if given is not None:
        text = given.decode("latin-1").strip()
        if _VALID_ID.fullmatch(text):
            return text
    return secrets.token_hex(16)


def header_value(raw_headers: bytes, name: bytes) -> bytes | None:
    """A header's value from raw request bytes (for answers sent before the headers are parsed)."""
    match = re.search(rb"\r\n" + re.escape(name) + rb"[ \t]*:[ \t]*([^\r\n]*)", raw_headers, re.IGNORECASE)
    return match.group(1).strip() if match else None


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
DEFAULT_PORTS = {"http": "80", "https": "443"}


def origin_key(origin: str) -> tuple[str, str, str]:
    """(scheme, host, port) of an origin or of ``scheme://Host``, compared as browsers mean them:
    case-insensitive, a trailing slash ignored, default ports filled in, and the loopback names
    (``localhost``, ``127.0.0.1``, ``[::1]``) one host: a page at ``http://localhost:8000`` posting to
    ``127.0.0.1:8000`` is this server's own page."""
    scheme, _, rest = origin.strip().rstrip("/").lower().partition("://")
    host = _host_name(rest)
    port = rest.rsplit(":", 1)[1] if rest.count(":") == 1 or rest.startswith("[") and "]:" in rest else ""
    if host in LOOPBACK_NAMES:
        host = "loopback"
    return scheme, host, port or DEFAULT_PORTS.get(scheme, "")


def _host_name(value: str) -> str:
    """``Host`` without its port: ``example.com:80`` -> ``example.com``, ``[::1]:8000`` -> ``::1``."""
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def cors_headers(origin: bytes | None, allowed: Iterable[str]) -> list[tuple[bytes, bytes]]:
    """The CORS headers of an answer to a page at ``origin``, when it is an allowed one."""
    if origin is None or origin_key(origin.decode("latin-1")) not in {origin_key(o) for o in allowed}:
        return []
    return [
        (b"access-control-allow-origin", origin),
        (b"access-control-expose-headers", ", ".join(EXPOSED_HEADERS).encode()),
        (b"vary", b"Origin"),
    ]


def common_headers(
    present: Iterable[tuple[bytes, bytes]], request_id: str, origin: bytes | None, allowed: Iterable[str]
) -> list[tuple[bytes, bytes]]:
    """The headers to add to an answer that has ``present``: those it lacks of the common set."""
    have = {name.lower() for name, _ in present}
    extra = [NOSNIFF, (b"x-request-id", request_id.encode())]
    extra += cors_headers(origin, allowed)
    return [(name, value) for name, value in extra if name not in have]


class RequestIdFilter(logging.Filter):
    """Prefixes a record logged while a request runs with ``[request ID]``."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = request_id_var.get()
        if rid is not None and not getattr(record, "_gantool_rid", False):
            record.msg = f"[request {rid}] {record.msg}"
            record._gantool_rid = True
        return True


def install_request_id_filter(logger_name: str = "gantool") -> None:
    """Name the request in every gantool log line written on its behalf (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RequestIdFilter) for f in logger.filters):
        logger.addFilter(RequestIdFilter())
    for handler in logging.getLogger().handlers:  # records of child loggers pass the root's handlers only
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())


@dataclass
class AccessRecord:
    """One request, as the access log writes it."""

    request_id: str
    method: str
    path: str
    client: str
    started: float = field(default_factory=time.perf_counter)
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    holes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "client": self.client,
            "status": self.status,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "holes": self.holes,
            "ms": round((time.perf_counter() - self.started) * 1000, 1),
        }


class AccessLog:
    """``--access-log text|json``: one line per request on ``stream`` (stderr by default)."""

    def __init__(self, fmt: str = "off", stream: TextIO | None = None) -> None:
        self.fmt = fmt
        self.stream = stream

    @property
    def enabled(self) -> bool:
        return self.fmt != "off"

    def write(self, record: AccessRecord) -> None:
        if not self.enabled:
            return
        data = record.as_dict()
        if self.fmt == "json":
            line = json.dumps(data)
        else:
            holes = "" if data["holes"] is None else f" holes={data['holes']}"
            line = (
                f"{data['client']} {data['method']} {data['path']} {data['status']} in={data['bytes_in']} "
                f"out={data['bytes_out']}{holes} {data['ms']}ms id={data['request_id']}"
            )
        stream = self.stream or sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed stream never fails a request
            pass

"""Running the app: the listening socket, the HTTP protocol's limits, shutdown on signals.

- :func:`bind_socket` makes the listening socket (port 0 picks a free one);
- the protocol (uvicorn's h11 one, subclassed) sets ``TCP_NODELAY`` on every accepted
  connection (keep-alive requests would otherwise wait ~40 ms on Nagle + delayed ACK),
  refuses headers over ``--max-header-kb`` with 431, drops a client whose request
  headers do not arrive within ``--read-timeout`` (408), and answers malformed
  requests with JSON;
- :class:`GantoolServer`: the first SIGINT/SIGTERM stops accepting, answers queued and
  still-uploading requests with 503, gives running ones ``--shutdown-timeout``, and
  :func:`run_server` returns the signal; a second signal exits at once (one line).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Generator
from http import HTTPStatus
from types import FrameType
from typing import Any, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from gantool.core.errors import InputError
from gantool.core.signals import STOP_SIGNALS, handlers_installed
from gantool.serving.answers import common_headers, header_value, request_id_from
from gantool.serving.limits import error_body
from gantool.serving.settings import ServeSettings


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


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """``TCP_NODELAY`` on a connection's socket (asyncio sets it only on sockets it made)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with a header-size limit, a header deadline and TCP_NODELAY."""

    max_header_bytes = 64 * 1024
    header_timeout = 30.0
    cors_origins: tuple[str, ...] = ()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self.conn.trailing_data[0]:  # a request had started: say why it is dropped
                self.reply_and_close(408, f"the request headers did not arrive within {self.header_timeout:g} s")
            else:  # an idle connection that never sent anything: just close it
                self.transport.close()

    def reply_and_close(self, status: int, message: str, raw: bytes = b"") -> None:
        """A JSON answer written straight to the connection, which then closes; it carries the
        common headers too (the request ID and CORS read from ``raw``, the bytes received)."""
        body = error_body(message)
        present = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        present.append((b"connection", b"close"))
        raw = b"\r\n" + (raw or self.conn.trailing_data[0])
        request_id = request_id_from(header_value(raw, b"x-request-id"))
        extra = common_headers(present, request_id, header_value(raw, b"origin"), self.cors_origins)
        lines = "".join(f"{k.decode()}: {v.decode('latin-1')}\r\n" for k, v in [*present, *extra])
        head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n{lines}\r\n"
        self.transport.write(head.encode("latin-1") + body)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # reading a request line and headers
            buffered = self.conn.trailing_data[0] + data
            end = buffered.find(b"\r\n\r\n")
            if (end < 0 and len(buffered) > self.max_header_bytes) or end > self.max_header_bytes:
                self._disarm()
                self.reply_and_close(431, f"the request headers are over {self.max_header_bytes // 1024} KB", buffered)
                return
            self._arm()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _unsupported_upgrade_warning(self) -> None:
        # An Upgrade (WebSocket, h2c) is answered as plain HTTP; uvicorn's warning about a missing
        # WebSocket library at every attempt would only fill the log (gantool serves no WebSocket).
        pass

    def send_400_response(self, msg: str) -> None:
        self.reply_and_close(400, "malformed HTTP request (headers, or a body longer than its Content-Length)")


def protocol_for(settings: ServeSettings) -> type[GuardedProtocol]:
    """:class:`GuardedProtocol` with the server's limits."""
    return type(
        "GantoolProtocol",
        (GuardedProtocol,),
        {
            "max_header_bytes": settings.max_header_bytes,
            "header_timeout": settings.read_timeout,
            "cors_origins": settings.cors_origins,
        },  # fmt: skip
    )


class _ShutdownCutOff(logging.Filter):
    """uvicorn logs ``ERROR: Cancel N running task(s)`` when --shutdown-timeout ends running requests,
    which is the designed shutdown (they are answered 503): say so as a warning, in gantool's words."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Cancel %s running task(s)"):
            record.msg = "shutdown: %s running request(s) answered 503 at the end of --shutdown-timeout"
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _install_shutdown_filter() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ShutdownCutOff) for f in logger.filters):
        logger.addFilter(_ShutdownCutOff())


class GantoolServer(uvicorn.Server):
    """uvicorn's server with gantool's signals: see the module docstring."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None], notify: Callable[[str], None]) -> None:
        super().__init__(config)
        _install_shutdown_filter()
        self.on_stop = on_stop
        self.notify = notify
        self.signal_received: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # After a signal the handlers stay: a second one, even while the process winds
        # down, exits at once (never a KeyboardInterrupt traceback).
        with handlers_installed(
            dict.fromkeys(STOP_SIGNALS, self.handle_exit), restore=lambda: self.signal_received is None
        ):
            yield
        # uvicorn re-raises the signal here (a KeyboardInterrupt for SIGINT): run_server returns it instead.

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.signal_received is not None:  # the second one: exit now, with one line
            with contextlib.suppress(Exception):
                sys.stderr.write(f"gantool serve: {signal.Signals(sig).name} again, exiting now\n")
                sys.stderr.flush()
            os._exit(128 + sig)
        self.signal_received = sig
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_stop()  # queued and uploading requests get 503 now
        if self.signal_received is not None:
            self.notify(
                f"{signal.Signals(self.signal_received).name}: stopping; running requests get up to "
                f"{self.config.timeout_graceful_shutdown:g} s (press Ctrl-C again to exit now)"
            )
        await super().shutdown(sockets)


def make_server(
    app: Any, settings: ServeSettings | None = None, notify: Callable[[str], None] | None = None
) -> GantoolServer:
    """The server for ``app`` (from :func:`gantool.serving.app.build_app`) with its limits."""
    settings = settings or getattr(app.state, "settings", None) or ServeSettings()
    config = uvicorn.Config(
        app,
        http=protocol_for(settings),
        # gantool serves no WebSocket: an Upgrade is answered as plain HTTP even where a WebSocket
        # library is installed (uvicorn[standard], which ray[serve] brings, has websockets).
        ws="none",
        log_level="warning",
        access_log=False,
        lifespan="on",
        # A float works (asyncio.wait_for): 0.5 s is 0.5 s, not rounded up to 1 s as int() would.
        timeout_graceful_shutdown=cast(int, settings.shutdown_timeout),
        h11_max_incomplete_event_size=2 * settings.max_header_bytes,  # a backstop behind the 431
    )
    return GantoolServer(config, getattr(app.state, "begin_shutdown", lambda: None), notify or (lambda _: None))


def run_server(
    app: Any,
    sock: socket.socket,
    settings: ServeSettings | None = None,
    notify: Callable[[str], None] | None = None,
) -> int | None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM; returns that signal's number
    (None if it stopped otherwise). ``notify`` gets the one line said at the first signal."""
    server = make_server(app, settings, notify)
    server.run(sockets=[sock])
    return server.signal_received

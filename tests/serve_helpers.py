"""Shared by the serve tests (test_serve.py, test_serve_hostile.py, test_serve_browser.py):
encoded images, a real uvicorn server on a free loopback port (in a thread or as
`gantool serve`), raw HTTP clients, and the model fixtures with a gated backend.

A test module that uses the ``inpainter`` or ``gated`` fixtures imports them by name, beside
``exported_model`` (from inpaint_helpers), which ``inpainter`` depends on."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from PIL import Image

from gantool import Inpainter

URL_LINE = re.compile(r"serving on (http://\S+?)/ ")


class GatedBackend:
    """The real backend, with a gate the test opens, and a record of each run."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batch_sizes: list[int] = []
        self.threads: set[str] = set()
        self.fail_with: Exception | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, image: np.ndarray, mask: np.ndarray, release_memory_pixels: int = 0) -> np.ndarray:
        self.threads.add(threading.current_thread().name)
        self.batch_sizes.append(image.shape[0])
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        if self.fail_with is not None:
            raise self.fail_with
        return self.inner.run(image, mask, release_memory_pixels)


@pytest.fixture(scope="module")
def inpainter(exported_model: Any) -> Inpainter:
    """The exported tiny model on ONNX Runtime's CPU provider, shared by a test module."""
    return Inpainter(exported_model.folder, "cpu", "onnx")


@pytest.fixture
def gated(inpainter: Inpainter) -> Iterator[GatedBackend]:
    """``inpainter`` with its backend behind a GatedBackend for one test; put back after it."""
    original = inpainter.backend
    backend = GatedBackend(original)
    inpainter.backend = backend  # type: ignore[assignment]
    try:
        yield backend
    finally:
        backend.gate.set()
        inpainter.backend = original


def encode(image: Image.Image | np.ndarray, fmt: str = "PNG", **options: Any) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def decode(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        return img.copy()


def get_json(url: str, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_ready(base_url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if get_json(base_url + "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base_url} was not ready within {timeout} s")


@contextmanager
def running_server(app: Any) -> Iterator[tuple[str, Any]]:
    """Run ``app`` with gantool's server on a free 127.0.0.1 port in a thread; yields (URL, server)."""
    from gantool.serving.server import bind_socket, make_server, url_of

    sock = bind_socket("127.0.0.1", 0)
    server = make_server(app)  # the real protocol: header limits, deadlines, TCP_NODELAY
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield url_of(sock), server
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Run ``app`` on a free 127.0.0.1 port in a thread; yields its URL."""
    with running_server(app) as (url, _):
        yield url


def raw_connect(url: str, timeout: float = 10.0) -> socket.socket:
    """A plain TCP connection to the server at ``url`` (for slow and malformed clients)."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    sock = socket.create_connection((host, port), timeout=timeout)
    return sock


_LEFTOVER: dict[int, bytes] = {}  # bytes read past one response, by socket id (pipelined answers)


def read_response(sock: socket.socket, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response from ``sock`` (status, lower-case headers, body by Content-Length)."""
    sock.settimeout(timeout)
    data = _LEFTOVER.pop(id(sock), b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    _LEFTOVER[id(sock)] = body[length:]
    return status, headers, body[:length]


def multipart(fields: list[tuple[str, str | None, bytes]], boundary: str = "gantoolboundary") -> tuple[bytes, str]:
    """A multipart/form-data body from (name, filename or None for a text field, bytes)."""
    parts = []
    for name, filename, data in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@contextmanager
def serve_process(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> Iterator[tuple[str, list[str], subprocess.Popen[str]]]:
    """``gantool serve ARGS --port 0`` as a subprocess; yields (URL, its stdout lines so far,
    the process). It is terminated on exit; its stderr can be read after that."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gantool", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            match = URL_LINE.search(line)
            if match:
                url = match.group(1)
                break
        else:
            stderr = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"gantool serve printed no URL: {lines} {stderr}")
        yield url, lines, process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

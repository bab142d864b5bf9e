"""Shared by test_serve.py and test_serve_browser.py: encoded images, a real
uvicorn server on a free loopback port (in a thread or as `gantool serve`)."""

from __future__ import annotations

import io
import json
import re
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

import numpy as np
from PIL import Image

URL_LINE = re.compile(r"serving on (http://\S+?)/ ")


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
def live_server(app: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields its URL."""
    from gantool.serving.server import bind_socket, make_server, url_of

    sock = bind_socket("127.0.0.1", 0)
    server = make_server(app)  # the real protocol: header limits, deadlines, TCP_NODELAY
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


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

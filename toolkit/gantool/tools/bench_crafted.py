"""`gantool bench serve --crafted`: what small crafted uploads cost a real server before it answers.

Each case is an upload of under 100 kB whose pixels or holes are many (a 1-bit PNG of 6000 x 6000
is a few kB): a mask whose size cannot match its image, a full-image request over
``--max-model-pixels``, a mask of thousands of holes, a WebP answer too wide for WebP, a header
over ``--max-pixels``, a PNG whose header promises more rows than it holds. Every case is sent on
a new connection to every server given (``--url``, repeatable: say an older build beside this one),
round by round, so the servers see the same load; reported per server and case: the status, the
upload's size and the median [min-max] milliseconds. The goal: no refused upload under 100 kB costs
more than 0.5 s.
"""

from __future__ import annotations

import http.client
import io
import statistics
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from gantool.core.errors import InputError
from gantool.tools.bench_serve import _ServerProcess, _wait_ready

CRAFTED_GOAL_MS = 500.0
CRAFTED_MAX_BYTES = 100_000
BOUNDARY = "gantoolcrafted"


def _png(width: int, height: int, mode: str = "1", value: int = 0, dots: int = 0) -> bytes:
    from PIL import Image

    if dots:  # dots x dots separate one-pixel holes on a grid, 4 px apart
        pixels = np.zeros((height, width), np.uint8)
        pixels[: dots * 4 : 4, : dots * 4 : 4] = 255
        image = Image.fromarray(pixels).convert("1")
    else:
        image = Image.new(mode, (width, height), value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _short_png(width: int, height: int, rows: int) -> bytes:
    """An 8-bit RGB PNG whose header says ``height`` rows and whose data holds ``rows``."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\x80" * (3 * width) for _ in range(rows))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _form(files: dict[str, bytes], texts: dict[str, str] | None = None) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.png"\r\n'
        "Content-Type: image/png\r\n\r\n".encode()
        + data
        + b"\r\n"
        for name, data in files.items()
    ]
    parts += [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in (texts or {}).items()
    ]
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def _rgb_png(width: int, height: int) -> bytes:
    return _png(width, height, "RGB", 0)


def crafted_cases() -> dict[str, Callable[[], bytes]]:
    """The uploads, by name (each under CRAFTED_MAX_BYTES)."""
    return {
        "mask 6000x6000 (1-bit) for an image of 128x96": lambda: _form(
            {"image": _rgb_png(128, 96), "mask": _png(6000, 6000)}
        ),
        "image and mask 6000x6000 (1-bit), strategy=full": lambda: _form(
            {"image": _png(6000, 6000), "mask": _png(6000, 6000, value=1)}, {"strategy": "full"}
        ),
        "mask of 250,000 one-pixel holes (2000x2000, 1-bit)": lambda: _form(
            {"image": _png(2000, 2000, "L"), "mask": _png(2000, 2000, dots=500)}
        ),
        "image 20000x1, format=webp": lambda: _form(
            {"image": _rgb_png(20000, 1), "mask": _png(20000, 1, value=1)}, {"format": "webp"}
        ),
        "image header 10000x10000 (over --max-pixels)": lambda: _form(
            {"image": _png(10000, 10000), "mask": _png(10000, 10000)}
        ),
        "PNG header 1x200000, 4 rows of data": lambda: _form(
            {"image": _short_png(1, 200000, 4), "mask": _png(1, 200000, value=1)}
        ),
    }


def bench_serve_crafted(
    urls: list[str] | None = None,
    model: str | None = None,
    rounds: int = 5,
    provider: str = "auto",
    backend: str = "auto",
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """See the module docstring. Without ``urls`` a `gantool serve` of this build is started."""
    if rounds < 1:
        raise InputError("--rounds must be at least 1")
    deadline = time.monotonic() + timeout_s
    cases = {name: make() for name, make in crafted_cases().items()}
    for name, body in cases.items():
        assert len(body) < CRAFTED_MAX_BYTES, (name, len(body))
    server = None
    if not urls:
        args = ["--provider", provider, "--backend", backend, *(["--model", model] if model else [])]
        server = _ServerProcess(args, max(1.0, deadline - time.monotonic()))
        assert server.url is not None
        urls = [server.url]
    try:
        for url in urls:
            _wait_ready(url, deadline)
        times: dict[tuple[str, str], list[float]] = {(u, c): [] for u in urls for c in cases}
        statuses: dict[tuple[str, str], set[int]] = {(u, c): set() for u in urls for c in cases}
        for _ in range(rounds):
            for case, body in cases.items():
                for url in urls:  # interleaved: every server gets each case in the same round
                    if time.monotonic() > deadline:
                        raise InputError(f"the crafted-upload benchmark ran past {timeout_s:g} s")
                    status, seconds = _post(url, body, deadline - time.monotonic())
                    times[url, case].append(seconds * 1000)
                    statuses[url, case].add(status)
    finally:
        if server is not None:
            server.stop()
    rows: list[dict[str, Any]] = [
        {
            "server": url,
            "case": case,
            "bytes": len(cases[case]),
            "status": "/".join(str(s) for s in sorted(statuses[url, case])),
            "median_ms": statistics.median(times[url, case]),
            "min_ms": min(times[url, case]),
            "max_ms": max(times[url, case]),
        }
        for url in urls
        for case in cases
    ]
    refused = [r for r in rows if r["server"] == urls[-1] and not r["status"].startswith("2")]
    worst = max((float(r["median_ms"]) for r in refused), default=0.0)
    return {
        "rounds": rounds,
        "rows": rows,
        "goal": {"max_refused_median_ms": CRAFTED_GOAL_MS, "measured": worst, "met": worst <= CRAFTED_GOAL_MS},
    }


def _post(url: str, body: bytes, timeout: float) -> tuple[int, float]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=max(1.0, timeout))
    try:
        start = time.perf_counter()
        connection.request(
            "POST", "/v1/inpaint", body=body, headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
        )
        response = connection.getresponse()
        response.read()
        return response.status, time.perf_counter() - start
    finally:
        connection.close()

"""`gantool bench serve --hostile`: a real `gantool serve` while slow clients trickle.

Rounds alternate, normal then hostile (A, B, A, B): in a hostile round ``trickling``
raw connections each declare a large body and send one byte a second (reconnecting
when the server drops them), while ``concurrency`` normal keep-alive clients send
``requests`` inpaint requests. Reported: each pair's throughput ratio (median and
range), errors, p99 latency, keep-alive ``/healthz`` latency, the time to answer (or
refuse) a request with ``many_holes`` holes against the same image with one hole,
and the server's peak RSS.
"""

from __future__ import annotations

import http.client
import os
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from gantool.core.errors import InputError
from gantool.tools.bench_serve import _multipart, _png, _process_rss_mb, _serve_inputs, _ServerProcess, _wait_ready

HOSTILE_GOAL_RATIO = 0.8
HEALTHZ_GOAL_MS = 2.0
HOLES_GOAL_RATIO = 2.0
REFUSE_GOAL_MS = 100.0


def _process_peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _holes_side(size: int, holes: int) -> int:
    """An image side that fits ``holes`` separate 2 x 2 holes 4 px apart (at least ``size``)."""
    return max(size, 4 * int(np.ceil(np.sqrt(holes))) + 8)


def _dotted_mask(side: int, holes: int) -> np.ndarray:
    """``holes`` separate 2 x 2 holes on a grid (8-connected apart); ``side`` from :func:`_holes_side`."""
    mask = np.zeros((side, side), np.uint8)
    per_row = int(np.ceil(np.sqrt(holes)))
    step = side // (per_row + 1)
    for index in range(holes):
        row, col = divmod(index, per_row)
        y, x = (row + 1) * step, (col + 1) * step
        mask[y : y + 2, x : x + 2] = 255
    return mask


# long: the interleaved A/B rounds, the keep-alive probe and the many-holes probe against one server process, in order
def bench_serve_hostile(
    model: str | Path | None = None,
    requests: int = 100,
    concurrency: int = 4,
    size: int = 256,
    trickling: int = 16,
    rounds: int = 2,
    many_holes: int = 1000,
    provider: str = "auto",
    backend: str = "auto",
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """See the module docstring. Every loop is bounded by count and by ``timeout_s``."""
    if min(requests, concurrency, rounds, many_holes) < 1 or trickling < 0:
        raise InputError("--requests, --concurrency, --rounds must be at least 1, --trickling >= 0")
    deadline = time.monotonic() + timeout_s
    boundary = "gantoolbench"
    bodies = [_multipart(_png(rgb), _png(mask), boundary) for rgb, mask in _serve_inputs(size, 4)]
    kind = f"multipart/form-data; boundary={boundary}"
    args = ["--provider", provider, "--backend", backend, "--max-queue", str(max(16, 2 * concurrency))]
    if model is not None:
        args += ["--model", str(model)]
    server = _ServerProcess(args, max(1.0, deadline - time.monotonic()))
    rows: list[dict[str, Any]] = []
    try:
        assert server.url is not None
        _wait_ready(server.url, deadline)
        pid = server.process.pid
        parts = urlsplit(server.url)
        host, port = parts.hostname or "127.0.0.1", int(parts.port or 80)

        def connect() -> http.client.HTTPConnection:
            return http.client.HTTPConnection(host, port, timeout=120)

        def post(connection: http.client.HTTPConnection, body: bytes) -> tuple[int, bytes]:
            connection.request("POST", "/v1/inpaint", body=body, headers={"Content-Type": kind})
            response = connection.getresponse()
            return response.status, response.read()

        def trickle(stop: threading.Event, sent: list[int]) -> None:
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    sock = socket.create_connection((host, port), timeout=5)
                except OSError:
                    stop.wait(0.1)
                    continue
                try:
                    head = f"POST /v1/inpaint HTTP/1.1\r\nHost: {host}\r\nContent-Type: {kind}\r\n"
                    sock.sendall(head.encode() + b"Content-Length: 1000000\r\n\r\n")
                    while not stop.wait(1.0):
                        sock.sendall(b"x")
                        sent[0] += 1
                except OSError:
                    pass  # dropped by the server (408): connect again
                finally:
                    sock.close()

        def one_round(hostile: bool) -> dict[str, Any]:
            stop = threading.Event()
            trickled = [0]
            slow = [threading.Thread(target=trickle, args=(stop, trickled)) for _ in range(trickling if hostile else 0)]
            for thread in slow:
                thread.start()
            time.sleep(1.0 if hostile else 0.0)  # let them connect first
            issued, latencies, errors = [0], [], []
            lock = threading.Lock()

            def client() -> None:
                connection = connect()
                while True:
                    with lock:
                        if issued[0] >= requests or time.monotonic() > deadline:
                            break
                        number = issued[0]
                        issued[0] += 1
                    began = time.perf_counter()
                    try:
                        status, data = post(connection, bodies[number % len(bodies)])
                        problem = None if status == 200 else f"HTTP {status}: {data[:120]!r}"
                    except (OSError, http.client.HTTPException) as e:
                        problem = f"{type(e).__name__}: {e}"
                        connection.close()
                        connection = connect()
                    with lock:
                        (errors.append(problem) if problem else latencies.append(time.perf_counter() - began))
                connection.close()

            threads = [threading.Thread(target=client) for _ in range(concurrency)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(max(1.0, deadline - time.monotonic() + 130))
            wall = time.perf_counter() - start
            stop.set()
            for thread in slow:
                thread.join(10)
            return {
                "hostile": hostile,
                "ok": len(latencies),
                "errors": len(errors),
                "error_examples": sorted(set(errors))[:3],
                "images_per_s": len(latencies) / wall,
                "p99_ms": float(np.percentile(np.asarray(latencies) * 1e3, 99)) if latencies else float("nan"),
                "trickled_bytes": trickled[0],
            }

        for _ in range(rounds):
            rows.append(one_round(False))
            rows.append(one_round(True))

        # Keep-alive /healthz: every request after the first on one connection.
        connection = connect()
        healthz_ms = []
        for number in range(201):
            began = time.perf_counter()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            if number:
                healthz_ms.append((time.perf_counter() - began) * 1e3)
        connection.close()

        # One hole against many_holes, interleaved.
        side = _holes_side(size, many_holes)
        rgb = _serve_inputs(side, 1)[0][0]
        one, many = _dotted_mask(side, 1), _dotted_mask(side, many_holes)
        timing: dict[str, list[float]] = {"one": [], "many": []}
        uploads = {
            "one": _multipart(_png(rgb), _png(one), boundary),
            "many": _multipart(_png(rgb), _png(many), boundary),
        }
        many_status = 0
        for _ in range(3):
            for name in ("one", "many"):
                connection = connect()
                began = time.perf_counter()
                status, _ = post(connection, uploads[name])
                timing[name].append(time.perf_counter() - began)
                connection.close()
                many_status = status if name == "many" else many_status
        rss_end, peak = _process_rss_mb(pid), _process_peak_rss_mb(pid)
    finally:
        server.stop()

    pairs = [rows[i + 1]["images_per_s"] / rows[i]["images_per_s"] for i in range(0, len(rows) - 1, 2)]
    hostile_errors = sum(row["errors"] for row in rows if row["hostile"])
    one_s, many_s = statistics.median(timing["one"]), statistics.median(timing["many"])
    refused = many_status != 200
    return {
        "benchmark": "serve-hostile",
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "size": size,
        "requests": requests,
        "concurrency": concurrency,
        "trickling": trickling,
        "per_round": rows,
        "ratio": statistics.median(pairs),
        "ratio_range": [min(pairs), max(pairs)],
        "healthz_keepalive_ms": {"median": statistics.median(healthz_ms), "p99": float(np.percentile(healthz_ms, 99))},
        "holes": {"count": many_holes, "side": side, "one_s": one_s, "many_s": many_s, "many_status": many_status},
        "rss_mb": {"after_all": rss_end, "peak": peak},
        "goals": {
            "hostile_throughput": {
                "goal": HOSTILE_GOAL_RATIO,
                "ratio": statistics.median(pairs),
                "errors": hostile_errors,
                "met": statistics.median(pairs) >= HOSTILE_GOAL_RATIO and hostile_errors == 0,
            },
            "healthz_keepalive": {
                "goal_ms": HEALTHZ_GOAL_MS,
                "met": statistics.median(healthz_ms) < HEALTHZ_GOAL_MS,
            },
            "many_holes": {
                "met": (many_s * 1e3 < REFUSE_GOAL_MS) if refused else many_s <= HOLES_GOAL_RATIO * one_s,
                "refused": refused,
            },
        },
    }

"""`gantool bench serve --holes N` and `--memory`: what the server's cost limits cost.

- :func:`bench_serve_holes`: against a real `gantool serve` with its default limits, one
  image with one hole and the same image with ``holes`` separate holes, interleaved round by
  round (one, many, many, one, ...), each on a new connection: end-to-end milliseconds and
  status, beside the in-process stages of the refusal path (mask decode, hole count, image
  decode) and what the planning of an accepted request would add.
- :func:`bench_serve_memory` (below): the largest requests the limits allow, per strategy,
  against the documented peak-memory bound.
"""

from __future__ import annotations

import http.client
import io
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from gantool.core.errors import InputError
from gantool.tools.bench_hostile import REFUSE_GOAL_MS, _dotted_mask, _holes_side
from gantool.tools.bench_serve import _multipart, _png, _serve_inputs, _ServerProcess, _wait_ready

BOUNDARY = "gantoolbench"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
HOLES_GOAL_RATIO = 2.0


def _spread(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in seconds]
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms)}


def _post(url: str, body: bytes, timeout: float = 600.0) -> tuple[int, bytes, float]:
    """One POST /v1/inpaint on a new connection: status, body, seconds."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", int(parts.port or 80), timeout=timeout)
    try:
        began = time.perf_counter()
        connection.request("POST", "/v1/inpaint", body=body, headers={"Content-Type": CONTENT_TYPE})
        response = connection.getresponse()
        data = response.read()
        return response.status, data, time.perf_counter() - began
    finally:
        connection.close()


def _stages(image_png: bytes, mask_png: bytes, train_size: int, size_multiple: int) -> dict[str, Callable[[], Any]]:
    """The refusal path's steps in-process, as :func:`gantool.serving.app.decode_request` runs them."""
    from gantool.core.mask_input import mask_to_array
    from gantool.core.processing import blend_pixels, read_image
    from gantool.inference.cost import count_holes
    from gantool.inference.inpainter import plan_windows

    mask = mask_to_array(read_image(io.BytesIO(mask_png)))
    return {
        "mask decode": lambda: mask_to_array(read_image(io.BytesIO(mask_png), max_pixels=2**31)),
        "hole count": lambda: count_holes(mask),
        "image decode (skipped when refused)": lambda: read_image(io.BytesIO(image_png), lossless=True),
        "window planning (accepted only)": lambda: plan_windows(mask, "auto", train_size),
        "blend regions (accepted only)": lambda: blend_pixels(mask > 0.5),
    }


# long: one server, the interleaved rounds of end-to-end requests and in-process stages, read in the order they run
def bench_serve_holes(
    model: str | Path | None = None,
    size: int = 1024,
    holes: int = 1000,
    rounds: int = 5,
    provider: str = "auto",
    backend: str = "auto",
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """See the module docstring. The many-holes mask has ``holes`` separate 2 x 2 holes on a
    grid over a ``size`` x ``size`` image (larger if they do not fit); the one-hole mask
    the first of them."""
    if min(size, holes, rounds) < 1:
        raise InputError("--size, --holes and --rounds must be at least 1")
    deadline = time.monotonic() + timeout_s
    side = _holes_side(size, holes)
    rgb = _serve_inputs(side, 1)[0][0]
    image_png = _png(rgb)
    masks = {"one": _png(_dotted_mask(side, 1)), "many": _png(_dotted_mask(side, holes))}
    uploads = {name: _multipart(image_png, mask, BOUNDARY) for name, mask in masks.items()}
    args = ["--provider", provider, "--backend", backend]
    if model is not None:
        args += ["--model", str(model)]
    load_before = os.getloadavg()
    server = _ServerProcess(args, max(1.0, deadline - time.monotonic()))
    times: dict[str, list[float]] = {"one": [], "many": []}
    statuses: dict[str, set[int]] = {"one": set(), "many": set()}
    answer = ""
    try:
        assert server.url is not None
        _wait_ready(server.url, deadline)
        import json
        import urllib.request

        with urllib.request.urlopen(server.url + "/v1/model", timeout=30) as response:
            info = json.load(response)
        stages = _stages(image_png, masks["many"], info["train_size"], info["size_multiple"])
        stage_times: dict[str, list[float]] = {name: [] for name in stages}
        _post(server.url, uploads["one"])  # warm-up: the first request pays for imports and arenas
        _post(server.url, uploads["many"])
        for number in range(rounds):
            if time.monotonic() > deadline:
                break
            order = ("one", "many") if number % 2 == 0 else ("many", "one")
            for name in order:
                status, data, seconds = _post(server.url, uploads[name])
                times[name].append(seconds)
                statuses[name].add(status)
                if name == "many" and status != 200:
                    answer = data.decode(errors="replace")[:200]
            for name, step in stages.items():
                began = time.perf_counter()
                step()
                stage_times[name].append(time.perf_counter() - began)
    finally:
        server.stop()
    if not times["many"]:
        raise InputError("no round finished inside --timeout")
    one, many = _spread(times["one"]), _spread(times["many"])
    refused = statuses["many"] != {200}
    met = many["median"] < REFUSE_GOAL_MS if refused else many["median"] <= HOLES_GOAL_RATIO * one["median"]
    return {
        "benchmark": "serve-holes",
        "model": info["model"],
        "backend": info["backend"],
        "provider": info["provider"],
        "cpu_count": os.cpu_count(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "side": side,
        "holes": holes,
        "rounds": len(times["many"]),
        "upload_bytes": {name: len(body) for name, body in uploads.items()},
        "one_ms": one,
        "many_ms": many,
        "statuses": {name: sorted(codes) for name, codes in statuses.items()},
        "many_answer": answer,
        "stages_ms": {name: _spread(values) for name, values in stage_times.items()},
        "goal": {"refuse_ms": REFUSE_GOAL_MS, "ratio": HOLES_GOAL_RATIO, "refused": refused, "met": met},
    }

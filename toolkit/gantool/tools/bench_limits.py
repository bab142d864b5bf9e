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


# ------------------------------------------------------------------------------ --memory


def _largest_requests(
    strategy: str, info: dict[str, Any], max_pixels: int, max_model_pixels: int
) -> tuple[int, np.ndarray]:
    """The largest request the limits allow for ``strategy``: (image side, hole mask).

    ``full``: the largest square whose padded pixels fit ``--max-model-pixels`` (and
    ``--max-pixels``), a centred hole of half its side. ``resize``: the largest square
    under ``--max-pixels`` with the same hole. ``crop``: the largest square under
    ``--max-pixels`` with separate holes, each its own window, as many as the model-pixel
    and hole limits allow (counted by the server's own estimate)."""
    from gantool.inference.cost import estimate_cost

    multiple, train = int(info["size_multiple"]), int(info["train_size"])
    limits = info["limits"]
    if strategy == "full":
        side = int(np.sqrt(min(max_pixels, max_model_pixels))) // multiple * multiple
    else:
        side = int(np.sqrt(max_pixels))
    mask = np.zeros((side, side), np.float32)
    if strategy != "crop":
        mask[side // 4 : side // 4 + side // 2, side // 4 : side // 4 + side // 2] = 1
        return side, mask
    step = train + 2 * multiple  # windows (about train size square) that do not overlap
    spots = [(y, x) for y in range(step // 2, side - 2, step) for x in range(step // 2, side - 2, step)]
    spots = spots[: int(limits["max_holes"])]
    while spots:
        mask[:] = 0
        for y, x in spots:
            mask[y : y + 2, x : x + 2] = 1
        cost = estimate_cost(mask, "crop", train, multiple)
        if cost.model_pixels <= max_model_pixels:
            return side, mask
        spots = spots[: max(1, int(len(spots) * max_model_pixels / cost.model_pixels))] if len(spots) > 1 else []
    raise InputError(f"no crop request fits --max-model-pixels {max_model_pixels}")


# long: per strategy one fresh server, its largest requests from every slot at once, then /proc's peak, in order
def bench_serve_memory(
    model: str | Path | None = None,
    strategies: tuple[str, ...] = ("full", "crop", "resize"),
    max_queue: int = 4,
    max_pixels: int = 1_000_000,
    max_model_pixels: int = 1_020_000,
    max_upload_mb: float = 8.0,
    rounds: int = 2,
    provider: str = "auto",
    backend: str = "auto",
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """Peak server RSS (``VmHWM``) for ``rounds`` rounds of ``max_queue`` concurrent largest
    requests per strategy (blend none: the blend's cost is its own limit), each strategy on a
    fresh `gantool serve` with these limits, against :func:`gantool.inference.cost.serve_memory_bound`
    with the server's RSS when ready as the model-and-runtime term."""
    import threading

    from gantool.inference.cost import serve_memory_bound
    from gantool.tools.bench_hostile import _process_peak_rss_mb
    from gantool.tools.bench_serve import _process_rss_mb

    if min(max_queue, max_pixels, max_model_pixels, rounds) < 1 or max_upload_mb <= 0:
        raise InputError("the limits and --rounds must be positive")
    deadline = time.monotonic() + timeout_s
    rows = []
    load_before = os.getloadavg()
    for strategy in strategies:
        args = ["--provider", provider, "--backend", backend, "--max-queue", str(max_queue),
                "--max-pixels", str(max_pixels), "--max-model-pixels", str(max_model_pixels),
                "--max-upload-mb", f"{max_upload_mb:g}", "--max-batch", str(max_queue)]  # fmt: skip
        if model is not None:
            args += ["--model", str(model)]
        server = _ServerProcess(args, max(1.0, deadline - time.monotonic()))
        try:
            assert server.url is not None
            _wait_ready(server.url, deadline)
            import json
            import urllib.request

            with urllib.request.urlopen(server.url + "/v1/model", timeout=30) as response:
                info = json.load(response)
            pid = server.process.pid
            ready_mb = _process_rss_mb(pid) or 0.0
            side, mask = _largest_requests(strategy, info, max_pixels, max_model_pixels)
            body = _strategy_body(_png(_serve_inputs(side, 1)[0][0]), _png((mask * 255).astype(np.uint8)), strategy)
            if len(body) > max_upload_mb * 2**20:
                raise InputError(f"the {side} px upload is over --max-upload-mb {max_upload_mb:g}")
            statuses: list[int] = []
            lock = threading.Lock()

            def client() -> None:
                for _ in range(rounds):
                    if time.monotonic() > deadline:
                        return
                    status, _, _ = _post(server.url or "", body)
                    with lock:
                        statuses.append(status)

            threads = [threading.Thread(target=client) for _ in range(max_queue)]
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(max(1.0, deadline - time.monotonic() + 60))
            wall = time.perf_counter() - began
            time.sleep(2.0)  # the answers' background heap trims
            peak_mb, after_mb = _process_peak_rss_mb(pid), _process_rss_mb(pid)
        finally:
            server.stop()
        from gantool.inference.cost import estimate_cost

        cost = estimate_cost(mask, strategy, int(info["train_size"]), int(info["size_multiple"]))
        bound = serve_memory_bound(
            int(ready_mb * 2**20), max_queue, int(max_upload_mb * 2**20), max_pixels, max_model_pixels
        )
        rows.append({
            "strategy": strategy, "side": side, "holes": cost.holes, "windows": cost.windows,
            "model_pixels": cost.model_pixels, "upload_bytes": len(body), "requests": len(statuses),
            "ok": statuses.count(200), "statuses": sorted(set(statuses)), "seconds": wall,
            "ready_mb": ready_mb, "peak_mb": peak_mb, "after_mb": after_mb,
            "bound_mb": {k: v / 2**20 for k, v in bound.items()},
            "within": peak_mb is not None and peak_mb * 2**20 <= bound["total"],
        })  # fmt: skip
    return {
        "benchmark": "serve-memory",
        "model": info["model"],
        "backend": info["backend"],
        "provider": info["provider"],
        "cpu_count": os.cpu_count(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "limits": {
            "max_queue": max_queue,
            "max_pixels": max_pixels,
            "max_model_pixels": max_model_pixels,
            "max_upload_mb": max_upload_mb,
        },  # fmt: skip
        "rounds": rounds,
        "per_strategy": rows,
        "met": all(row["within"] and row["ok"] == row["requests"] for row in rows),
    }


def _strategy_body(image: bytes, mask: bytes, strategy: str) -> bytes:
    """The multipart upload of :func:`gantool.tools.bench_serve._multipart` plus strategy and blend=none."""
    extra = "".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in (("strategy", strategy), ("blend", "none"))
    )
    body = _multipart(image, mask, BOUNDARY)
    closing = f"--{BOUNDARY}--\r\n".encode()
    return body[: -len(closing)] + extra.encode() + closing

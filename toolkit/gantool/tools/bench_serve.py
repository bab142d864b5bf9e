"""`gantool bench serve`: a real `gantool serve` process on a loopback port under
concurrent keep-alive clients, against the in-process ``Inpainter`` on the same images."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.errors import GantoolError, InputError

# -------------------------------------------------------------------------- bench serve

SERVE_GOAL_RATIO = 0.85
SERVE_GOAL_RSS_GROWTH = 0.10


def _process_rss_mb(pid: int) -> float | None:
    """Resident memory of another process (Linux /proc), None elsewhere."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _serve_inputs(size: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` distinct smooth-plus-noise RGB images with a centred square hole (size / 4)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    hole = np.zeros((size, size), np.uint8)
    lo, hi = size * 3 // 8, size * 5 // 8
    hole[lo:hi, lo:hi] = 255
    items = []
    for seed in range(count):
        rng = np.random.default_rng(seed)
        base = np.stack([x, y, 0.5 + 0.4 * np.sin(x * 20 + y * 13 + seed)], axis=2)
        rgb = np.clip(base * 200 + rng.integers(0, 50, (size, size, 3)), 0, 255).astype(np.uint8)
        items.append((rgb, hole))
    return items


def _png(array: np.ndarray) -> bytes:
    from io import BytesIO

    from PIL import Image

    buffer = BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def _multipart(image: bytes, mask: bytes, boundary: str) -> bytes:
    parts = []
    for name, data in (("image", image), ("mask", mask)):
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.png"\r\n'
            "Content-Type: image/png\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


class _ServerProcess:
    """``gantool serve --port 0`` in a subprocess; its output is drained on a thread."""

    def __init__(self, args: list[str], timeout_s: float) -> None:
        import subprocess
        import threading

        import gantool

        env = dict(os.environ)
        package_root = str(Path(gantool.__file__).resolve().parents[1])  # so `-m gantool` finds this gantool
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gantool", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.url: str | None = None
        found = threading.Event()

        def drain() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))
                if self.url is None and line.startswith("serving on "):
                    self.url = line.split()[2].rstrip("/")
                    found.set()
            found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(timeout_s) or self.url is None:
            self.stop()
            from gantool.core.errors import GantoolError

            tail = " | ".join(self.lines[-3:]) or "no output"
            raise GantoolError(f"gantool serve did not start: {tail}")

    def stop(self) -> None:
        import subprocess

        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _wait_ready(url: str, deadline: float) -> None:
    import urllib.error
    import urllib.request

    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise GantoolError(f"{url} was not ready in time")


# long: one measurement; its rounds, client threads and in-process baselines are closures over one
# server process, one deadline and the shared counters, read top to bottom in the order they run.
def bench_serve(
    model: str | Path | None = None,
    requests: int = 200,
    concurrency: int = 8,
    size: int = 512,
    provider: str = "auto",
    backend: str = "auto",
    precision: str = "auto",
    max_batch: int | None = None,
    batch_wait_ms: float | None = None,
    baseline_images: int = 16,
    distinct_images: int = 8,
    timeout_s: float = 1800.0,
    rounds: int = 1,
) -> dict[str, Any]:
    """``gantool serve`` under load against the in-process :class:`gantool.Inpainter`.

    One server starts on a free loopback port; ``rounds`` times, ``concurrency``
    client threads (keep-alive connections) send ``requests`` POST /v1/inpaint
    of the same images (PNG, a centred size/4 hole). The in-process throughput
    (``baseline_images`` images, one ``Inpainter.inpaint`` call each) is measured
    before the first round, between rounds and after the last; each round is
    compared with the mean of the measurements on either side of it, so a change
    in machine load does not favour one side. Medians and ranges over the rounds
    are reported. The first answer for each image is checked (size, known
    pixels). Every loop is bounded by count and by ``timeout_s``.
    """
    import http.client
    import threading
    from io import BytesIO
    from urllib.parse import urlsplit

    from PIL import Image

    from gantool import Inpainter
    from gantool.core.constants import DEFAULT_SERVE_BATCH_WAIT_MS, DEFAULT_SERVE_MAX_BATCH

    if min(requests, concurrency, baseline_images, distinct_images, rounds) < 1:
        raise InputError("--requests, --concurrency, --baseline-images, --images and --rounds must be at least 1")
    if size < 8:
        raise InputError("--size must be at least 8")
    max_batch = max_batch or DEFAULT_SERVE_MAX_BATCH
    batch_wait_ms = DEFAULT_SERVE_BATCH_WAIT_MS if batch_wait_ms is None else batch_wait_ms
    deadline = time.monotonic() + timeout_s
    inputs = _serve_inputs(size, distinct_images)

    inpainter = Inpainter(model, provider, backend, precision=precision, batch_size=max_batch)
    masks = [(mask > 127).astype(np.float32) for _, mask in inputs]
    inpainter.inpaint(inputs[0][0], masks[0])  # warm-up

    def in_process_ips() -> float:
        start = time.perf_counter()
        for index in range(baseline_images):
            inpainter.inpaint(inputs[index % len(inputs)][0], masks[index % len(inputs)])
        return baseline_images / (time.perf_counter() - start)

    def with_codec_seconds() -> float:
        """The same, from PNG bytes to PNG bytes with the server's own decode/encode."""
        from gantool.serving.app import decode_request, encode_image  # the serve extra (FastAPI)

        start = time.perf_counter()
        for index in range(baseline_images):
            image_png, mask_png = pngs[index % len(pngs)]
            image, holes = decode_request(BytesIO(image_png), BytesIO(mask_png), [], size * size)
            encode_image(inpainter.inpaint(image, holes), "png")
        return time.perf_counter() - start

    pngs = [(_png(rgb), _png(mask)) for rgb, mask in inputs]
    codec_s = [with_codec_seconds()]
    model_name, backend_name, provider_name = str(inpainter.backend.path), inpainter.backend.name, inpainter.provider

    boundary = "gantoolbench"
    bodies = [_multipart(image_png, mask_png, boundary) for image_png, mask_png in pngs]
    args = [
        "--provider",
        provider,
        "--backend",
        backend,
        "--precision",
        precision,
        "--max-batch",
        str(max_batch),
        "--batch-wait-ms",
        str(batch_wait_ms),
        "--max-queue",
        str(max(16, 2 * concurrency)),
    ]
    if model is not None:
        args += ["--model", str(model)]
    baselines = [in_process_ips()]
    latencies: list[float] = []
    errors: list[str] = []
    checked: set[int] = set()
    lock = threading.Lock()
    state: dict[str, Any] = {"done": 0, "rss_at_50": None}
    round_rows: list[dict[str, Any]] = []
    server = _ServerProcess(args, max(1.0, deadline - time.monotonic()))
    try:
        assert server.url is not None
        _wait_ready(server.url, deadline)
        pid = server.process.pid
        rss_ready = _process_rss_mb(pid)
        parts = urlsplit(server.url)

        def check(index: int, data: bytes) -> str | None:
            rgb, mask = inputs[index]
            with Image.open(BytesIO(data)) as img:
                result = np.asarray(img.convert("RGB"))
            if result.shape != rgb.shape:
                return f"answer is {result.shape[1]}x{result.shape[0]}, not {size}x{size}"
            if not np.array_equal(result[mask <= 127], rgb[mask <= 127]):
                return "known pixels changed"
            return None

        def new_connection() -> http.client.HTTPConnection:
            return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=300)

        def one_round() -> dict[str, Any]:
            issued = {"next": 0}
            ok_before, errors_before = len(latencies), len(errors)

            def client() -> None:
                connection = new_connection()
                while True:
                    with lock:
                        number = issued["next"]
                        if number >= requests or time.monotonic() > deadline:
                            break
                        issued["next"] += 1
                    index = number % len(bodies)
                    began = time.perf_counter()
                    problem = None
                    try:
                        connection.request(
                            "POST",
                            "/v1/inpaint",
                            body=bodies[index],
                            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
                        )
                        response = connection.getresponse()
                        data = response.read()
                        if response.status != 200:
                            problem = f"HTTP {response.status}: {data[:200]!r}"
                    except (OSError, http.client.HTTPException) as e:
                        problem = f"{type(e).__name__}: {e}"
                        connection.close()
                        connection = new_connection()
                    elapsed = time.perf_counter() - began
                    with lock:
                        first_answer = problem is None and index not in checked
                        checked.add(index)
                    if first_answer:
                        problem = check(index, data)
                    with lock:
                        state["done"] += 1
                        if problem is None:
                            latencies.append(elapsed)
                        else:
                            errors.append(problem)
                        if state["done"] == min(50, requests):
                            state["rss_at_50"] = _process_rss_mb(pid)
                connection.close()

            threads = [threading.Thread(target=client, name=f"bench-client-{i}") for i in range(concurrency)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(max(1.0, deadline - time.monotonic() + 310))
            wall_s = time.perf_counter() - start
            ok = len(latencies) - ok_before
            return {
                "sent": issued["next"],
                "ok": ok,
                "errors": len(errors) - errors_before,
                "wall_s": wall_s,
                "images_per_s": ok / wall_s,
            }

        for _ in range(rounds):
            if time.monotonic() > deadline:
                break
            round_rows.append(one_round())
            baselines.append(in_process_ips())  # after this round, before the next
        rss_end = _process_rss_mb(pid)
    finally:
        server.stop()
    codec_s.append(with_codec_seconds())

    for number, row in enumerate(round_rows):
        row["in_process_images_per_s"] = statistics.mean(baselines[number : number + 2])
        row["ratio"] = row["images_per_s"] / row["in_process_images_per_s"]
    served = len(latencies)
    ms = np.asarray(latencies) * 1e3 if latencies else np.asarray([np.nan])

    def median_and_range(key: str) -> tuple[float, list[float]]:
        values = [row[key] for row in round_rows] or [0.0]
        return statistics.median(values), [min(values), max(values)]

    server_ips, server_range = median_and_range("images_per_s")
    in_process, in_process_range = median_and_range("in_process_images_per_s")
    ratio, ratio_range = median_and_range("ratio")
    codec_ips = baseline_images / statistics.mean(codec_s)
    rss_at_50 = state["rss_at_50"]
    rss_growth = (rss_end - rss_at_50) / rss_at_50 if rss_end is not None and rss_at_50 else None
    return {
        "benchmark": "serve",
        "model": model_name,
        "backend": backend_name,
        "provider": provider_name,
        "cpu_count": os.cpu_count(),
        "size": size,
        "requests": requests,
        "rounds": rounds,
        "sent": sum(row["sent"] for row in round_rows),
        "concurrency": concurrency,
        "max_batch": max_batch,
        "batch_wait_ms": batch_wait_ms,
        "ok": served,
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)),
            "p95": float(np.percentile(ms, 95)),
            "p99": float(np.percentile(ms, 99)),
        },
        "per_round": round_rows,
        # Medians over the rounds, and their min-max.
        "server_images_per_s": server_ips,
        "server_images_per_s_range": server_range,
        "in_process_images_per_s": in_process,
        "in_process_images_per_s_range": in_process_range,
        "in_process_images": baseline_images,
        "in_process_measurements": baselines,
        "ratio": ratio,
        "ratio_range": ratio_range,
        # PNG bytes in and out, as the server does: what HTTP and batching alone cost.
        "in_process_png_images_per_s": codec_ips,
        "ratio_to_png_in_process": server_ips / codec_ips if codec_ips > 0 else 0.0,
        "rss_mb": {"ready": rss_ready, "after_50": rss_at_50, "after_all": rss_end},
        "goals": {
            "throughput": {
                "goal": SERVE_GOAL_RATIO,
                "ratio": ratio,
                "errors": len(errors),
                "met": ratio >= SERVE_GOAL_RATIO and not errors and served == requests * rounds,
            },
            "rss_stable": {
                "goal": SERVE_GOAL_RSS_GROWTH,
                "growth": rss_growth,
                "met": rss_growth is not None and rss_growth <= SERVE_GOAL_RSS_GROWTH,
            },
        },
    }

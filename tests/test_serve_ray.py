"""``gantool serve --ray`` (issue #41): the same service on Ray Serve, on real local Ray
instances and real HTTP on loopback ports.

Each server is a `gantool serve --ray` process with a Ray instance of its own (so nothing here
touches the in-process cluster of tests/test_ray_inpaint.py, nor anyone else's): one shared by
the module (two replicas of the tiny model), and in the slow tier one per signal test, a
two-node ``ray.cluster_utils.Cluster``, and Ray's own ``serve run`` on a written config file.
Every Ray process a test starts is found by its parent chain and checked gone (or killed) after.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("ray.serve", reason="the ray extra is not installed")

from gantool.cli import cli
from gantool.serving.ray_serve import (
    GATE_ENV,
)
from inpaint_helpers import ExportedModel, exported_model, textured_rgb  # noqa: F401 (fixture)
from serve_helpers import encode, multipart, raw_connect, read_response

URL_LINE = re.compile(r"serving on (http://\S+?)/ ")
ADDRESS_LINE = re.compile(r"local Ray instance at (\S+) ")
HOLE = (8, 8, 20, 16)  # y0, x0, y1, x1 of the test images' hole


# ------------------------------------------------------------------------------ processes


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (Linux /proc): a Ray instance's GCS, raylet, workers."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                left.add(pid)
    return left


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def kill_all(pids: set[int]) -> None:
    for pid in alive(pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class RayServer:
    """A ``gantool serve --ray ... --port 0`` process: its URL, its Ray address, its output."""

    def __init__(self, args: list[str], env: dict[str, str], timeout: float = 240) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gantool", "serve", "--ray", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.url = self.address = ""
        self.ray_pids: set[int] = set()
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))
                if match := ADDRESS_LINE.search(line):
                    self.address = match.group(1)
                if match := URL_LINE.search(line):
                    self.url = match.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or not self.url:
            self.close()
            raise AssertionError(f"gantool serve --ray did not start: {self.lines} {self.stderr()}")
        self.ray_pids = descendants(self.process.pid)

    def stderr(self) -> str:
        if self.process.poll() is None:
            return ""
        return self.process.stderr.read() if self.process.stderr else ""

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url + "/healthz", timeout=30).json()

    def close(self) -> None:
        pids = self.ray_pids | descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        kill_all(pids - {self.process.pid} if not wait_gone(pids, 20) else pids)


def upload(seed: int = 0, size: tuple[int, int] = (32, 40)) -> tuple[bytes, str, np.ndarray, np.ndarray]:
    rgb = textured_rgb(*size, seed=seed)
    mask = np.zeros(size, np.uint8)
    y0, x0, y1, x1 = HOLE
    mask[y0:y1, x0:x1] = 255
    body, kind = multipart([("image", "i.png", encode(rgb)), ("mask", "m.png", encode(mask))])
    return body, kind, rgb, mask


def post(url: str, body: bytes, kind: str, retries: int = 40, **headers: str) -> httpx.Response:
    """POST /v1/inpaint, retrying 503s as their Retry-After says (briefly)."""
    for _ in range(retries):
        response = httpx.post(url + "/v1/inpaint", content=body, headers={"content-type": kind, **headers}, timeout=120)
        if response.status_code != 503:
            return response
        time.sleep(0.2)
    return response


def cli_inpaint(model: ExportedModel, rgb: np.ndarray, mask: np.ndarray, folder: Path) -> bytes:
    """What `gantool inpaint` writes for the same image, mask and options."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(folder / "i.png")
    Image.fromarray(mask).save(folder / "m.png")
    result = CliRunner().invoke(
        cli,
        ["inpaint", str(folder / "i.png"), "--mask", str(folder / "m.png"), "-o", str(folder / "out.png"),
         "--model", str(model.folder), "--provider", "cpu", "--backend", "onnx"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return (folder / "out.png").read_bytes()


@pytest.fixture(scope="module")
def ray_env(subprocess_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = dict(subprocess_env)
    env[GATE_ENV] = str(tmp_path_factory.mktemp("gate") / "closed")  # exists: the replicas' batches wait
    env.pop("RAY_ADDRESS", None)
    return env


MODULE_ARGS = ["--replicas", "2", "--provider", "cpu", "--backend", "onnx", "--max-queue", "3", "--max-batch", "3",
               "--batch-wait-ms", "300", "--read-timeout", "4", "--min-upload-rate-kb", "1000",
               "--max-header-kb", "4", "--allowed-host", "*"]  # fmt: skip


@pytest.fixture(scope="module")
def served(exported_model: ExportedModel, ray_env: dict[str, str]) -> Iterator[RayServer]:
    """Two replicas of the tiny model on a local Ray instance of their own, for the module."""
    server = RayServer(["--model", str(exported_model.folder), *MODULE_ARGS], ray_env)
    try:
        yield server
    finally:
        server.close()


# ------------------------------------------------------------- the same service, the same pixels


def test_startup_says_where_it_runs_and_the_thread_split(served: RayServer) -> None:
    text = "\n".join(served.lines)
    assert re.search(
        r"ray: started a local Ray instance at \S+ \(\d+ CPUs, 0 GPUs; dashboard http://127\.0\.0\.1:\d+", text
    ), text
    assert "replicas: 2 x 1 CPU, 1 inference thread(s) each (at most 2 x 1 = 2 threads)" in text, text
    assert "through Ray's object store" in text and "serving on http://127.0.0.1:" in text


def test_every_answer_is_byte_identical_to_gantool_inpaint_whatever_replica_or_batch(
    served: RayServer, exported_model: ExportedModel, ray_env: dict[str, str], tmp_path: Path
) -> None:
    body, kind, rgb, mask = upload(seed=5)
    expected = cli_inpaint(exported_model, rgb, mask, tmp_path)
    before = [served.health() for _ in range(6)]
    # Nine at once: they batch (--batch-wait-ms 300) on both replicas, some are refused and retried.
    with futures.ThreadPoolExecutor(9) as pool:
        answers = list(pool.map(lambda _: post(served.url, body, kind), range(9)))
    assert [a.status_code for a in answers] == [200] * 9
    assert all(a.content == expected for a in answers)  # byte for byte, PNG included
    after = {h["replica"]["id"]: h for h in (served.health() for _ in range(12))}
    assert len(after) == 2, after  # both replicas answer
    images = sum(h["images"] for h in after.values()) - sum({h["replica"]["id"]: h["images"] for h in before}.values())
    batches = sum(h["batches"] for h in after.values()) - sum(
        {h["replica"]["id"]: h["batches"] for h in before}.values()
    )
    assert images >= 9 and batches < images, (images, batches)  # some ran together in one batch
    # The page and the model's description are the same routes as plain serve's.
    page = httpx.get(served.url + "/", timeout=30)
    assert page.status_code == 200 and "Content-Security-Policy" in page.headers and b"<html" in page.content.lower()
    info = httpx.get(served.url + "/v1/model", timeout=30).json()
    assert info["model"] == f"{exported_model.folder.name}/generator.onnx" and info["limits"]["max_queue"] == 3


def test_errors_are_gantools_json_with_one_request_id(served: RayServer) -> None:
    response = httpx.post(served.url + "/v1/inpaint", content=b"not a form", headers={"content-type": "text/plain"})
    assert response.status_code == 400 and "multipart/form-data" in response.json()["error"]
    response = httpx.get(served.url + "/nope", headers={"X-Request-ID": "job-7"})
    assert response.status_code == 404 and response.json() == {"error": "no such path: /nope"}
    assert response.headers.get_list("x-request-id") == ["job-7"]  # Ray's proxy appends its own: one is kept
    assert response.headers["x-content-type-options"] == "nosniff"
    response = httpx.get(served.url + "/healthz", headers={"X-Request-ID": "not a token"})
    (rid,) = response.headers.get_list("x-request-id")
    assert re.fullmatch(r"[0-9a-f]{32}", rid)  # a new one, as plain serve gives


# ------------------------------------------------------------------ hostile clients under --ray


def raw_post(url: str, body: bytes, kind: str, send: int | None = None) -> socket.socket:
    sock = raw_connect(url, timeout=30)
    head = (
        f"POST /v1/inpaint HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[: len(body) if send is None else send])
    return sock


def test_protocol_limits_hold_in_rays_proxy(served: RayServer) -> None:
    # Headers over --max-header-kb: 431 JSON from gantool's protocol inside Ray's proxy.
    sock = raw_connect(served.url)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8192 + b"\r\n\r\n")
    status, headers, answer = read_response(sock)
    assert status == 431 and "4 KB" in json.loads(answer)["error"] and headers["x-content-type-options"] == "nosniff"
    sock.close()
    # Headers that trickle: 408 after --read-timeout; a connection that never speaks is closed.
    trickle, silent = raw_connect(served.url), raw_connect(served.url)
    trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    started = time.monotonic()
    status, _, answer = read_response(trickle, timeout=20)
    assert status == 408 and "headers did not arrive within 4 s" in json.loads(answer)["error"]
    silent.settimeout(20)
    assert silent.recv(100) == b"" and time.monotonic() - started < 15
    # A body longer than its Content-Length: the answer, then 400 for the rest.
    body, kind, _, _ = upload()
    sock = raw_connect(served.url)
    head = (
        f"POST /v1/inpaint HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body + b"garbage that is no request\r\n\r\n")
    assert read_response(sock, timeout=60)[0] in (200, 503)
    status, _, answer = read_response(sock)
    assert status == 400 and "malformed HTTP request" in json.loads(answer)["error"]
    sock.close()


def test_slow_uploads_hold_no_slot_and_are_dropped_at_the_deadline(served: RayServer) -> None:
    body, kind, _, _ = upload(seed=1)
    stalled = [raw_post(served.url, body, kind, send=len(body) // 2) for _ in range(8)]  # more than 2 x 3 slots
    time.sleep(0.5)
    for _ in range(3):  # served meanwhile
        assert post(served.url, body, kind, retries=1).status_code == 200
    for sock in stalled:
        status, headers, answer = read_response(sock, timeout=30)
        assert status == 408 and "did not arrive in time" in json.loads(answer)["error"], answer
        assert headers["connection"] == "close" and headers["x-content-type-options"] == "nosniff"
        sock.close()


def replica_healths(server: RayServer) -> dict[str, dict[str, Any]]:
    """/healthz of each replica, by replica ID. Ray routes each request to the less busy of
    two replicas, so this is for an idle service (a busy replica is never asked)."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(40):
        health = server.health()
        seen[health["replica"]["id"]] = health
        if len(seen) == 2:
            break
    assert len(seen) == 2, seen
    return seen


def test_overload_is_gantools_503_first_and_rays_behind_it(served: RayServer, ray_env: dict[str, str]) -> None:
    gate = Path(ray_env[GATE_ENV])
    body, kind, _, _ = upload(seed=2)
    stalled: list[socket.socket] = []
    gate.touch()  # the replicas' model waits: admitted requests stay inside
    try:
        with futures.ThreadPoolExecutor(12) as pool:
            held = [pool.submit(post, served.url, body, kind, 1) for _ in range(12)]
            deadline = time.monotonic() + 30
            refused: list[httpx.Response] = []
            while len(refused) < 6 and time.monotonic() < deadline:
                refused = [f.result() for f in held if f.done()]
                time.sleep(0.1)
            # 2 replicas x --max-queue 3 are inside; gantool refused the rest at once.
            assert len(refused) == 6 and all(r.status_code == 503 for r in refused), [r.text for r in refused]
            for answer in refused:
                assert answer.headers["retry-after"] == "1" and answer.headers["x-content-type-options"] == "nosniff"
                assert answer.json() == {"error": "the server is busy (3 requests inside); retry shortly"}
            # Behind it, Ray's bound: bodies still arriving take Ray's slots (max_ongoing_requests,
            # twice --max-queue per replica) and then its proxy's queue (four times): then Ray's 503.
            ray_answer = None
            for _ in range(60):
                sock = raw_post(served.url, body, kind, send=10)
                if not select.select([sock], [], [], 0.3)[0]:
                    stalled.append(sock)
                    continue
                ray_answer = read_response(sock)
                sock.close()
                break
            assert ray_answer is not None, len(stalled)
            status, headers, answer = ray_answer
            assert status == 503 and headers["retry-after"] == "1" and headers["x-content-type-options"] == "nosniff"
            error = json.loads(answer)["error"]
            assert error.startswith("the service is busy (Ray Serve's queue is full); retry shortly (Ray: "), error
            # Ray's slots less those the held requests take, then its queue
            assert len(stalled) >= 2 * 2 * 3 - 6 + 4 * 3, len(stalled)
            gate.unlink()
            assert [f.result().status_code for f in held].count(200) == 6  # the held ones, answered
    finally:
        gate.unlink(missing_ok=True)
        for sock in stalled:
            sock.close()
    assert post(served.url, body, kind).status_code == 200


def test_a_client_that_left_costs_no_model_run(served: RayServer, ray_env: dict[str, str]) -> None:
    gate = Path(ray_env[GATE_ENV])
    body, kind, _, _ = upload(seed=3)
    before = {k: h["skipped"] for k, h in replica_healths(served).items()}
    gate.touch()
    try:
        socks = [raw_post(served.url, body, kind) for _ in range(2)]
        time.sleep(2)  # read and admitted: they wait for the model
        for sock in socks:
            sock.close()  # they leave; Ray's proxy cancels their requests in the replica
        time.sleep(1.5)
    finally:
        gate.unlink()
    deadline = time.monotonic() + 20
    while True:
        after = {k: h["skipped"] for k, h in replica_healths(served).items()}
        if sum(after.values()) - sum(before.values()) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sum(after.values()) - sum(before.values()) == 2, (before, after)


# ------------------------------------------------------------------------ faults (slow tier)


def load(
    url: str, body: bytes, kind: str, expected: bytes, stop: threading.Event, clients: int = 2
) -> list[tuple[float, float, int, str]]:
    """Clients posting until ``stop`` (no more than one replica admits: a lost replica's load fits
    the other); each answer as (sent, answered, status, what: png, json: ERROR or OTHER ...)."""
    results: list[tuple[float, float, int, str]] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(timeout=60) as session:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    r = session.post(url + "/v1/inpaint", content=body, headers={"content-type": kind})
                    status, what = r.status_code, "png" if r.content == expected else f"OTHER {r.text[:80]}"
                    if r.headers.get("content-type") == "application/json" and "error" in r.json():
                        what = "json: " + r.json()["error"]
                except httpx.HTTPError as e:
                    status, what = 0, f"OTHER {e!r}"
                with lock:
                    results.append((sent, time.monotonic(), status, what))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.slow  # Serve restarts the replica: ~15 s under load on 2 cores
@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_a_replica_killed_under_load_is_restarted_and_its_requests_get_json_503(
    served: RayServer, ray_env: dict[str, str], how: str
) -> None:
    body, kind, _, _ = upload(seed=4)
    expected = post(served.url, body, kind).content
    stop = threading.Event()
    results: list[tuple[float, float, int, str]] = []
    loader = threading.Thread(target=lambda: results.extend(load(served.url, body, kind, expected, stop)))
    loader.start()
    time.sleep(2)
    victim = served.health()["replica"]
    if how == "SIGKILL":
        killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
    else:
        code = (
            f"import ray; ray.init(address={served.address!r}, logging_level='ERROR'); "
            f"ray.kill(ray.get_actor('SERVE_REPLICA::gantool#gantool#{victim['id']}', namespace='serve'), no_restart=False)"
        )
        killer = subprocess.Popen([sys.executable, "-c", code], env={**ray_env, "RAY_AUTH_MODE": "token"},
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert killer.wait(60) == 0, killer.stderr.read() if killer.stderr else ""
        killed_at = time.monotonic()
    time.sleep(8)
    stop.set()
    loader.join(120)
    assert not [r for r in results if r[3] != "png" and not r[3].startswith("json: ")], results  # no wrong image
    failed = [r for r in results if r[2] != 200]
    lost = "json: the replica running this request stopped before it answered; retry"
    assert all(r[2] == 503 and r[3] == lost and r[0] < killed_at + 1 for r in failed), failed  # in flight on it
    later = [r for r in results if r[0] > killed_at + 1]
    assert later and all(r[2] == 200 for r in later)
    assert min(r[1] for r in results if r[2] == 200 and r[1] > killed_at) - killed_at < 10
    deadline = time.monotonic() + 60
    while True:  # Serve replaces it: two replicas answer again, the victim not among them
        ids = {served.health()["replica"]["id"] for _ in range(12)}
        if len(ids) == 2 and victim["id"] not in ids or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(ids) == 2 and victim["id"] not in ids, ids

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
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
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
import ray

from gantool.cli import cli
from gantool.core.errors import GantoolError, InputError
from gantool.serving.ray_serve import (
    GATE_ENV,
    ConfigRequest,
    app_builder,
    deployment_options,
    plan_replicas,
    read_model_files,
    serve_config,
    settings_from_args,
)
from gantool.serving.settings import ServeSettings
from inpaint_helpers import ExportedModel, exported_model, textured_rgb  # noqa: F401 (fixture)
from process_helpers import descendants
from serve_helpers import encode, multipart, raw_connect, read_response

URL_LINE = re.compile(r"serving on (http://\S+?)/ ")
ADDRESS_LINE = re.compile(r"local Ray instance at (\S+) ")
HOLE = (8, 8, 20, 16)  # y0, x0, y1, x1 of the test images' hole
# Runs the command after it with SIGINT at its default, as a terminal's Ctrl-C finds it. Tests started
# in the background (nohup, `&` in a script) pass SIGINT on ignored, and a Python child that inherits
# that never raises KeyboardInterrupt: gantool sets its own handlers, Ray's `serve run` does not, and
# waited out its 60 s there (exec keeps the PID the test signals).
WITH_DEFAULT_SIGINT = [
    sys.executable, "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]  # fmt: skip


# ------------------------------------------------------------------------------ processes




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
    # Up to 30 s: requests an earlier test left in Ray's slots of one replica (slow bodies until their
    # read deadline) keep the router on the other for a few seconds (CI once saw 40 in a row there).
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        health = server.health()
        seen[health["replica"]["id"]] = health
        time.sleep(0.05)
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


# --------------------------------------------------------------------- stopping (slow tier)


@pytest.mark.slow  # its own Ray instance: ~20 s on 2 cores
def test_sigterm_stops_the_application_and_its_ray_instance_within_the_timeout(
    exported_model: ExportedModel, ray_env: dict[str, str]
) -> None:
    gate = Path(ray_env[GATE_ENV])
    args = ["--model", str(exported_model.folder), "--provider", "cpu", "--backend", "onnx", "--shutdown-timeout", "2"]
    server = RayServer(args, ray_env)
    try:
        assert server.ray_pids, "no Ray process found below gantool serve"
        body, kind, _, _ = upload(seed=6)
        gate.touch()  # a request the model holds while the signal comes
        running = raw_post(server.url, body, kind)
        time.sleep(1.5)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 143
        took = time.monotonic() - started
        running.settimeout(10)
        with contextlib.suppress(OSError):
            answer = running.recv(65536)
            # no answer (the replica was stopped at the end of the timeout), or a JSON one; never a 500
            assert answer == b"" or b'{"error": ' in answer or answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert took < 2 + 8, took  # --shutdown-timeout, then Ray's own stop
        assert not wait_gone(server.ray_pids, 15), "Ray processes left behind"
        stderr = server.stderr()
        assert "Traceback" not in stderr and "SIGTERM: stopping; running requests get up to 2 s" in stderr, stderr
        assert stderr.rstrip().endswith("stopped"), stderr
    finally:
        gate.unlink(missing_ok=True)
        server.close()


@pytest.mark.slow  # its own Ray instance: ~20 s on 2 cores
def test_a_second_sigint_exits_at_once_and_leaves_no_ray_process(
    exported_model: ExportedModel, ray_env: dict[str, str]
) -> None:
    args = ["--model", str(exported_model.folder), "--provider", "cpu", "--backend", "onnx", "--shutdown-timeout", "60"]
    server = RayServer(args, ray_env)
    try:
        gate = Path(ray_env[GATE_ENV])
        gate.touch()  # a running request keeps the graceful stop waiting
        body, kind, _, _ = upload(seed=7)
        running = raw_post(server.url, body, kind)
        time.sleep(1.5)
        server.process.send_signal(signal.SIGINT)
        time.sleep(1.0)
        started = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(15) == 130 and time.monotonic() - started < 10
        running.close()
        assert not wait_gone(server.ray_pids, 15), "Ray processes left behind"
        stderr = server.stderr()
        assert "Traceback" not in stderr and "SIGINT again, exiting now" in stderr, stderr
    finally:
        Path(ray_env[GATE_ENV]).unlink(missing_ok=True)
        server.close()


# ------------------------------------------------------------------ several nodes (slow tier)


@pytest.mark.slow  # a two-node cluster and a deployment on it: ~30 s on 2 cores
def test_replicas_on_two_nodes_both_answer_the_same_pixels(
    exported_model: ExportedModel, ray_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ray.cluster_utils import Cluster

    from gantool.serving.ray_launch import PROXY_CALLBACK, PROXY_CALLBACK_ENV

    monkeypatch.setenv(PROXY_CALLBACK_ENV, PROXY_CALLBACK)  # as a cluster of one's own would set it
    monkeypatch.setenv("PYTHONPATH", ray_env["PYTHONPATH"])
    # The cluster's auth as gantool's process has it (an in-process ray.init before leaves token mode set).
    if "RAY_AUTH_MODE" in ray_env:
        monkeypatch.setenv("RAY_AUTH_MODE", ray_env["RAY_AUTH_MODE"])
    else:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
    server = None
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        args = ["--model", str(exported_model.folder), "--provider", "cpu", "--backend", "onnx", "--replicas", "2",
                "--ray-address", cluster.address]  # fmt: skip
        server = RayServer(args, ray_env)
        assert f"ray: Ray cluster at {cluster.address} (2 CPUs, 0 GPUs, 2 node(s))" in "\n".join(server.lines)
        body, kind, rgb, mask = upload(seed=8)
        expected = cli_inpaint(exported_model, rgb, mask, tmp_path)
        with futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: post(server.url, body, kind), range(8)))
        assert all(a.status_code == 200 and a.content == expected for a in answers)
        healths = replica_healths(server)
        assert len({h["replica"]["node"] for h in healths.values()}) == 2, healths  # one replica per node
        assert all(h["images"] >= 1 for h in healths.values()), healths  # both answered
        server.close()
        assert server.process.returncode == 143
    finally:
        if server is not None:
            server.close()
        cluster.shutdown()


# ------------------------------------------------------------------- Ray's own CLI (slow tier)


@pytest.mark.slow  # Ray's `serve run` starts a Ray instance of its own: ~30 s on 2 cores
def test_rays_serve_run_on_the_written_config_gives_the_same_pixels(
    exported_model: ExportedModel, ray_env: dict[str, str], tmp_path: Path
) -> None:
    from gantool.serving.ray_launch import PROXY_CALLBACK, PROXY_CALLBACK_ENV, free_port

    port = free_port("127.0.0.1")
    config = tmp_path / "serve config ü.yaml"
    written = CliRunner().invoke(
        cli,
        ["serve", "--ray", "--write-config", str(config), "--model", str(exported_model.folder), "--provider", "cpu",
         "--backend", "onnx", "--replicas", "1", "--port", str(port), "--api-key", "s3cret"],
    )  # fmt: skip
    assert written.exit_code == 0 and f"wrote {config}" in written.output, written.output
    assert "s3cret" not in config.read_text() and "GANTOOL_API_KEY" in written.output  # never in the file
    serve_bin = Path(sys.executable).with_name("serve")
    env = {**ray_env, PROXY_CALLBACK_ENV: PROXY_CALLBACK, "GANTOOL_API_KEY": "s3cret"}
    said = tmp_path / "serve run.log"  # a file, not a pipe: nothing read while it runs can fill up
    with said.open("w") as log:
        process = subprocess.Popen([*WITH_DEFAULT_SIGINT, str(serve_bin), "run", str(config), "--address", "local"],
                                   env=env, stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
    pids: set[int] = set()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            time.sleep(0.5)
        assert process.poll() is None, said.read_text()
        pids = descendants(process.pid)
        body, kind, rgb, mask = upload(seed=9)
        assert post(url, body, kind).status_code == 401  # the key came from the environment
        answer = post(url, body, kind, authorization="Bearer s3cret")
        assert answer.status_code == 200 and answer.content == cli_inpaint(exported_model, rgb, mask, tmp_path)
    finally:
        pids |= descendants(process.pid)
        process.send_signal(signal.SIGINT)
        try:
            stopped: int | None = process.wait(60)
        except subprocess.TimeoutExpired:
            stopped = None
            process.kill()
        kill_all(pids if wait_gone(pids, 20) else set())
    assert stopped == 0, f"serve run did not stop on Ctrl-C within 60 s: {said.read_text()[-2000:]}"


# ----------------------------------------------------------------- options, plans, files (fast)


def test_replica_plans_and_what_the_cluster_cannot_meet() -> None:
    plan = plan_replicas(2, 0, replicas=2)
    assert (plan.replicas, plan.cpus, plan.threads) == (2, 1.0, 1)
    assert plan_replicas(8, 0, replicas=2).threads == 4  # the cores shared: 2 x 4 <= 8
    auto = plan_replicas(8, 0, min_replicas=1, max_replicas=4)
    assert (auto.replicas, auto.cpus, auto.threads) == (None, 2.0, 2)  # split by the most there can be
    assert plan_replicas(2, 0, replicas=1, replica_cpus=0.5).threads == 1
    for kwargs, needle in [
        ({"replicas": 3}, "3 replica(s) x 1 CPU need more than the Ray cluster's 2 CPUs"),
        ({"replicas": 2, "min_replicas": 1, "max_replicas": 2}, "not both"),
        ({"min_replicas": 1}, "needs both"),
        ({"min_replicas": 3, "max_replicas": 2}, "min <= max"),
        ({"replicas": 1, "replica_gpus": 1.0}, "1 replica(s) x 1 GPU need more than the Ray cluster's 0 GPUs"),
    ]:
        with pytest.raises(InputError, match=re.escape(needle)):
            plan_replicas(2, 0, **kwargs)


def test_deployment_options_put_gantools_admission_before_rays() -> None:
    settings = ServeSettings(max_queue=5, max_batch=8, shutdown_timeout=3)
    fixed = deployment_options(settings, plan_replicas(4, 1, replicas=2, replica_gpus=0.5))
    assert fixed["num_replicas"] == 2 and fixed["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 0.5}
    assert fixed["max_ongoing_requests"] == 10 and fixed["max_queued_requests"] == 20  # > --max-queue: gantool first
    assert fixed["graceful_shutdown_timeout_s"] == 3
    scaled = deployment_options(settings, plan_replicas(4, 0, min_replicas=0, max_replicas=4))
    assert scaled["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 4, "target_ongoing_requests": 8}
    assert "num_replicas" not in scaled


def test_builder_arguments_are_checked_and_typed() -> None:
    settings = settings_from_args({"max_queue": "4", "batch_wait_ms": "2.5", "allowed_hosts": "a,b", "api_key": "k"})
    assert (settings.max_queue, settings.batch_wait_ms, settings.allowed_hosts, settings.api_key) == (
        4, 2.5, ("a", "b"), "k")  # fmt: skip
    with pytest.raises(InputError, match=r"max_queue='many': expected a int"):
        settings_from_args({"max_queue": "many"})
    with pytest.raises(InputError, match=r"unknown gantool serve argument\(s\) replica_count"):
        app_builder({"replica_count": "2"})
    with pytest.raises(GantoolError, match="model not found"):
        app_builder({"model": "/no/such/model"})


def test_the_model_files_open_the_same_model_from_any_folder(exported_model: ExportedModel, tmp_path: Path) -> None:
    files = read_model_files(exported_model.folder, "cpu", "onnx")
    assert files.folder == exported_model.folder.name and files.open_file is None
    assert "generator.onnx" in files.files and all(isinstance(b, bytes) for b in files.files.values())
    first = files.materialise(tmp_path)
    again = files.materialise(tmp_path)  # a restarted replica on the node: the same copy, not another
    assert first == again and len(list(tmp_path.iterdir())) == 1
    assert {p.name: p.read_bytes() for p in first.iterdir()} == files.files
    single = read_model_files(exported_model.folder / "generator.onnx", "cpu", "onnx")
    assert single.open_file == "generator.onnx" and single.materialise(tmp_path).name == "generator.onnx"


def test_a_model_whose_files_are_symlinks_reaches_the_replicas_by_their_names(
    exported_model: ExportedModel, tmp_path: Path
) -> None:
    # A Hugging Face snapshot: every file a link into a blobs folder, named by hash. Before: the
    # opened file was resolved into blobs, so a replica got one file named by hash and no export.
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshot é"
    blobs.mkdir()
    snapshot.mkdir()
    for i, file in enumerate(sorted(exported_model.folder.iterdir())):
        shutil.copyfile(file, blobs / f"{i:040x}")
        (snapshot / file.name).symlink_to(Path("..") / "blobs" / f"{i:040x}")
    real = read_model_files(exported_model.folder, "cpu", "onnx")
    linked = read_model_files(snapshot, "cpu", "onnx")
    assert (linked.folder, linked.open_file, linked.files) == ("snapshot é", None, real.files)
    from gantool import Inpainter

    opened = Inpainter(linked.materialise(tmp_path / "node"), provider="cpu", backend="onnx")
    assert opened.backend.path.name in real.files and opened.backend.path.parent.name == "snapshot é"
    one = read_model_files(snapshot / "generator.onnx", "cpu", "onnx")
    assert one.open_file == "generator.onnx" and one.files == real.files


def test_the_written_config_is_one_rays_schema_accepts(exported_model: ExportedModel, tmp_path: Path) -> None:
    import yaml
    from ray.serve.schema import ServeDeploySchema

    target = tmp_path / "serve.yaml"
    args = ["serve", "--ray", "--write-config", str(target), "--model", str(exported_model.folder), "--max-queue",
            "7", "--min-replicas", "1", "--max-replicas", "3", "--port", "9123", "--cors-origin", "https://a.example"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    config = ServeDeploySchema.model_validate(yaml.safe_load(target.read_text()))
    assert config.http_options.port == 9123 and config.http_options.host == "127.0.0.1"
    (app,) = config.applications
    assert app.import_path == "gantool.serving.ray_serve:app_builder" and app.route_prefix == "/"
    assert app.args["model"] == str(exported_model.folder.resolve()) and app.args["max_queue"] == 7
    assert (app.args["min_replicas"], app.args["max_replicas"]) == (1, 3)
    assert app.args["cors_origins"] == ["https://a.example"]
    assert serve_config(ConfigRequest({"model": "m"}, "0.0.0.0", 80))["http_options"] == {"host": "0.0.0.0", "port": 80}
    again = CliRunner().invoke(cli, args)  # never over an existing file
    assert again.exit_code == 1 and "exists" in again.output and "Traceback" not in again.output


def test_the_written_config_records_a_relative_symlinked_model_as_given_made_absolute(
    exported_model: ExportedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    # A link the user repoints (models/current -> v2) must be followed at the next deploy, so the
    # config keeps the link: absolute, `..` folded, not resolved to the folder it points at today.
    work = tmp_path / "work dir é"
    (work / "models").mkdir(parents=True)
    (work / "models" / "current é").symlink_to(exported_model.folder, target_is_directory=True)
    (work / "sub").mkdir()
    monkeypatch.chdir(work / "sub")
    result = CliRunner().invoke(
        cli, ["serve", "--ray", "--write-config", "../serve.yaml", "--model", "../models/./current é"]
    )
    assert result.exit_code == 0, result.output
    (app,) = yaml.safe_load((work / "serve.yaml").read_text())["applications"]
    assert app["args"]["model"] == str(work / "models" / "current é")
    assert Path(app["args"]["model"]).resolve() == exported_model.folder.resolve()


def serve_at_a_closed_port(exported_model: ExportedModel) -> tuple[Any, int, float]:
    """``serve --ray`` with --ray-address at a closed port: (the result, the port, seconds taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: a closed port
        port = sock.getsockname()[1]
        started = time.monotonic()
        result = CliRunner().invoke(
            cli,
            ["serve", "--ray", "--ray-address", f"127.0.0.1:{port}", "--ray-timeout", "2", "--model",
             str(exported_model.folder), "--provider", "cpu", "--backend", "onnx", "--port", "0"],
        )  # fmt: skip
    return result, port, time.monotonic() - started


def test_ray_options_need_ray_and_a_wrong_address_fails_in_one_line(exported_model: ExportedModel) -> None:
    result = CliRunner().invoke(cli, ["serve", "--replicas", "2", "--port", "0"])
    assert result.exit_code == 2 and "--replicas needs --ray" in result.output
    result, port, took = serve_at_a_closed_port(exported_model)
    assert result.exit_code == 1 and took < 15
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in result.output, result.output
    assert "Traceback" not in result.output
    time.sleep(1)  # the teardown thread had its chance
    # Before, the teardown's serve.delete started a local Ray instance in a thread after the error: a
    # cluster nobody asked for, left running in this process (and in CI, joined by later commands).
    assert not ray.is_initialized()
    assert not [t.name for t in threading.enumerate() if t.name == "gantool-serve-stop"]


def test_a_wrong_address_fails_in_one_line_when_this_process_has_ray_up(exported_model: ExportedModel) -> None:
    # Before, a process whose Ray was up (a notebook, a test session) ignored --ray-address: it deployed
    # onto its own cluster and served on, never saying the address was wrong.
    ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, logging_level="ERROR")
    try:
        result, port, took = serve_at_a_closed_port(exported_model)
        assert result.exit_code == 1 and took < 15, result.output
        assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in result.output
        assert ray.is_initialized()  # the process's own Ray is left as it was
    finally:
        ray.shutdown()


def test_without_ray_serve_it_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_ray(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    result = CliRunner().invoke(cli, ["serve", "--ray", "--port", "0"])
    assert result.exit_code == 1 and 'gantool serve --ray needs Ray Serve: pip install "gantool[ray]"' in result.output


def test_the_guard_refuses_large_headers_itself(exported_model: ExportedModel) -> None:
    # Behind a front that reads headers of any size (Ray's proxy without gantool's hook), the app's
    # own guard answers 431; before, such headers reached the app.
    with warnings.catch_warnings():  # starlette's TestClient warns about httpx's future; not ours
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from gantool import Inpainter
    from gantool.serving.app import build_app

    app = build_app(Inpainter(exported_model.folder, "cpu", "onnx"), ServeSettings(max_header_kb=1))
    with TestClient(app) as client:
        response = client.get("/healthz", headers={"X-Big": "a" * 2000})
        assert response.status_code == 431 and response.json() == {"error": "the request headers are over 1 KB"}
        assert response.headers["x-content-type-options"] == "nosniff"
        assert client.get("/healthz", headers={"X-Small": "a" * 500}).status_code == 200


def test_batches_are_cut_at_the_pixel_budget() -> None:
    from concurrent.futures import Future

    from gantool.serving.batcher import ModelRunner, _Job

    runner = ModelRunner(backend=None, max_batch=8, max_batch_pixels=100)  # type: ignore[arg-type]
    jobs = [_Job(None, None, "full", Future(), pixels) for pixels in (40, 50, 20, 150, 10)]  # type: ignore[arg-type]
    assert [[j.model_pixels for j in batch] for batch in runner.split_by_pixels(jobs)] == [[40, 50], [20], [150], [10]]


@pytest.mark.slow  # two servers, one a Ray instance: ~40 s on 2 cores
def test_bench_serve_ray_measures_against_plain_serve_and_kills_a_replica(exported_model: ExportedModel) -> None:
    result = CliRunner().invoke(
        cli,
        ["bench", "serve", str(exported_model.folder), "--ray", "--replicas", "1", "--requests", "16", "--rounds", "1",
         "--size", "32", "--concurrency", "2", "--provider", "cpu", "--backend", "onnx", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [row["server"] for row in report["rows"]] == ["serve", "serve --ray --replicas 1"]
    assert all(row["ok"] == row["sent"] == 16 and row["images_per_s"] > 0 for row in report["rows"])
    kill = report["kill"]
    assert kill["wrong"] == 0 and kill["non_json"] == 0 and kill["victim_pid"]
    assert report["load_average"]["before"] and report["cpu"]
    plain, ray_row = (row["cpu_ms_per_image"] for row in report["rows"])
    assert plain["replicas"] == plain["proxy"] == 0 < plain["rest"]  # plain serve is one process, no Ray
    assert ray_row["replicas"] > 0 and ray_row["proxy"] > 0  # the model runs in the replica, behind Ray's proxy
    bad = CliRunner().invoke(cli, ["bench", "serve", "--ray", "--replicas", "one"])
    assert bad.exit_code == 2 and "--replicas" in bad.output

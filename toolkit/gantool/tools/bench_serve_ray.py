"""``gantool bench serve --ray --replicas 1,2``: ``gantool serve --ray`` per replica count against
plain ``gantool serve``, rounds interleaved, then one replica killed mid-round.

Every server runs at once for the whole run (each ``--ray`` one on a Ray instance of its own),
so their idle cost loads every row alike; after an untimed warm-up round each, each round sends ``requests`` POST /v1/inpaint from
``concurrency`` keep-alive clients to one server, the servers in turn (A, B, C, then C, A, B ...).
Every answer is compared byte for byte with plain serve's answer for the same image. The last
round runs against the server with the most replicas, whose answering replica is SIGKILLed
halfway: its wrong images, non-JSON answers, the first success after the kill and its p99
against the undisturbed rounds' p99 are the fault goals.

Each timed round also takes the CPU time the server's process tree used per image answered
(Linux's /proc), split for ``--ray`` into the replicas, Ray's proxy and the rest: on a machine
whose cores are all busy, throughput is cores / CPU per image, so this says where a gap comes from.
"""

from __future__ import annotations

import http.client
import os
import signal
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from gantool.core.errors import GantoolError, InputError
from gantool.tools.bench_serve import _multipart, _png, _serve_inputs, _ServerProcess, _wait_ready

GOAL_RATIO = 0.9  # --ray at the most replicas against plain serve, images/s
GOAL_FIRST_SUCCESS_S = 10.0
GOAL_P99_FACTOR = 3.0
GOAL_STARTUP_S = 30.0
BOUNDARY = "gantoolbenchray"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else []


# A Ray process's part, by its title: what each costs per image is where --ray's overhead goes.
CPU_PARTS = (("replicas", "ServeReplica"), ("proxy", "ProxyActor"))


def _tree_cpu(root: int) -> dict[str, float] | None:
    """CPU seconds used so far by ``root`` and every process below it (a local Ray instance's
    raylet, workers, proxy...), by part: the Serve replicas, Ray's proxy and the rest (the
    driver, or plain serve itself, and Ray's other processes). None without Linux's /proc."""
    proc = Path("/proc")
    if not (proc / str(root)).is_dir():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    used: dict[int, tuple[float, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        used[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / tick, title)
    parts = {name: 0.0 for name, _ in CPU_PARTS} | {"rest": 0.0}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        seconds, title = used.get(pid, (0.0, ""))
        part = next((name for name, marker in CPU_PARTS if marker in title), "rest")
        parts[part] += seconds
    return parts


class _Round:
    """``requests`` POSTs from ``concurrency`` keep-alive clients; answers checked against ``expected``."""

    def __init__(self, url: str, bodies: list[bytes], expected: list[bytes] | None, deadline: float) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port
        self.bodies, self.expected, self.deadline = bodies, expected, deadline
        self.lock = threading.Lock()
        self.rows: list[dict[str, Any]] = []  # sent, done, status, kind (png / json / wrong / other)
        self.answers: dict[int, bytes] = {}

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=300)

    def run(self, requests: int, concurrency: int, during: Any = None) -> dict[str, Any]:
        issued = {"next": 0}

        def client() -> None:
            connection = self._connection()
            while True:
                with self.lock:
                    number = issued["next"]
                    if number >= requests or time.monotonic() > self.deadline:
                        break
                    issued["next"] += 1
                index = number % len(self.bodies)
                sent = time.monotonic()
                try:
                    connection.request("POST", "/v1/inpaint", body=self.bodies[index],
                                       headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})  # fmt: skip
                    response = connection.getresponse()
                    data, status = response.read(), response.status
                    kind = response.getheader("content-type") or ""
                except (OSError, http.client.HTTPException):
                    data, status, kind = b"", 0, "none"
                    connection.close()
                    connection = self._connection()
                if status == 200:
                    with self.lock:
                        self.answers.setdefault(index, data)
                    what = "png" if self.expected is None or data == self.expected[index] else "wrong"
                else:
                    what = "json" if kind.startswith("application/json") and data.startswith(b'{"error"') else "other"
                with self.lock:
                    self.rows.append({"sent": sent, "done": time.monotonic(), "status": status, "what": what})
            connection.close()

        threads = [threading.Thread(target=client, name=f"bench-ray-client-{i}") for i in range(concurrency)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        if during is not None:
            during(self)
        for thread in threads:
            thread.join(max(1.0, self.deadline - time.monotonic() + 310))
        wall = time.monotonic() - started
        ok = [r for r in self.rows if r["status"] == 200 and r["what"] == "png"]
        return {"ok": len(ok), "sent": len(self.rows), "wall_s": wall, "images_per_s": len(ok) / wall,
                "latencies_ms": [(r["done"] - r["sent"]) * 1e3 for r in ok]}  # fmt: skip


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values or [np.nan], dtype=float)
    return {"p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99))}


# long: one measurement in order: the servers, the reference answers, the interleaved rounds, the kill round
def bench_serve_ray(
    model: str | Path | None = None,
    replicas: Sequence[int] = (1, 2),
    requests: int = 96,
    concurrency: int = 8,
    size: int = 256,
    rounds: int = 3,
    provider: str = "auto",
    backend: str = "auto",
    precision: str = "auto",
    max_batch: int | None = None,
    batch_wait_ms: float | None = None,
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """``gantool serve --ray`` at each replica count against plain serve (see the module docstring)."""
    from gantool.core.constants import DEFAULT_SERVE_BATCH_WAIT_MS, DEFAULT_SERVE_MAX_BATCH

    if not replicas or min(replicas) < 1 or min(requests, concurrency, rounds) < 1:
        raise InputError("--replicas (a list such as 1,2), --requests, --concurrency and --rounds must be at least 1")
    deadline = time.monotonic() + timeout_s
    max_batch = max_batch or DEFAULT_SERVE_MAX_BATCH
    batch_wait_ms = DEFAULT_SERVE_BATCH_WAIT_MS if batch_wait_ms is None else batch_wait_ms
    pngs = [(_png(rgb), _png(mask)) for rgb, mask in _serve_inputs(size, 8)]
    bodies = [_multipart(image, mask, BOUNDARY) for image, mask in pngs]
    common = ["--provider", provider, "--backend", backend, "--precision", precision, "--max-batch", str(max_batch),
              "--batch-wait-ms", str(batch_wait_ms), "--max-queue", str(max(16, 2 * concurrency)),
              "--max-model-pixels", str(max(4_000_000, size * size * 2))]  # fmt: skip
    if model is not None:
        common += ["--model", str(model)]
    load_before = _load()
    servers: dict[str, _ServerProcess] = {}
    startup: dict[str, float] = {}
    try:
        for name, extra in [("serve", [])] + [(f"serve --ray --replicas {n}", ["--ray", "--replicas", str(n)]) for n in replicas]:  # fmt: skip
            began = time.monotonic()
            servers[name] = _ServerProcess([*common, *extra], max(1.0, deadline - time.monotonic()))
            assert servers[name].url is not None
            _wait_ready(servers[name].url or "", deadline)
            startup[name] = time.monotonic() - began
        names = list(servers)
        reference = _Round(servers["serve"].url or "", bodies, None, deadline)
        reference.run(len(bodies), 1)
        expected = [reference.answers.get(i, b"") for i in range(len(bodies))]
        if len(reference.answers) != len(bodies):
            raise GantoolError("plain gantool serve did not answer every reference request")
        for name in names:  # untimed: every replica warm (first batches, connection pools) before the rounds
            _Round(servers[name].url or "", bodies, expected, deadline).run(2 * concurrency, concurrency)
        per_round: list[dict[str, Any]] = []
        for number in range(rounds):
            order = names[number % len(names) :] + names[: number % len(names)]  # A B C, B C A, ...
            for name in order:
                if time.monotonic() > deadline:
                    break
                cpu_before = _tree_cpu(servers[name].process.pid)
                result = _Round(servers[name].url or "", bodies, expected, deadline).run(requests, concurrency)
                cpu_after = _tree_cpu(servers[name].process.pid)
                if cpu_before and cpu_after and result["ok"]:  # CPU ms per image answered, by part
                    result["cpu_ms"] = {k: 1e3 * (cpu_after[k] - cpu_before[k]) / result["ok"] for k in cpu_after}
                per_round.append({"server": name, "round": number, **result})
        kill = _kill_round(servers[names[-1]], bodies, expected, requests, concurrency, deadline)
    finally:
        for server in servers.values():
            server.stop()
    rows = []
    for name in names:
        mine = [r for r in per_round if r["server"] == name]
        ips = [r["images_per_s"] for r in mine] or [0.0]
        cpu = [r["cpu_ms"] for r in mine if "cpu_ms" in r]
        cpu_ms = {k: statistics.median(c[k] for c in cpu) for k in cpu[0]} if cpu else None
        rows.append({"server": name, "startup_s": startup[name], "images_per_s": statistics.median(ips),
                     "images_per_s_range": [min(ips), max(ips)], "ok": sum(r["ok"] for r in mine),
                     "sent": sum(r["sent"] for r in mine), "cpu_ms_per_image": cpu_ms,
                     **_percentiles([v for r in mine for v in r["latencies_ms"]])})  # fmt: skip
    plain = rows[0]["images_per_s"]
    for row in rows:
        row["ratio"] = row["images_per_s"] / plain if plain else 0.0
    most = rows[-1]
    kill["undisturbed_p99_ms"] = most["p99"]
    kill["p99_factor"] = kill["p99_ms"] / most["p99"] if most["p99"] else float("inf")
    first = kill["first_success_after_kill_s"]
    return {
        "benchmark": "serve --ray",
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average": {"before": load_before, "after": _load()},
        "size": size,
        "requests": requests,
        "concurrency": concurrency,
        "rounds": rounds,
        "max_batch": max_batch,
        "batch_wait_ms": batch_wait_ms,
        "rows": rows,
        "per_round": [{k: v for k, v in r.items() if k != "latencies_ms"} for r in per_round],
        "kill": kill,
        "goals": {
            "throughput": {"goal": GOAL_RATIO, "ratio": most["ratio"], "met": most["ratio"] >= GOAL_RATIO},
            "kill": {
                "met": kill["wrong"] == 0
                and kill["non_json"] == 0
                and first is not None
                and first <= GOAL_FIRST_SUCCESS_S
                and kill["p99_factor"] <= GOAL_P99_FACTOR,
            },  # fmt: skip
            "startup": {"goal_s": GOAL_STARTUP_S, "met": max(startup.values()) < GOAL_STARTUP_S},
        },
    }


def _kill_round(
    server: _ServerProcess, bodies: list[bytes], expected: list[bytes], requests: int, concurrency: int, deadline: float
) -> dict[str, Any]:
    """A round against ``server`` whose answering replica is SIGKILLed once half the requests are done."""
    import json
    import urllib.request

    state: dict[str, Any] = {"killed_at": None, "victim": None}

    def kill_halfway(round_: _Round) -> None:
        while len(round_.rows) < requests // 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with urllib.request.urlopen((server.url or "") + "/healthz", timeout=30) as answer:
            victim = json.loads(answer.read())["replica"]
        state["victim"] = victim
        state["killed_at"] = time.monotonic()
        os.kill(int(victim["pid"]), signal.SIGKILL)

    round_ = _Round(server.url or "", bodies, expected, deadline)
    result = round_.run(requests, concurrency, during=kill_halfway)
    killed_at = state["killed_at"] or 0.0
    after = [r["done"] for r in round_.rows if r["status"] == 200 and r["done"] > killed_at]
    answered = [(r["done"] - r["sent"]) * 1e3 for r in round_.rows if r["status"] != 0]
    return {
        "victim_pid": state["victim"]["pid"] if state["victim"] else None,
        "ok": result["ok"],
        "sent": result["sent"],
        "failed": sum(1 for r in round_.rows if r["status"] != 200),
        "wrong": sum(1 for r in round_.rows if r["what"] == "wrong"),
        "non_json": sum(1 for r in round_.rows if r["status"] != 200 and r["what"] != "json"),
        "first_success_after_kill_s": (min(after) - killed_at) if after else None,
        "p99_ms": _percentiles(answered)["p99"],
    }

"""gantool serve against careless and hostile clients (issue #21): a real server on a
loopback port, real slow clients over raw sockets, each bounded in count and time.
Timeouts are set short by each test; nothing here measures speed (bench serve --hostile does)."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("fastapi", reason="the serve extra is not installed")

from gantool import Inpainter
from gantool.cli import cli
from gantool.core.errors import InputError, SizeLimitError
from gantool.core.processing import BLEND_MARGIN, blend_pixels, blend_regions, read_image
from gantool.inference.cost import check_cost, estimate_cost
from gantool.inference.inpainter import Window, _span, crop_windows, hole_boxes, plan_windows
from gantool.serving.app import build_app
from gantool.serving.settings import ServeSettings, check_api_key, default_allowed_hosts
from inpaint_helpers import exported_model, textured_rgb  # noqa: F401 (fixture)
from serve_helpers import (  # noqa: F401 (inpainter, gated: fixtures)
    GatedBackend,
    encode,
    gated,
    get_json,
    inpainter,
    multipart,
    raw_connect,
    read_response,
    running_server,
    serve_process,
    wait_ready,
)


def upload(height: int = 32, width: int = 32, holes: int = 1) -> tuple[bytes, str]:
    """A multipart body with an image and a mask of ``holes`` separate 2 x 2 holes."""
    mask = np.zeros((height, width), np.uint8)
    for index in range(holes):
        y, x = divmod(index * 4, width)
        mask[(y * 4) % height : (y * 4) % height + 2, x : x + 2] = 255
    return multipart([("image", "i.png", encode(textured_rgb(height, width))), ("mask", "m.png", encode(mask))])


def raw_post(url: str, body: bytes, content_type: str, extra: str = "", send: int | None = None) -> socket.socket:
    """A POST /v1/inpaint whose first ``send`` body bytes (all by default) are sent."""
    sock = raw_connect(url)
    head = (
        f"POST /v1/inpaint HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    sock.sendall(head.encode() + body[: len(body) if send is None else send])
    return sock


def health(url: str) -> dict:
    return get_json(url + "/healthz")[1]


# ------------------------------------------------------------------ slow clients, deadlines


def test_slow_uploads_hold_no_slot_and_are_dropped_at_the_deadline(inpainter: Inpainter):
    settings = ServeSettings(max_queue=2, read_timeout=1.5, min_upload_rate_kb=1000)
    body, kind = upload()
    with running_server(build_app(inpainter, settings)) as (url, _):
        wait_ready(url)
        # Four clients: half a body then silence, more than the two slots.
        stalled = [raw_post(url, body, kind, send=len(body) // 2) for _ in range(4)]
        deadline = time.monotonic() + 10
        while health(url)["reading"] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert health(url)["in_flight"] == 0  # reading is not being inside
        for _ in range(3):  # normal clients meanwhile: served, not 503
            response = httpx.post(url + "/v1/inpaint", content=body, headers={"content-type": kind}, timeout=30)
            assert response.status_code == 200, response.text
        for sock in stalled:
            status, headers, answer = read_response(sock, timeout=10)
            assert status == 408 and "did not arrive in time" in json.loads(answer)["error"]
            assert headers["connection"] == "close" and headers["x-content-type-options"] == "nosniff"
            sock.close()
        assert health(url)["reading"] == 0


def test_trickled_or_silent_headers_are_dropped(inpainter: Inpainter):
    settings = ServeSettings(read_timeout=1.0)
    with running_server(build_app(inpainter, settings)) as (url, _):
        trickle = raw_connect(url)
        trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        silent = raw_connect(url)
        status, _, answer = read_response(trickle)
        assert status == 408 and "headers did not arrive" in json.loads(answer)["error"]
        silent.settimeout(10)
        assert silent.recv(100) == b""  # closed without a word: it never asked anything
        assert get_json(url + "/healthz")[0] == 200


def test_headers_over_the_limit_are_431_json(inpainter: Inpainter):
    with running_server(build_app(inpainter, ServeSettings(max_header_kb=4))) as (url, _):
        sock = raw_connect(url)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8192 + b"\r\n\r\n")
        status, headers, answer = read_response(sock)
        assert status == 431 and "4 KB" in json.loads(answer)["error"]
        assert headers["x-content-type-options"] == "nosniff"
        sock.close()
        # A body larger than the header limit in the same packets as the headers is fine.
        body, kind = upload(64, 64)
        assert len(body) > 4096
        sock = raw_post(url, body, kind)
        assert read_response(sock, timeout=30)[0] == 200
        sock.close()


def test_content_length_is_enforced_both_ways(inpainter: Inpainter):
    body, kind = upload()
    with running_server(build_app(inpainter, ServeSettings(read_timeout=1.0))) as (url, _):
        # More bytes than declared: the extra is not a request.
        sock = raw_connect(url)
        head = f"POST /v1/inpaint HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body + b"garbage that is no request\r\n\r\n")
        assert read_response(sock, timeout=30)[0] == 200
        status, _, answer = read_response(sock)
        assert status == 400 and "malformed HTTP request" in json.loads(answer)["error"]
        sock.close()
        # No length on an HTTP/1.0 POST: 411, not an empty body.
        sock = raw_connect(url)
        sock.sendall(f"POST /v1/inpaint HTTP/1.0\r\nContent-Type: {kind}\r\n\r\n".encode() + body)
        status, _, answer = read_response(sock)
        assert status == 411 and "Content-Length" in json.loads(answer)["error"]
        sock.close()


def test_tcp_nodelay_is_set_on_accepted_connections(inpainter: Inpainter):
    with running_server(build_app(inpainter)) as (url, server), httpx.Client() as client:
        assert client.get(url + "/healthz").status_code == 200
        connections = list(server.server_state.connections)
        assert connections
        for connection in connections:
            sock = connection.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


# ------------------------------------------------------------------- disconnected clients


def test_a_client_that_left_costs_no_model_run(inpainter: Inpainter, gated: GatedBackend):
    body, kind = upload()
    with running_server(build_app(inpainter, ServeSettings(max_batch=1, batch_wait_ms=0))) as (url, _):
        wait_ready(url)
        gated.gate.clear()
        gated.entered.clear()
        first = raw_post(url, body, kind)
        assert gated.entered.wait(30)  # the model is busy with the first
        gone = raw_post(url, body, kind)
        deadline = time.monotonic() + 10
        while health(url)["queued"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gone.close()
        while health(url)["in_flight"] > 1:  # the one that left no longer counts
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gated.gate.set()
        assert read_response(first, timeout=30)[0] == 200
        first.close()
        while health(url)["skipped"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        state = health(url)
        assert state["images"] == 1 and state["skipped"] == 1 and state["in_flight"] == 0  # the first only


# ------------------------------------------------------------------------------- security


def test_only_allowed_formats_are_decoded_and_no_program_runs(
    inpainter: Inpainter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    marker = tmp_path / "gs-ran"
    fake_gs = tmp_path / "bin" / "gs"
    fake_gs.parent.mkdir()
    fake_gs.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    fake_gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_gs.parent}:/usr/bin:/bin")
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n0 0 moveto 8 8 lineto stroke\nshowpage\n%%EOF\n"
    (tmp_path / "a.eps").write_bytes(eps)
    with pytest.raises(InputError):  # the CLI's reader: the same list
        read_image(tmp_path / "a.eps")
    body, kind = multipart([("image", "a.eps", eps), ("boxes", None, b"1,1,2,2")])
    with running_server(build_app(inpainter)) as (url, _):
        response = httpx.post(url + "/v1/inpaint", content=body, headers={"content-type": kind}, timeout=30)
    assert response.status_code == 400 and "PNG, JPEG" in response.json()["error"]
    assert not marker.exists()


def test_host_and_origin_are_checked_before_any_work(inpainter: Inpainter):
    settings = ServeSettings(allowed_hosts=default_allowed_hosts("127.0.0.1"), cors_origins=("https://app.example",))
    body, kind = upload()
    with running_server(build_app(inpainter, settings)) as (url, _):
        wait_ready(url)
        port = url.rsplit(":", 1)[1]

        def post(**headers: str) -> httpx.Response:
            return httpx.post(url + "/v1/inpaint", content=body, headers={"content-type": kind, **headers}, timeout=30)

        rebinding = post(host=f"evil.example:{port}")
        assert rebinding.status_code == 400 and "evil.example" in rebinding.json()["error"]
        assert httpx.get(url + "/", headers={"host": "evil.example"}).status_code == 400
        cross_site = post(origin="https://evil.example")
        assert cross_site.status_code == 403 and "evil.example" in cross_site.json()["error"]
        assert health(url)["images"] == 0  # neither was computed
        assert post(host=f"localhost:{port}", origin=f"http://localhost:{port}").status_code == 200  # the page
        assert post(origin="https://app.example").status_code == 200  # --cors-origin
        for response in (rebinding, cross_site, httpx.get(url + "/nowhere"), httpx.head(url + "/")):
            assert response.headers["x-content-type-options"] == "nosniff"
        assert httpx.head(url + "/").status_code == 200 and httpx.head(url + "/healthz").status_code == 200
        slash = httpx.post(url + "/v1/inpaint/", content=body, headers={"content-type": kind})
        assert slash.status_code == 404 and "location" not in slash.headers  # no redirect from the Host
    assert default_allowed_hosts("0.0.0.0") == ("*",)


def test_api_keys_no_client_could_send_are_refused_at_start():
    for key in (" k3y ", "k3y\t", "clé"):
        with pytest.raises(InputError):
            check_api_key(key)
        result = CliRunner().invoke(cli, ["serve", "--api-key", key, "--port", "0"])
        assert result.exit_code == 1 and "--api-key" in result.output and "Traceback" not in result.output
    assert check_api_key("k3y") == "k3y"


# ------------------------------------------------------------------ clear 4xx for mistakes


@pytest.mark.parametrize(
    ("case", "status", "needle"),
    [
        ("json body", 400, "multipart/form-data"),
        ("cut short", 400, "incomplete"),
        ("text for a file", 400, "must be a file part"),
        ("two images", 400, "sent twice"),
        ("unknown field", 400, "unknown field"),
        ("pixel bomb", 413, "limit of 1000000 pixels"),
    ],
)
def test_client_mistakes_are_one_clear_json_line(inpainter: Inpainter, case: str, status: int, needle: str):
    image = encode(textured_rgb(32, 32))
    mask = encode(np.full((32, 32), 255, np.uint8))
    kind = None
    if case == "json body":
        body, kind = b'{"image": "x"}', "application/json"
    elif case == "cut short":
        body, kind = multipart([("image", "i.png", image), ("mask", "m.png", mask)])
        body = body[: len(body) - 30]
    elif case == "text for a file":
        body, kind = multipart([("image", None, image)])
    elif case == "two images":
        body, kind = multipart([("image", "i.png", image), ("image", "j.png", image), ("mask", "m.png", mask)])
    elif case == "unknown field":
        body, kind = multipart([("image", "i.png", image), ("maks", "m.png", mask)])
    else:
        from test_serve import _png_header

        body, kind = multipart([("image", "i.png", _png_header(60000, 60000)), ("mask", "m.png", mask)])
    with running_server(build_app(inpainter, ServeSettings(max_pixels=1_000_000))) as (url, _):
        response = httpx.post(url + "/v1/inpaint", content=body, headers={"content-type": kind}, timeout=30)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and needle in response.json()["error"]
    assert "\n" not in response.json()["error"]


# ------------------------------------------------------------------------ cost, windows


def test_costs_over_the_limits_are_refused_before_the_model(inpainter: Inpainter):
    many, kind = upload(64, 64, holes=40)
    with running_server(build_app(inpainter, ServeSettings(max_holes=10, max_model_pixels=32 * 32 * 4))) as (url, _):
        wait_ready(url)
        response = httpx.post(url + "/v1/inpaint", content=many, headers={"content-type": kind}, timeout=30)
        assert response.status_code == 413 and "--max-holes (10)" in response.json()["error"]
        big, kind = multipart(
            [
                ("image", "i.png", encode(textured_rgb(96, 96))),
                ("boxes", None, b"10,10,4,4"),
                ("strategy", None, b"full"),
            ]
        )
        response = httpx.post(url + "/v1/inpaint", content=big, headers={"content-type": kind}, timeout=30)
        assert response.status_code == 413 and "--max-model-pixels (4096)" in response.json()["error"]
        assert health(url)["images"] == 0  # the model never ran


def test_too_many_holes_are_refused_before_the_image_is_decoded(inpainter: Inpainter):
    # The image's header is valid but its pixel data is cut short: decoding it would be a 400.
    # A mask with too many holes is counted first and refused (413) without decoding the image,
    # which is most of a large upload's decoding time (docs/serving.md, the 1,000-hole figures).
    mask = np.zeros((64, 64), np.uint8)
    mask[2::6, 2::6] = 255  # 121 separate one-pixel holes
    truncated = encode(textured_rgb(64, 64))[:120]
    body, kind = multipart([("image", "i.png", truncated), ("mask", "m.png", encode(mask))])
    with running_server(build_app(inpainter, ServeSettings(max_holes=100))) as (url, _):
        wait_ready(url)
        response = httpx.post(url + "/v1/inpaint", content=body, headers={"content-type": kind}, timeout=30)
        assert response.status_code == 413, response.text
        assert response.json()["error"] == "the mask has 121 separate holes, over --max-holes (100)"
        # Within the limit the image is decoded as before: its truncation is the answer.
        few, kind = multipart(
            [("image", "i.png", truncated), ("mask", "m.png", encode(mask * (np.arange(64) < 12)[:, None]))]
        )
        response = httpx.post(url + "/v1/inpaint", content=few, headers={"content-type": kind}, timeout=30)
        assert response.status_code == 400 and "truncated" in response.json()["error"].lower(), response.text


def _one_square_hole(size: int, side: int) -> np.ndarray:
    mask = np.zeros((size, size), np.float32)
    offset = (size - side) // 2
    mask[offset : offset + side, offset : offset + side] = 1
    return mask


def test_the_blend_is_costed_by_its_regions_area_not_its_hole_count():
    huge, tiny = _one_square_hole(200, 150), _one_square_hole(200, 4)
    # One region each: the hole's box after the blend's 1-pixel dilation, plus BLEND_MARGIN on every side.
    assert blend_pixels(huge > 0.5) == (150 + 2 + 2 * BLEND_MARGIN) ** 2
    assert blend_pixels(tiny > 0.5) == (4 + 2 + 2 * BLEND_MARGIN) ** 2
    labels, boxes = blend_regions(huge > 0.5)
    assert labels is not None and boxes == [(24, 24, 152, 152)]  # (x, y, w, h), what poisson_blend solves
    costs = {
        name: estimate_cost(mask, "full", 32, 4, blend="poisson") for name, mask in (("huge", huge), ("tiny", tiny))
    }
    assert costs["huge"].holes == costs["tiny"].holes == 1
    assert [costs[name].blend_pixels for name in ("huge", "tiny")] == [168**2, 22**2]  # the same holes, 58x apart
    assert estimate_cost(huge, "full", 32, 4, blend="none").blend_pixels == 0  # nothing blended, nothing charged
    limit = 10 * costs["tiny"].blend_pixels
    assert check_cost(costs["tiny"], max_blend_pixels=limit) is costs["tiny"]
    with pytest.raises(SizeLimitError, match=rf"--max-blend-pixels \({limit}\)"):
        check_cost(costs["huge"], max_blend_pixels=limit)
    # Many tiny holes still add up: each region is at least (2 BLEND_MARGIN + 1)^2.
    many = np.zeros((200, 200), np.float32)
    many[4::20, 4::20] = 1  # 100 one-pixel holes, 20 px apart: 100 regions
    assert blend_pixels(many > 0.5) == 100 * (1 + 2 + 2 * BLEND_MARGIN) ** 2


def test_a_request_with_one_huge_hole_to_blend_is_refused_before_the_model(inpainter: Inpainter):
    image = encode(textured_rgb(96, 96))

    def body(box: bytes, blend: bytes) -> tuple[bytes, str]:
        return multipart(
            [("image", "i.png", image), ("boxes", None, box), ("strategy", None, b"full"), ("blend", None, blend)]
        )

    settings = ServeSettings(max_blend_pixels=2000)  # a 4 x 4 hole blends over 22 x 22 = 484 pixels
    with running_server(build_app(inpainter, settings)) as (url, _):
        wait_ready(url)
        for box, blend, status in [
            (b"8,8,80,80", b"poisson", 413),  # one huge hole: 98 x 98 = 9604 blend pixels
            (b"40,40,4,4", b"poisson", 200),  # one tiny hole
            (b"8,8,80,80", b"none", 200),  # the huge hole, not blended: nothing charged
        ]:
            before = health(url)["images"]
            content, kind = body(box, blend)
            response = httpx.post(url + "/v1/inpaint", content=content, headers={"content-type": kind}, timeout=60)
            assert response.status_code == status, (box, blend, response.text)
            if status == 413:
                error = response.json()["error"]
                assert "--max-blend-pixels (2000)" in error and "9604 pixels" in error, error
                assert health(url)["images"] == before  # refused before the model ran
        assert get_json(url + "/v1/model")[1]["limits"]["max_blend_pixels"] == 2000


def _quadratic_windows(mask: np.ndarray, train_size: int, margin: int) -> list[Window]:
    """The merge as it was (every pair until nothing changes): the oracle."""
    height, width = mask.shape
    windows = []
    for top, left, bottom, right in hole_boxes(mask):
        t, b = _span(top - margin, bottom + margin, train_size, height)
        l, r = _span(left - margin, right + margin, train_size, width)
        windows.append(Window(t, l, b - t, r - l))
    merged = True
    while merged:
        merged = False
        for i in range(len(windows)):
            for j in range(i + 1, len(windows)):
                if windows[i].overlaps(windows[j]):
                    windows[i] = windows[i].union(windows.pop(j))
                    merged = True
                    break
            if merged:
                break
    return windows


def test_crop_windows_match_the_pairwise_merge():
    rng = np.random.default_rng(0)
    key = lambda w: (w.top, w.left, w.height, w.width)
    for _ in range(80):
        height, width = (int(v) for v in rng.integers(8, 200, 2))
        mask = (rng.random((height, width)) < rng.choice([0.001, 0.005, 0.02])).astype(np.float32)
        train_size, margin = int(rng.integers(4, 48)), int(rng.integers(0, 12))
        expected = sorted(_quadratic_windows(mask, train_size, margin), key=key)
        assert sorted(crop_windows(mask, train_size, margin), key=key) == expected
        covered = np.zeros(mask.shape, int)
        for window in expected:
            covered[window.region] += 1
        assert (covered[mask > 0.5] == 1).all()  # every hole pixel in exactly one window


def test_cost_estimate_follows_the_plan():
    mask = np.zeros((300, 400), np.float32)
    for y, x in ((10, 10), (10, 300), (250, 150)):
        mask[y : y + 5, x : x + 5] = 1
    crop = estimate_cost(mask, "crop", 32, 4, batch=2)
    windows = plan_windows(mask, "crop", 32)
    assert crop.holes == 3 and crop.windows == len(windows) == 3
    assert crop.model_pixels == sum(w.height * w.width for w in windows)  # multiples of 4 already
    full = estimate_cost(mask, "full", 32, 4)
    assert full.windows == 1 and full.model_pixels == 300 * 400 and full.peak_bytes > crop.peak_bytes
    assert full.holes == 3 and full.describe().startswith("3 holes, 1 model windows")  # counted with no limit too
    with pytest.raises(SizeLimitError, match="available memory"):
        check_cost(full, max_bytes=full.peak_bytes - 1)
    assert check_cost(full, max_bytes=full.peak_bytes) is full
    assert estimate_cost(np.zeros((8, 8), np.float32), "full", 32, 4).windows == 0


# ----------------------------------------------------------------------------- shutdown


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_cleanly_with_its_exit_status(exported_model, subprocess_env, sig, code):
    args = ["--model", str(exported_model.folder), "--provider", "cpu", "--read-timeout", "30"]
    with serve_process(args, subprocess_env) as (url, _, process):
        wait_ready(url)
        body, kind = upload()
        uploading = raw_post(url, body, kind, send=10)  # a slow upload in progress
        time.sleep(0.2)
        started = time.monotonic()
        process.send_signal(sig)
        status, _, answer = read_response(uploading, timeout=20)
        assert status == 503 and "shutting down" in json.loads(answer)["error"]
        assert process.wait(20) == code
        assert time.monotonic() - started < 10  # did not wait for the slow uploader
    stderr = process.stderr.read() if process.stderr else ""
    assert "Traceback" not in stderr and "Aborted" not in stderr, stderr
    assert f"{sig.name}: stopping" in stderr and stderr.rstrip().endswith("stopped")


@pytest.mark.slow
def test_a_second_signal_exits_at_once(exported_model, subprocess_env):
    args = ["--model", str(exported_model.folder), "--provider", "cpu", "--shutdown-timeout", "60"]
    args += ["--max-model-pixels", "20000000"]  # the 2048 px request below must run, not be refused (413)
    with serve_process(args, subprocess_env) as (url, _, process):
        wait_ready(url)
        # A big full-image request keeps the model busy while the signals come.
        image = encode(textured_rgb(2048, 2048))
        body, kind = multipart(
            [("image", "i.png", image), ("boxes", None, b"10,10,500,500"), ("strategy", None, b"full")]
        )
        busy = raw_post(url, body, kind)
        deadline = time.monotonic() + 20
        # Until the model thread has taken it (in flight, no longer queued): then it runs for seconds.
        while not ((state := health(url))["in_flight"] >= 1 and state["queued"] == 0):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        # Long enough for the first to be handled (two pending SIGINTs would merge into one), short
        # enough that the tiny test model's request is still running.
        time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(10) == 130
        busy.settimeout(10)
        try:
            leftover = busy.recv(65536)
        except ConnectionResetError:
            leftover = b""
        # No answer, the real one, or (still queued at the first signal) 503 JSON; never a 500.
        assert leftover == b"" or leftover.startswith(b"HTTP/1.1 200") or (
            leftover.startswith(b"HTTP/1.1 503") and b'{"error":' in leftover
        ), leftover[:200]
    stderr = process.stderr.read() if process.stderr else ""
    assert "Traceback" not in stderr and "again, exiting now" in stderr, stderr


@pytest.mark.slow
def test_bench_serve_hostile_runs_and_reports(exported_model):
    from gantool.tools.bench_hostile import bench_serve_hostile

    result = bench_serve_hostile(
        exported_model.folder, requests=4, concurrency=1, size=64, trickling=2, rounds=1, provider="cpu", timeout_s=300
    )
    assert [row["hostile"] for row in result["per_round"]] == [False, True]
    assert all(row["ok"] == 4 and row["errors"] == 0 for row in result["per_round"])
    assert result["per_round"][1]["trickled_bytes"] > 0  # the slow clients really sent
    assert result["holes"]["count"] == 1000 and result["holes"]["many_status"] == 413  # over --max-holes
    assert result["healthz_keepalive_ms"]["median"] > 0 and result["rss_mb"]["peak"] > 0
    assert set(result["goals"]) == {"hostile_throughput", "healthz_keepalive", "many_holes"}


@pytest.mark.slow
def test_bench_serve_holes_and_memory_run_through_the_cli(exported_model):
    # --holes: the 1,000-hole request is refused (over the default --max-holes) and the one-hole one answered.
    result = CliRunner().invoke(
        cli, ["bench", "serve", str(exported_model.folder), "--holes", "1000", "--size", "256", "--rounds", "2",
              "--provider", "cpu", "--backend", "onnx", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    holes = json.loads(result.output)
    assert holes["statuses"] == {"one": [200], "many": [413]} and "--max-holes (500)" in holes["many_answer"]
    assert holes["rounds"] == 2 and holes["many_ms"]["median"] > 0
    assert set(holes["stages_ms"]) >= {"mask decode", "hole count", "image decode (skipped when refused)"}
    # --memory: every strategy's largest request answered, peak RSS read from /proc and set against the bound.
    result = CliRunner().invoke(
        cli, ["bench", "serve", str(exported_model.folder), "--memory", "--size", "192", "--concurrency", "2",
              "--rounds", "1", "--provider", "cpu", "--backend", "onnx"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for strategy in ("full", "crop", "resize"):
        row = next(line for line in result.output.splitlines() if line.startswith(f"| {strategy} "))
        assert "| 2 / 2 |" in row and "| yes |" in row, result.output
    assert "-> met" in result.output

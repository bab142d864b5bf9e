"""Every answer the server can send carries the same headers: ``nosniff``, an ``X-Request-ID``
(the client's valid one echoed, else a new one), and for an allowed ``Origin`` the CORS headers
a page needs to read it; the access log writes one line per request; warnings name the request.
A real server on a loopback port, raw sockets for the answers sent before the headers are parsed."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")

from gantool import Inpainter
from gantool.serving import answers
from gantool.serving.app import build_app
from gantool.serving.settings import ServeSettings
from inpaint_helpers import exported_model, textured_rgb  # noqa: F401 (fixture)
from serve_helpers import (  # noqa: F401 (inpainter, gated: fixtures)
    encode,
    gated,
    inpainter,
    multipart,
    raw_connect,
    read_response,
    running_server,
    wait_ready,
)

ORIGIN = "http://app.example:3000"
KEY = "s3cret"


def _png_form(h: int = 32, w: int = 32, mask_hw: tuple[int, int] | None = None, **texts: str) -> tuple[bytes, str]:
    mh, mw = mask_hw or (h, w)
    mask = np.zeros((mh, mw), np.uint8)
    mask[2:10, 2:10] = 255
    fields = [("image", "i.png", encode(textured_rgb(h, w))), ("mask", "m.png", encode(mask))]
    fields += [(name, None, value.encode()) for name, value in texts.items()]
    return multipart(fields)


def _request(method: str, path: str, body: bytes = b"", kind: str = "", headers: str = "", length: bool = True) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {ORIGIN}\r\n"
    if kind:
        head += f"Content-Type: {kind}\r\n"
    if length and method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    return (head + headers + "\r\n").encode() + body


def _form_request(form: Callable[[], tuple[bytes, str]], extra: str = "") -> bytes:
    body, kind = form()
    return _request("POST", "/v1/inpaint", body, kind, f"Authorization: Bearer {KEY}\r\n{extra}")


def _many_holes() -> tuple[bytes, str]:
    mask = np.zeros((32, 32), np.uint8)
    mask[::4, ::4] = 255  # 64 separate holes, over the fixture's --max-holes 8
    return multipart([("image", "i.png", encode(textured_rgb(32, 32))), ("mask", "m.png", encode(mask))])


# (expected status, the raw request). Each one is sent on a fresh connection.
CASES: dict[str, tuple[int, Callable[[], bytes]]] = {
    "200": (200, lambda: _form_request(_png_form)),
    "200 get": (200, lambda: _request("GET", "/healthz")),
    "400 bad image": (
        400,
        lambda: _form_request(lambda: multipart([("image", "i.png", b"not an image"), ("mask", "m.png", b"x")])),
    ),
    "401": (401, lambda: _request("POST", "/v1/inpaint", *_png_form())),
    "403": (403, lambda: _request("GET", "/healthz").replace(ORIGIN.encode(), b"http://evil.example")),
    "404": (404, lambda: _request("GET", "/nowhere")),
    "405": (405, lambda: _request("GET", "/v1/inpaint", headers=f"Authorization: Bearer {KEY}\r\n")),
    "411": (
        411,
        lambda: _request("POST", "/v1/inpaint", headers=f"Authorization: Bearer {KEY}\r\n", length=False).replace(
            b"HTTP/1.1", b"HTTP/1.0", 1
        ),
    ),
    "400 not a form": (
        400,
        lambda: _request("POST", "/v1/inpaint", b"x=1", "text/plain", f"Authorization: Bearer {KEY}\r\n"),
    ),
    "413": (413, lambda: _form_request(_many_holes)),  # over --max-holes
    "422": (422, lambda: _form_request(lambda: _png_form(format="webp", h=4, w=16400))),
    "431": (431, lambda: _request("GET", "/healthz", headers="X-Big: " + "a" * 5000 + "\r\n")),
}


@pytest.fixture(scope="module")
def server(inpainter: Inpainter):
    settings = ServeSettings(
        api_key=KEY, cors_origins=(ORIGIN,), max_pixels=40_000_000, max_header_kb=4, read_timeout=1.0, max_holes=8
    )
    with running_server(build_app(inpainter, settings)) as (url, _):
        wait_ready(url)
        yield url


def _send(url: str, raw: bytes, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    sock = raw_connect(url)
    try:
        sock.sendall(raw)
        return read_response(sock, timeout=timeout)
    finally:
        sock.close()


@pytest.mark.parametrize("case", list(CASES))
def test_every_status_carries_the_common_headers(server: str, case: str) -> None:
    expected, make = CASES[case]
    status, headers, body = _send(server, make())
    assert status == expected, (case, body[:300])
    assert headers.get("x-content-type-options") == "nosniff", headers
    assert re.fullmatch(r"[0-9a-f]{32}", headers.get("x-request-id", "")), headers
    if status >= 400:
        assert json.loads(body)["error"], body
    if status == 403:  # a foreign page: no CORS headers for it
        assert "access-control-allow-origin" not in headers
    else:
        # Before the fix 401, 413, 431 and 400 had no Access-Control-Allow-Origin: the page could not read why.
        assert headers.get("access-control-allow-origin") == ORIGIN, (case, headers)
        assert "x-request-id" in headers.get("access-control-expose-headers", "").lower(), headers


@pytest.mark.parametrize("case", ["200", "401", "413", "431"])
def test_a_valid_client_request_id_is_echoed_and_an_invalid_one_replaced(server: str, case: str) -> None:
    _, make = CASES[case]
    raw = make()
    given = raw.replace(b"\r\nHost:", b"\r\nX-Request-ID: job-42.a:b\r\nHost:", 1)
    assert _send(server, given)[1]["x-request-id"] == "job-42.a:b"
    hostile = raw.replace(b"\r\nHost:", b"\r\nX-Request-ID: a b<script>\r\nHost:", 1)
    replaced = _send(server, hostile)[1]["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", replaced)


def test_a_busy_server_answers_503_and_408_with_the_same_headers(inpainter: Inpainter, gated) -> None:
    """The 503 of admission and the 408 of a silent client carry them too."""
    settings = ServeSettings(max_queue=1, cors_origins=(ORIGIN,), read_timeout=1.0)
    with running_server(build_app(inpainter, settings)) as (url, _):
        wait_ready(url)
        gated.gate.clear()
        gated.entered.clear()
        body, kind = _png_form()
        first = raw_connect(url)
        first.sendall(_request("POST", "/v1/inpaint", body, kind))
        assert gated.entered.wait(30), "the first request never reached the model"
        status, headers, _ = _send(url, _request("POST", "/v1/inpaint", body, kind))
        assert status == 503 and headers["retry-after"] == "1"
        assert headers["access-control-allow-origin"] == ORIGIN and headers["x-request-id"]
        silent = raw_connect(url)
        silent.sendall(_request("POST", "/v1/inpaint", body, kind)[: -len(body) // 2])
        status, headers, _ = read_response(silent, timeout=10)
        assert status == 408 and headers["access-control-allow-origin"] == ORIGIN and headers["x-request-id"]
        silent.close()
        gated.gate.set()
        assert read_response(first, timeout=30)[0] == 200
        first.close()


def test_the_hole_count_is_in_the_answer_and_zero_says_no_hole(server: str) -> None:
    status, headers, _ = _send(server, _form_request(_png_form))
    assert status == 200 and headers["x-gantool-holes"] == "1"
    empty = np.zeros((32, 32), np.uint8)
    form = multipart([("image", "i.png", encode(textured_rgb(32, 32))), ("mask", "m.png", encode(empty))])
    status, headers, _ = _send(server, _form_request(lambda: form))
    assert status == 200 and headers["x-gantool-holes"] == "0"


def test_the_access_log_writes_one_line_per_request(inpainter: Inpainter, monkeypatch) -> None:
    stream = io.StringIO()
    real = answers.AccessLog.__init__
    monkeypatch.setattr(answers.AccessLog, "__init__", lambda self, fmt="off", s=None: real(self, fmt, stream))
    with running_server(build_app(inpainter, ServeSettings(access_log="json", cors_origins=(ORIGIN,)))) as (url, _):
        wait_ready(url)
        stream.seek(0)
        stream.truncate()
        _send(url, _form_request(_png_form).replace(b"\r\nHost:", b"\r\nX-Request-ID: r-1\r\nHost:", 1))
        _send(url, _request("GET", "/nowhere"))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    done = {line["request_id"]: line for line in lines}
    assert done["r-1"]["status"] == 200 and done["r-1"]["holes"] == 1 and done["r-1"]["path"] == "/v1/inpaint"
    assert done["r-1"]["bytes_in"] > 0 and done["r-1"]["bytes_out"] > 0 and done["r-1"]["ms"] >= 0
    assert any(line["status"] == 404 and line["path"] == "/nowhere" for line in lines)


def test_a_warning_names_its_request(caplog) -> None:
    import logging

    answers.install_request_id_filter()
    token = answers.request_id_var.set("req-7")
    try:
        logging.getLogger("gantool.core.processing").warning("blend: the hole covers more than 99 %")
    finally:
        answers.request_id_var.reset(token)
    assert any(r.getMessage().startswith("[request req-7] blend:") for r in caplog.records), caplog.records


@pytest.mark.parametrize(
    "origin", ["http://localhost:{port}", "http://127.0.0.1:{port}/", "HTTP://127.0.0.1:{port}"]
)
def test_the_servers_own_page_is_one_origin_however_it_is_spelled(server: str, origin: str) -> None:
    # Before the fix each was 403: Origin was compared as a string with "http://" + Host.
    port = server.rsplit(":", 1)[1]
    request = _request("GET", "/healthz").replace(b"Host: 127.0.0.1", f"Host: 127.0.0.1:{port}".encode())
    assert _send(server, request.replace(ORIGIN.encode(), origin.format(port=port).encode()))[0] == 200
    assert _send(server, request.replace(ORIGIN.encode(), b"http://localhost:1"))[0] == 403


def test_a_mask_of_another_size_is_refused_from_the_headers(server: str, monkeypatch) -> None:
    """A 6000 x 6000 1-bit mask (a few kB) with a 128 x 96 image: refused before either is decoded."""
    # Before the fix the mask was decoded in full and its holes counted (2.5 s) before the sizes were compared.
    from PIL import Image

    from gantool.serving import app as app_module

    def no_decode(*args, **kwargs):
        raise AssertionError("the mask was decoded")

    monkeypatch.setattr(app_module, "mask_to_array", no_decode)  # the server runs in this process
    big = Image.new("1", (6000, 6000), 0)
    buffer = io.BytesIO()
    big.save(buffer, format="PNG")
    assert len(buffer.getvalue()) < 100_000
    form = multipart([("image", "i.png", encode(textured_rgb(96, 128))), ("mask", "m.png", buffer.getvalue())])
    status, _, body = _send(server, _form_request(lambda: form))
    assert status == 400, body
    assert "6000x6000" in json.loads(body)["error"] and "128x96" in json.loads(body)["error"]


def test_a_blank_api_key_in_the_environment_is_named_as_such(monkeypatch) -> None:
    # Before the fix an all-blank GANTOOL_API_KEY was reported as "--api-key has spaces around it".
    from click.testing import CliRunner

    from gantool.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--port", "0"], env={"GANTOOL_API_KEY": "   "})
    assert result.exit_code == 1 and "GANTOOL_API_KEY is blank" in result.output, result.output
    result = CliRunner().invoke(cli, ["serve", "--port", "0", "--api-key", " k "])
    assert result.exit_code == 1 and "--api-key has spaces around it" in result.output, result.output


def test_a_websocket_upgrade_is_answered_as_http_without_a_warning(server: str) -> None:
    # Before the fix each attempt logged uvicorn's "No supported WebSocket library detected".
    raw = _request("GET", "/healthz", headers="Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n")
    import logging

    records: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("uvicorn.error").addHandler(catcher)  # uvicorn's loggers do not propagate
    try:
        status, headers, _ = _send(server, raw)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(catcher)
    assert status == 200 and headers["x-request-id"]
    assert not [r for r in records if "WebSocket" in r.getMessage() or "upgrade" in r.getMessage()], records


def test_a_short_shutdown_timeout_is_kept_and_its_cut_off_said_in_gantools_words(inpainter, gated) -> None:
    # Before the fix 0.5 s was rounded up to 1 s, and uvicorn logged "ERROR: Cancel 1 running task(s)".
    from gantool.serving.server import make_server

    settings = ServeSettings(shutdown_timeout=0.5)
    app = build_app(inpainter, settings)
    assert make_server(app, settings).config.timeout_graceful_shutdown == 0.5
    import logging

    records: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = records.append  # type: ignore[method-assign]
    with running_server(app) as (url, server_object):
        wait_ready(url)
        # After the server's start: its logging config resets this logger's handlers; it does not propagate.
        logging.getLogger("uvicorn.error").addHandler(catcher)
        gated.gate.clear()
        gated.entered.clear()
        body, kind = _png_form()
        running = raw_connect(url)
        running.sendall(_request("POST", "/v1/inpaint", body, kind).replace(ORIGIN.encode(), b"http://127.0.0.1"))
        assert gated.entered.wait(30)
        server_object.should_exit = True  # what the first signal does
        status, _, answer = read_response(running, timeout=30)
        running.close()
        gated.gate.set()
    assert status == 503 and json.loads(answer)["error"] == "the server is shutting down"
    logging.getLogger("uvicorn.error").removeHandler(catcher)
    said = [(r.levelname, r.getMessage()) for r in records]
    assert ("WARNING", "shutdown: 1 running request(s) answered 503 at the end of --shutdown-timeout") in said, said
    assert not [line for line in said if line[0] == "ERROR"], said


def test_a_part_header_too_long_says_why(server: str) -> None:
    # Before the fix a 5000-character file name got "Invalid multipart data.".
    form = multipart([("image", "x" * 5000 + ".png", encode(textured_rgb(32, 32)))])
    status, _, body = _send(server, _form_request(lambda: form))
    error = json.loads(body)["error"]
    assert status == 400 and "Maximum header size exceeded" in error and "file name" in error, error


@pytest.mark.parametrize(
    ("case", "needle"),
    [("many boxes", "Too many fields"), ("empty mask part", "mask"), ("empty strategy", "strategy")],
)
def test_the_documented_form_limits_hold(server: str, case: str, needle: str) -> None:
    image = ("image", "i.png", encode(textured_rgb(32, 32)))
    fields = {
        "many boxes": [image, *[("boxes", None, b"1,1,2,2")] * 257],
        "empty mask part": [image, ("mask", "", b"")],
        "empty strategy": [image, ("boxes", None, b"1,1,4,4"), ("strategy", None, b"")],
    }[case]
    status, _, body = _send(server, _form_request(lambda: multipart(fields)))
    assert status == 400 and needle in json.loads(body)["error"], body


def test_the_crafted_upload_benchmark_measures_every_case(inpainter: Inpainter) -> None:
    from gantool.tools.bench_crafted import CRAFTED_MAX_BYTES, bench_serve_crafted

    with running_server(build_app(inpainter, ServeSettings())) as (url, _):  # the default limits
        result = bench_serve_crafted([url], rounds=1, timeout_s=300)
    status = {row["case"]: row["status"] for row in result["rows"]}
    assert status == {
        "mask 6000x6000 (1-bit) for an image of 128x96": "400",
        "image and mask 6000x6000 (1-bit), strategy=full": "413",
        "mask of 250,000 one-pixel holes (2000x2000, 1-bit)": "413",
        "image 20000x1, format=webp": "422",
        "image header 10000x10000 (over --max-pixels)": "413",
        "PNG header 1x200000, 4 rows of data": "400",
    }, status
    assert all(row["bytes"] < CRAFTED_MAX_BYTES and row["median_ms"] > 0 for row in result["rows"])
    assert set(result["goal"]) == {"max_refused_median_ms", "measured", "met"}


def test_a_full_strategy_over_the_model_pixels_is_refused_from_the_header(server: str, monkeypatch) -> None:
    # Before the fix both 6000 x 6000 files (16 kB) were decoded in full (1.3 s) before the cost check's 413.
    from PIL import Image

    from gantool.serving import app as app_module

    def no_decode(*args, **kwargs):
        raise AssertionError("an upload was decoded")

    monkeypatch.setattr(app_module, "read_image", no_decode)
    big = io.BytesIO()
    Image.new("1", (6000, 6000), 0).save(big, format="PNG")
    form = multipart([("image", "i.png", big.getvalue()), ("mask", "m.png", big.getvalue()), ("strategy", None, b"full")])
    status, _, body = _send(server, _form_request(lambda: form))
    assert status == 413, body
    assert "over --max-model-pixels" in json.loads(body)["error"] and "36000000" in json.loads(body)["error"]

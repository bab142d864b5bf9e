"""gantool serve: the API (FastAPI's TestClient, and a real uvicorn server on a
loopback port for batching and backpressure), one test per rule of issue #12."""

from __future__ import annotations

import re
import struct
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed")

with warnings.catch_warnings():  # starlette's TestClient warns about httpx's future; not ours
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from gantool import Inpainter
from gantool.cli import cli
from gantool.inference.inpainter import inpaint_images
from gantool.serving.app import build_app
from gantool.serving.settings import ServeSettings, is_loopback
from inpaint_helpers import exported_model, textured_rgb  # noqa: F401 (fixture)
from serve_helpers import (  # noqa: F401 (inpainter, gated: fixtures)
    GatedBackend,
    decode,
    encode,
    gated,
    get_json,
    inpainter,
    live_server,
    serve_process,
    wait_ready,
)


@pytest.fixture
def make_client(inpainter: Inpainter) -> Iterator[Callable[..., TestClient]]:
    """``make_client(**settings)``: a started TestClient whose warm-up is done."""
    clients: list[TestClient] = []

    def make(wait: bool = True, **settings: Any) -> TestClient:
        client = TestClient(
            build_app(inpainter, ServeSettings(**settings)),
            raise_server_exceptions=False,
        )
        client.__enter__()
        clients.append(client)
        if wait:
            deadline = time.monotonic() + 60
            while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def post(client: Any, image: bytes, mask: bytes | None = None, **data: Any) -> Any:
    files = {"image": ("image.png", image, "application/octet-stream")}
    if mask is not None:
        files["mask"] = ("mask.png", mask, "application/octet-stream")
    return client.post("/v1/inpaint", files=files, data=data)


def rgb_and_mask(height: int = 40, width: int = 48, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rgb = textured_rgb(height, width, seed)
    hole = np.zeros((height, width), bool)
    hole[10:22, 12:30] = True
    return rgb, hole


def assert_only_holes_changed(result: np.ndarray, original: np.ndarray, hole: np.ndarray) -> None:
    changed = (result != original).reshape(*hole.shape, -1).any(axis=-1)
    assert not changed[~hole].any(), "a known pixel changed"
    assert changed[hole].mean() > 0.5, "the hole was not filled"


# ---------------------------------------------------------------------------------- results


def test_inpaint_with_a_mask_keeps_size_and_known_pixels(client: TestClient, inpainter: Inpainter):
    rgb, hole = rgb_and_mask()
    response = post(client, encode(rgb), encode((hole * 255).astype(np.uint8)))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    result = decode(response.content)
    assert result.size == (48, 40) and result.mode == "RGB"
    assert_only_holes_changed(np.asarray(result), rgb, hole)
    # The same strategy code as the library: identical to Inpainter.inpaint.
    expected = inpainter.inpaint(rgb, (hole * 255).astype(np.uint8))
    assert np.array_equal(np.asarray(result), np.asarray(expected))


def test_boxes_are_repeatable_and_combine_with_the_mask(client: TestClient):
    rgb, hole = rgb_and_mask()
    response = client.post(
        "/v1/inpaint",
        files={
            "image": ("i.png", encode(rgb)),
            "mask": ("m.png", encode((hole * 255).astype(np.uint8))),
        },
        data={"boxes": ["2,30,6,5", "40,2,5,6"]},
    )
    assert response.status_code == 200, response.text
    expected = hole.copy()
    expected[30:35, 2:8] = True
    expected[2:8, 40:45] = True
    assert_only_holes_changed(np.asarray(decode(response.content)), rgb, expected)


def test_alpha_marks_the_holes_without_a_mask(client: TestClient):
    rgb, hole = rgb_and_mask()
    rgba = np.dstack([rgb, np.where(hole, 0, 255).astype(np.uint8)])
    response = post(client, encode(rgba))
    assert response.status_code == 200, response.text
    assert_only_holes_changed(np.asarray(decode(response.content)), rgb, hole)


def test_a_zero_one_mask_is_read_like_the_cli(client: TestClient):
    rgb, hole = rgb_and_mask()
    zero_one = hole.astype(np.uint8)
    response = post(client, encode(rgb), encode(zero_one))
    assert response.status_code == 200, response.text
    assert_only_holes_changed(np.asarray(decode(response.content)), rgb, hole)


def test_webp_is_lossless(client: TestClient):
    rgb, hole = rgb_and_mask()
    response = post(client, encode(rgb), encode((hole * 255).astype(np.uint8)), format="webp")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/webp"
    assert response.content[:4] == b"RIFF" and response.content[8:12] == b"WEBP"
    result = decode(response.content)
    assert_only_holes_changed(np.asarray(result.convert("RGB")), rgb, hole)


def test_exif_rotated_upload_comes_back_upright(client: TestClient):
    stored = textured_rgb(32, 48)  # stored 48 wide; orientation 6 shows it 32 wide, 48 high
    exif = Image.Exif()
    exif[0x0112] = 6
    jpeg = encode(stored, "JPEG", quality=95, exif=exif.tobytes())
    from gantool.core.processing import read_image

    upright = np.asarray(read_image(__import__("io").BytesIO(jpeg)))
    assert upright.shape[:2] == (48, 32)
    hole = np.zeros((48, 32), bool)
    hole[10:20, 8:20] = True
    response = post(client, jpeg, encode((hole * 255).astype(np.uint8)))
    assert response.status_code == 200, response.text
    result = np.asarray(decode(response.content))
    assert result.shape == (48, 32, 3)
    assert_only_holes_changed(result, upright, hole)


def test_sixteen_bit_grey_stays_sixteen_bit(client: TestClient):
    grey = (textured_rgb(32, 32)[..., 0].astype(np.uint16) * 257).astype(np.uint16)
    hole = np.zeros((32, 32), bool)
    hole[8:20, 8:20] = True
    response = post(client, encode(Image.fromarray(grey)), encode((hole * 255).astype(np.uint8)))
    assert response.status_code == 200, response.text
    result = decode(response.content)
    assert result.mode in ("I;16", "I")
    assert_only_holes_changed(np.asarray(result).astype(np.uint16)[..., None], grey[..., None], hole)
    assert (
        post(
            client,
            encode(Image.fromarray(grey)),
            encode((hole * 255).astype(np.uint8)),
            format="webp",
        ).status_code
        == 422  # the image is fine; WebP cannot hold it (refused before the model runs)
    )


def test_images_that_cannot_come_back_unchanged_are_refused_like_the_cli(client: TestClient):
    _, hole = rgb_and_mask()
    float_image = Image.fromarray(np.random.default_rng(0).random((40, 48), dtype=np.float32))
    response = post(client, encode(float_image, "TIFF"), encode((hole * 255).astype(np.uint8)))
    assert response.status_code == 400, response.text
    assert "mode F" in response.json()["error"]


def test_a_mask_without_holes_returns_the_image_unchanged(client: TestClient):
    rgb, _ = rgb_and_mask()
    response = post(client, encode(rgb), encode(np.zeros((40, 48), np.uint8)))
    assert response.status_code == 200, response.text
    assert np.array_equal(np.asarray(decode(response.content)), rgb)


def test_strategy_option_is_used(client: TestClient, inpainter: Inpainter):
    rgb = textured_rgb(100, 120)
    hole = np.zeros((100, 120), bool)
    hole[40:50, 50:60] = True
    mask = (hole * 255).astype(np.uint8)
    for strategy in ("crop", "resize"):
        response = post(client, encode(rgb), encode(mask), strategy=strategy)
        assert response.status_code == 200, response.text
        expected = inpaint_images(
            inpainter.backend,
            [(Image.fromarray(rgb), hole.astype(np.float32))],
            strategy,
        )[0]
        assert np.array_equal(np.asarray(decode(response.content)), np.asarray(expected)), strategy


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("not an image", "not an image"),
        ("truncated", "cannot read the uploaded image"),
        ("data ends early", "image file is truncated"),
        ("mask of another size", "mask"),
        ("no mask and no alpha", "no mask"),
        ("bad box", "X,Y,W,H"),
        ("box outside", "outside"),
        ("bad strategy", "strategy"),
        ("bad format", "format"),
        ("missing image", "image"),
    ],
)
def test_bad_input_is_a_400_json_error(client: TestClient, case: str, needle: str):
    rgb, hole = rgb_and_mask()
    image, mask, data = encode(rgb), encode((hole * 255).astype(np.uint8)), {}
    if case == "not an image":
        image = b"this is not an image"
    elif case == "truncated":
        image = image[: len(image) // 2]
    elif case == "data ends early":  # a whole zlib stream holding fewer rows than the header says
        raw = zlib.decompress(b"".join(_png_chunks(image, b"IDAT")))
        image = _with_idat(image, zlib.compress(raw[: len(raw) // 2]))
    elif case == "mask of another size":
        mask = encode(np.zeros((10, 10), np.uint8))
    elif case == "no mask and no alpha":
        mask = None
    elif case == "bad box":
        mask, data = None, {"boxes": "1,2,three,4"}
    elif case == "box outside":
        mask, data = None, {"boxes": "500,500,4,4"}
    elif case == "bad strategy":
        data = {"strategy": "magic"}
    elif case == "bad format":
        data = {"format": "jpeg"}
    if case == "missing image":
        response = client.post("/v1/inpaint", data={"strategy": "auto"})
    else:
        response = post(client, image, mask, **data)
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"} and needle in body["error"]
    assert "\n" not in body["error"] and "Traceback" not in response.text
    assert "--box" not in body["error"]  # the API's field is `boxes` (said `--box` before)


def _png_chunks(png: bytes, kind: bytes) -> list[bytes]:
    """The data of ``png``'s chunks of type ``kind``, in order."""
    found, at = [], 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        if png[at + 4 : at + 8] == kind:
            found.append(png[at + 8 : at + 8 + length])
        at += 12 + length
    return found


def _with_idat(png: bytes, data: bytes) -> bytes:
    """``png`` with its image data replaced by one IDAT chunk of ``data``."""
    chunks, at = [], 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind = png[at + 4 : at + 8]
        if kind == b"IEND":
            chunks.append(struct.pack(">I", len(data)) + b"IDAT" + data + struct.pack(">I", zlib.crc32(b"IDAT" + data)))
        if kind != b"IDAT":
            chunks.append(png[at : at + 12 + length])
        at += 12 + length
    return png[:8] + b"".join(chunks)


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height but whose data is a few bytes: a bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [(3000, 3000), (100_000, 100_000)])  # under / over Pillow's own bomb limit
def test_pixel_bomb_is_413_before_decoding(make_client: Callable[..., TestClient], size: tuple[int, int]):
    client = make_client(max_pixels=1_000_000)
    bomb = _png_header(*size)
    # Decoding would fail as truncated (400): a 413 shows the header's size was checked first.
    response = post(client, bomb, encode(np.zeros((8, 8), np.uint8)))
    assert response.status_code == 413, response.text
    assert "limit" in response.json()["error"]
    rgb, _ = rgb_and_mask()
    response = post(client, encode(rgb), bomb)  # a bomb as the mask
    assert response.status_code == 413, response.text
    assert client.get("/healthz").json()["images"] == 0


def test_image_over_max_pixels_is_413(make_client: Callable[..., TestClient]):
    client = make_client(max_pixels=40 * 48 - 1)
    rgb, hole = rgb_and_mask()
    assert post(client, encode(rgb), encode((hole * 255).astype(np.uint8))).status_code == 413


def test_declared_body_over_the_limit_is_413(make_client: Callable[..., TestClient]):
    client = make_client(max_upload_mb=0.01)  # 10 KiB
    noise = np.random.default_rng(0).integers(0, 256, (100, 100, 3), dtype=np.uint8)  # ~30 KB as PNG
    response = post(client, encode(noise))
    assert response.status_code == 413, response.text
    assert "0.01 MB" in response.json()["error"]
    assert client.get("/healthz").json()["in_flight"] == 0


def test_streamed_body_over_the_limit_is_413(make_client: Callable[..., TestClient]):
    client = make_client(max_upload_mb=0.01)
    boundary = "gantoolboundary"
    payload = np.random.default_rng(1).integers(0, 256, 30_000, dtype=np.uint8).tobytes()

    def chunks() -> Iterator[bytes]:  # no Content-Length: the size is only known while reading
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        for start in range(0, len(payload), 4096):
            yield payload[start : start + 4096]
        yield f"\r\n--{boundary}--\r\n".encode()

    response = client.post(
        "/v1/inpaint",
        content=chunks(),
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert response.status_code == 413, response.text
    assert set(response.json()) == {"error"}


def test_api_key(make_client: Callable[..., TestClient]):
    client = make_client(api_key="s3cret")
    rgb, hole = rgb_and_mask()
    files = {
        "image": ("i.png", encode(rgb)),
        "mask": ("m.png", encode((hole * 255).astype(np.uint8))),
    }
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"X-API-Key": "s3cre"},
        {"Authorization": "s3cret"},
    ):
        response = client.post("/v1/inpaint", files=files, headers=headers)
        assert response.status_code == 401, headers
        assert "API key" in response.json()["error"]
        assert client.get("/v1/model", headers=headers).status_code == 401
    assert client.post("/v1/inpaint", files=files, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.post("/v1/inpaint", files=files, headers={"X-API-Key": "s3cret"}).status_code == 200
    assert client.get("/v1/model", headers={"X-API-Key": "s3cret"}).json()["api_key_required"] is True
    for open_path in ("/healthz", "/readyz", "/"):  # probes and the page need no key
        assert client.get(open_path).status_code == 200


def test_wrong_path_and_method_are_json(client: TestClient):
    response = client.get("/v2/whatever")
    assert response.status_code == 404 and "no such path" in response.json()["error"]
    response = client.get("/v1/inpaint")
    assert response.status_code == 405 and "GET" in response.json()["error"]
    assert "POST" in response.headers["allow"]
    assert client.delete("/v1/model").status_code == 405
    # Only the page's own files are served: no path from the client reaches the disk.
    for path in (
        "/static/../serve.py",
        "/app.js/../../serve.py",
        "/..%2Fserve.py",
        "/index.html",
    ):
        assert client.get(path).status_code == 404, path


def test_unexpected_errors_are_one_json_line(gated: GatedBackend, client: TestClient, monkeypatch):
    rgb, hole = rgb_and_mask()
    mask = encode((hole * 255).astype(np.uint8))
    # A decoder blowing up with an odd exception on a crafted upload is still bad input.
    import gantool.serving.app

    real_read = gantool.serving.app.read_image
    monkeypatch.setattr(
        gantool.serving.app,
        "read_image",
        lambda *a, **k: (_ for _ in ()).throw(struct.error("bad")),
    )
    response = post(client, encode(rgb), mask)
    assert response.status_code == 400 and response.json() == {"error": "cannot decode the upload: bad"}
    monkeypatch.setattr(gantool.serving.app, "read_image", real_read)
    # A failure inside the model is a 500 with one line, never a traceback.
    gated.fail_with = RuntimeError("kaboom\nsecond line")
    response = post(client, encode(rgb), mask)
    assert response.status_code == 500
    assert set(response.json()) == {"error"} and "Traceback" not in response.text and "second" not in response.text
    gated.fail_with = None
    assert post(client, encode(rgb), mask).status_code == 200  # the worker survived


# ---------------------------------------------------------------------------- other routes


def test_model_health_and_openapi(client: TestClient, inpainter: Inpainter):
    model = client.get("/v1/model").json()
    assert model["backend"] == "onnx" and model["provider"] == "CPUExecutionProvider"
    assert model["precision"] == "fp32" and model["model"].endswith("generator.onnx")
    assert model["metadata"] == inpainter.metadata and model["train_size"] == 32
    assert model["limits"]["max_pixels"] == ServeSettings().max_pixels
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").json() == {"ready": True}
    schema = client.get("/openapi.json").json()
    assert "/v1/inpaint" in schema["paths"] and "post" in schema["paths"]["/v1/inpaint"]
    assert client.get("/docs").status_code == 200


def test_readyz_waits_for_the_warm_up(make_client: Callable[..., TestClient], gated: GatedBackend):
    gated.gate.clear()
    client = make_client(wait=False)
    assert gated.entered.wait(30)  # the warm-up inference is running
    response = client.get("/readyz")
    assert response.status_code == 503 and response.json()["error"] == "warming up"
    assert client.get("/healthz").status_code == 200  # alive meanwhile
    gated.gate.set()
    deadline = time.monotonic() + 30
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_page_is_served_without_any_external_resource(client: TestClient):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for path in ("/", "/app.js", "/style.css"):
        body = client.get(path).text
        assert "://" not in body.replace("http://www.w3.org", ""), f"{path} refers to another site"
    assert 'src="/app.js"' in page.text and 'href="/style.css"' in page.text


def test_cors_is_off_unless_an_origin_is_given(make_client: Callable[..., TestClient]):
    origin = {"Origin": "http://example.test"}
    assert "access-control-allow-origin" not in make_client().get("/v1/model", headers=origin).headers
    allowed = make_client(cors_origins=("http://example.test",))
    assert allowed.get("/v1/model", headers=origin).headers["access-control-allow-origin"] == "http://example.test"
    preflight = allowed.options("/v1/inpaint", headers={**origin, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 200


# ------------------------------------------------------------------ batching, backpressure


@contextmanager
def _posting(url: str, bodies: list[tuple[bytes, bytes]]) -> Iterator[list[httpx.Response]]:
    """POST each (image, mask) from its own thread; the responses once the block ends."""
    responses: list[httpx.Response] = []

    def send(image: bytes, mask: bytes) -> None:
        responses.append(
            httpx.post(
                url + "/v1/inpaint",
                files={"image": ("i.png", image), "mask": ("m.png", mask)},
                timeout=120,
            )
        )

    threads = [threading.Thread(target=send, args=body) for body in bodies]
    for thread in threads:
        thread.start()
    try:
        yield responses
    finally:
        for thread in threads:
            thread.join(120)


def _wait_for(url: str, **expected: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        health = get_json(url + "/healthz")[1]
        if all(health[k] == v for k, v in expected.items()):
            return
        assert time.monotonic() < deadline, health
        time.sleep(0.02)


def test_concurrent_requests_run_as_one_batch_off_the_event_loop(inpainter: Inpainter, gated: GatedBackend):
    app = build_app(inpainter, ServeSettings(max_batch=3, batch_wait_ms=0, max_queue=8))
    rgb, hole = rgb_and_mask(32, 32)
    mask = encode((hole * 255).astype(np.uint8))
    with live_server(app) as url:
        wait_ready(url)
        gated.gate.clear()
        gated.entered.clear()
        gated.batch_sizes.clear()
        with _posting(url, [(encode(rgb), mask)]) as first:
            assert gated.entered.wait(60)  # the model is busy with the first request
            images = [textured_rgb(32, 32, seed) for seed in (1, 2, 3)]
            with _posting(url, [(encode(image), mask) for image in images]) as rest:
                _wait_for(url, queued=3)
                gated.gate.set()
    assert [r.status_code for r in first + rest] == [200] * 4
    assert gated.batch_sizes == [1, 3]  # the three waiting requests ran as one batch
    assert gated.threads == {"gantool-serve-model"}
    originals = {encode(image): image for image in [rgb, *images]}
    for response in first + rest:
        result = np.asarray(decode(response.content))
        assert any(np.array_equal(result[~hole], o[~hole]) for o in originals.values())


def test_a_full_queue_answers_503_with_retry_after(inpainter: Inpainter, gated: GatedBackend):
    app = build_app(inpainter, ServeSettings(max_batch=1, batch_wait_ms=0, max_queue=2))
    rgb, hole = rgb_and_mask(32, 32)
    body = (encode(rgb), encode((hole * 255).astype(np.uint8)))
    with live_server(app) as url:
        wait_ready(url)
        gated.gate.clear()
        gated.entered.clear()
        with _posting(url, [body]) as running:
            assert gated.entered.wait(60)
            with _posting(url, [body]) as waiting:
                _wait_for(url, in_flight=2, queued=1)
                refused = httpx.post(
                    url + "/v1/inpaint",
                    files={"image": body[0], "mask": body[1]},
                    timeout=60,
                )
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1" and "busy" in refused.json()["error"]
                gated.gate.set()
        _wait_for(url, in_flight=0, queued=0)
    assert [r.status_code for r in running + waiting] == [200, 200]


# ----------------------------------------------------------------------------------- CLI


def test_serve_help():
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    for option in (
        "--max-batch",
        "--batch-wait-ms",
        "--max-upload-mb",
        "--max-pixels",
        "--api-key",
        "--cors-origin",
        "--max-queue",
        "GANTOOL_API_KEY",
    ):
        assert option in result.output


def test_serve_without_the_extra_says_how_to_install(monkeypatch):
    from gantool.cli import serve_cmd

    assert serve_cmd.missing_serve_packages() == []
    monkeypatch.setattr(serve_cmd, "SERVE_MODULES", (("fastapi",), ("a_module_that_is_not_installed", "nor_this")))
    assert serve_cmd.missing_serve_packages() == ["a_module_that_is_not_installed"]
    result = CliRunner().invoke(cli, ["serve"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: " + serve_cmd.INSTALL_HINT
    assert "gantool[serve]" in result.output


def auto_cpu_runtime() -> tuple[str, str]:
    """What --backend auto runs an fp32 ONNX export on, on the CPU: OpenVINO where AUTO_OPENVINO_PRECISIONS
    has fp32 and it is installed (it has not: ONNX Runtime)."""
    from gantool.core.constants import AUTO_OPENVINO_PRECISIONS
    from gantool.runtime.openvino import openvino_available

    on_openvino = "fp32" in AUTO_OPENVINO_PRECISIONS and openvino_available()
    return ("openvino", "CPU") if on_openvino else ("onnx", "CPUExecutionProvider")


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.com")


def test_serve_process_prints_startup_lines_and_warns_without_a_key(exported_model, subprocess_env):
    args = [
        "--model",
        str(exported_model.folder),
        "--host",
        "0.0.0.0",
        "--provider",
        "cpu",
    ]
    with serve_process(args, subprocess_env) as (url, lines, process):
        loopback = url.replace("0.0.0.0", "127.0.0.1")
        wait_ready(loopback)
        status, model = get_json(loopback + "/v1/model")
        backend, provider = auto_cpu_runtime()
        assert status == 200 and model["provider"] == provider
    assert lines[0] == f"model: {exported_model.onnx}"
    assert lines[1].startswith(f"backend: {backend}; precision: fp32 (the model's default); provider: {provider}")
    assert url.startswith("http://0.0.0.0:")
    assert process.stderr is not None
    assert "warning: listening on 0.0.0.0 without an API key" in process.stderr.read()


# ------------------------------------------------------------------------------ bench serve


def test_bench_serve_runs_and_reports(exported_model):
    from gantool.tools.bench_serve import bench_serve

    result = bench_serve(
        exported_model.folder,
        requests=6,
        concurrency=2,
        size=32,
        provider="cpu",
        baseline_images=2,
        distinct_images=3,
        timeout_s=300,
        rounds=3,
    )
    assert result["ok"] == 18 and result["errors"] == 0 and result["sent"] == 18
    backend, provider = auto_cpu_runtime()
    assert result["provider"] == provider and result["backend"] == backend
    latency = result["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
    rounds, baselines = result["per_round"], result["in_process_measurements"]
    assert len(rounds) == 3 and len(baselines) == 4 and all(row["ok"] == 6 for row in rounds)
    for number, row in enumerate(rounds):  # each round against the in-process runs on either side of it
        assert row["in_process_images_per_s"] == pytest.approx((baselines[number] + baselines[number + 1]) / 2)
        assert row["ratio"] == pytest.approx(row["images_per_s"] / row["in_process_images_per_s"])
    ratios = sorted(row["ratio"] for row in rounds)
    assert result["ratio"] == pytest.approx(ratios[1]) and result["ratio_range"] == pytest.approx([ratios[0], ratios[2]])
    assert result["server_images_per_s"] > 0 and result["in_process_png_images_per_s"] > 0
    assert set(result["rss_mb"]) == {"ready", "after_50", "after_all"}
    assert set(result["goals"]) == {"throughput", "rss_stable"}


def test_bench_serve_cli_help_and_bad_options():
    runner = CliRunner()
    result = runner.invoke(cli, ["bench", "serve", "--help"])
    assert result.exit_code == 0
    for option in ("--requests", "--rounds", "--concurrency", "--size", "--timeout", "--json"):
        assert option in result.output
    result = runner.invoke(cli, ["bench", "serve", "--requests", "0"])
    assert result.exit_code == 2 and "--requests" in result.output
    result = runner.invoke(cli, ["bench", "serve", "--rounds", "zero"])
    assert result.exit_code == 2 and "--rounds" in result.output


def test_bench_serve_cli_prints_medians_and_ranges(exported_model):
    result = CliRunner().invoke(
        cli,
        ["bench", "serve", str(exported_model.folder), "--requests", "2", "--rounds", "2", "--size", "32",
         "--concurrency", "1", "--baseline-images", "1", "--provider", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 round(s) of 2 requests of 32 px" in result.output
    assert "| requests ok / errors | 4 / 0 |" in result.output
    ratio_row = next(line for line in result.output.splitlines() if line.startswith("| server / in-process (each"))
    assert re.search(r"\| \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\dx\) \|$", ratio_row), ratio_row

"""The page of `gantool serve` in a real headless Chromium (Debian's package),
driven by Playwright, against `gantool serve` running as a subprocess with a
tiny model on a free loopback port.

Skipped (with the reason) when chromium or playwright is missing, unless the
CI environment variable is set: then it fails, so CI never skips it silently.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from gantool.core.processing import mask_to_array
from inpaint_helpers import exported_model, textured_rgb  # noqa: F401 (fixture)
from serve_helpers import decode, encode, serve_process, wait_ready

API_KEY = "page-test-key"
WIDTH, HEIGHT = 64, 48

# Keeps a copy of what the page sent to and got from /v1/inpaint (Playwright's
# response.body() is empty once the page consumed the answer as a blob, and
# route.fetch() drops a multipart File's bytes).
RECORD_FETCH = """
window.__inpaints = [];
const realFetch = window.fetch.bind(window);
const toBase64 = async (blob) => {
  const bytes = new Uint8Array(await blob.arrayBuffer());
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(text);
};
window.fetch = async (input, init) => {
  const url = typeof input === "string" ? input : input.url;
  const response = await realFetch(input, init);
  if (url.includes("/v1/inpaint")) {
    const record = {status: response.status, done: false};
    window.__inpaints.push(record);
    const copy = response.clone();
    record.image = await toBase64(init.body.get("image"));
    record.mask = await toBase64(init.body.get("mask"));
    record.strategy = init.body.get("strategy");
    record.response = await toBase64(await copy.blob());
    record.done = true;
  }
  return response;
};
"""


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium executable, or skip (fail under CI) saying what is missing; asked
    for first, so a skip costs no model export."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "playwright is not installed (pip install playwright; it is in the dev extra)"
    else:
        path = shutil.which("chromium") or shutil.which("chromium-browser")
        if path:
            return path
        reason = "no chromium executable (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser test: {reason}")
    pytest.skip(reason)


def _inpaint_record(page: Any, count: int) -> dict[str, Any]:
    page.wait_for_function(
        f"() => window.__inpaints.length >= {count} && window.__inpaints[{count - 1}].done",
        timeout=60_000,
    )
    page.wait_for_selector("#spinner", state="hidden", timeout=60_000)
    record = page.evaluate(f"() => window.__inpaints[{count - 1}]")
    for key in ("image", "mask", "response"):
        record[key] = base64.b64decode(record[key])
    return record


def _to_page(box: dict[str, float], x: float, y: float) -> tuple[float, float]:
    return box["x"] + x * box["width"] / WIDTH, box["y"] + y * box["height"] / HEIGHT


def _distance_to_segment(ys: np.ndarray, xs: np.ndarray, a: tuple[float, float], b: tuple[float, float]) -> np.ndarray:
    """Distance of pixel centres (x + 0.5, y + 0.5) to the segment a-b (x, y) in image pixels."""
    px, py = xs + 0.5, ys + 0.5
    (ax, ay), (bx, by) = a, b
    t = np.clip(
        ((px - ax) * (bx - ax) + (py - ay) * (by - ay)) / ((bx - ax) ** 2 + (by - ay) ** 2),
        0,
        1,
    )
    return np.hypot(px - (ax + t * (bx - ax)), py - (ay + t * (by - ay)))


def test_paint_inpaint_download_in_chromium(chromium: str, exported_model, subprocess_env, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    source = textured_rgb(HEIGHT, WIDTH, seed=5)
    image_path = tmp_path / "photo.png"
    image_path.write_bytes(encode(source))
    env = {**subprocess_env, "GANTOOL_API_KEY": API_KEY}
    args = ["--model", str(exported_model.folder), "--provider", "cpu"]
    with serve_process(args, env) as (url, _, _), sync_playwright() as playwright:
        wait_ready(url)
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 900, "height": 700}, accept_downloads=True)
            context.add_init_script(RECORD_FETCH)
            page = context.new_page()
            page.goto(url + "/")

            # The server wants a key: the header says so and the key box shows.
            page.wait_for_function("() => document.querySelector('#model-info').textContent.includes('API key')")
            assert page.is_visible("#key-box")

            page.set_input_files("#file", str(image_path))
            page.wait_for_selector("#view.shown")
            page.eval_on_selector("#size", "e => { e.value = '40'; e.dispatchEvent(new Event('input')); }")
            box = page.locator("#view").bounding_box()
            assert box is not None and box["width"] > 4 * WIDTH  # shown scaled up; the mask stays 64 x 48
            brush = 40 * WIDTH / box["width"]  # the slider is in screen pixels
            start, end = (12.0, 24.0), (52.0, 24.0)
            page.mouse.move(*_to_page(box, *start))
            page.mouse.down()
            for step in range(1, 11):
                page.mouse.move(*_to_page(box, start[0] + (end[0] - start[0]) * step / 10, start[1]))
            page.mouse.up()

            # Undo leaves nothing to inpaint (no request); redo brings the stroke back.
            page.keyboard.press("Control+z")
            page.click("#inpaint")
            assert "Paint the holes first" in page.inner_text("#message")
            page.keyboard.press("Control+Shift+z")

            # Without the key: the API's 401 is shown in the page.
            page.click("#inpaint")
            refused = _inpaint_record(page, 1)
            assert refused["status"] == 401
            page.wait_for_selector("#message:not([hidden])")
            assert "HTTP 401" in page.inner_text("#message") and "API key" in page.inner_text("#message")
            assert re.search(r"request [0-9a-f]{32}", page.inner_text("#message"))  # the ID to quote to the admin

            page.fill("#api-key", API_KEY)
            page.dispatch_event("#api-key", "change")
            page.wait_for_function("() => document.querySelector('#model-info').textContent.includes('provider')")
            header = page.inner_text("#model-info")
            assert "CPUExecutionProvider" in header and "generator.onnx" in header

            page.click("#inpaint")
            first = _inpaint_record(page, 2)
            assert first["status"] == 200 and first["strategy"] == "auto"
            page.wait_for_selector("#download:not(.disabled)")
            page.wait_for_function("() => document.querySelector('#message').textContent.includes('Done')")
            assert "1 hole filled" in page.inner_text("#message")  # the server's X-Gantool-Holes
            with page.expect_download() as download_info:
                page.click("#download")
            download = download_info.value
            assert download.suggested_filename == "photo.inpainted.png"
            downloaded = tmp_path / "downloaded.png"
            download.save_as(downloaded)
            page.screenshot(path=str(tmp_path / "serve_page.png"))

            # Inpaint again on the result, with the rectangle tool.
            page.click("button[data-tool=rect]")
            box = page.locator("#view").bounding_box()  # the message bar above moved the canvas
            assert box is not None
            page.mouse.move(*_to_page(box, 20, 4))
            page.mouse.down()
            page.mouse.move(*_to_page(box, 30, 8))
            page.mouse.move(*_to_page(box, 40, 12))
            page.mouse.up()
            page.click("#inpaint")
            second = _inpaint_record(page, 3)
            assert second["status"] == 200
        finally:
            browser.close()

    # The stroke: the mask sent is at the image's native size and covers the path of the brush.
    sent_mask = decode(first["mask"])
    assert sent_mask.size == (WIDTH, HEIGHT)
    hole = mask_to_array(sent_mask) > 0.5
    assert hole[24, 14:51].all(), "the stroke's centre line is not in the mask"
    ys, xs = np.nonzero(hole)
    assert (_distance_to_segment(ys, xs, start, end) <= brush / 2 + 1.0).all(), "mask outside the brush"
    assert first["image"] == image_path.read_bytes()  # the file itself was sent

    # The download is what the server answered; it changed pixels only under the stroke.
    assert downloaded.read_bytes() == first["response"]
    result = np.asarray(Image.open(downloaded).convert("RGB"))
    assert result.shape == source.shape
    changed = (result != source).any(axis=2)
    assert not changed[~hole].any(), "a known pixel changed"
    assert changed[hole].mean() > 0.5, "the stroke was not inpainted"

    # The second request inpainted the first result inside the rectangle only.
    assert second["image"] == first["response"]
    rectangle = mask_to_array(decode(second["mask"])) > 0.5
    rows, cols = np.nonzero(rectangle)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (4, 11, 20, 39), (
        rows.min(),
        rows.max(),
        cols.min(),
        cols.max(),
    )
    assert rectangle[4:12, 20:40].all()
    again = np.asarray(decode(second["response"]).convert("RGB"))
    changed = (again != result).any(axis=2)
    assert not changed[~rectangle].any() and changed[rectangle].mean() > 0.5
    assert (tmp_path / "serve_page.png").stat().st_size > 0

"""GLCIC's post-processing (gantool.core.processing.poisson_blend) and ``--blend``:
borders, several holes, (almost) full holes, masks, modes, and the crop strategy."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from gantool.cli import cli
from gantool.core import processing
from gantool.core.constants import BLEND_MODES, DEFAULT_BLEND
from gantool.core.errors import InputError
from gantool.core.processing import BLEND_MARGIN, poisson_blend
from gantool.inference.inpainter import Inpainter, inpaint_arrays, plan_windows
from gantool.runtime.backends import load_backend
from inpaint_helpers import ExportedModel, box_mask_image, exported_model, textured_rgb  # noqa: F401


def smooth_image(height: int, width: int) -> np.ndarray:
    """A smooth float RGB image: Poisson blending can recover it from shifted gradients."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    return np.stack([0.2 + 0.5 * x / width, 0.3 + 0.4 * y / height, 0.4 + 0.1 * np.sin(x / 9 + y / 11)], axis=2)


def box(height: int, width: int, top: int, left: int, bottom: int, right: int) -> np.ndarray:
    mask = np.zeros((height, width), np.float32)
    mask[top:bottom, left:right] = 1.0
    return mask


def hole_error(result: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> float:
    return float(np.abs(result - truth)[mask > 0.5].max())


# ------------------------------------------------------------------------ the function


def test_a_colour_offset_is_blended_away_and_known_pixels_stay_exact() -> None:
    truth = smooth_image(48, 64)
    mask = box(48, 64, 14, 20, 34, 45)
    output = np.clip(truth + 0.15, 0, 1)  # right gradients, wrong colour: what blending fixes
    result = poisson_blend(truth, output, mask)
    assert result.dtype == np.float32 and result.shape == truth.shape
    assert np.array_equal(result[mask < 0.5], truth[mask < 0.5])
    assert hole_error(result, truth, mask) < 0.04 < hole_error(output, truth, mask)


@pytest.mark.parametrize("width", [20, 21])  # even and odd hole boxes
def test_the_clone_is_not_shifted(width: int) -> None:
    """seamlessClone places the source by its mask's centre; an off-by-one centre moves an edge."""
    truth = smooth_image(48, 64)
    mask = box(48, 64, 12, 20, 36, 20 + width)
    output = truth.copy()
    output[:, 30:, 2] = 0.95  # a sharp edge between columns 29 and 30, inside the hole
    result = poisson_blend(truth, output, mask)
    jumps = np.abs(np.diff(result[24, 21 : 20 + width - 1, 2]))
    assert int(np.argmax(jumps)) + 21 == 29  # the jump is still between columns 29 and 30
    assert jumps.max() > 0.3


@pytest.mark.parametrize(
    "hole",
    [
        (0, 0, 10, 12),  # a corner
        (40, 0, 48, 64),  # a strip along the whole bottom edge
        (0, 60, 48, 64),  # a strip along the whole right edge
        (0, 0, 1, 1),  # one pixel in a corner
        (20, 58, 30, 64),  # crossing the right border
    ],
)
def test_holes_at_the_border_are_padded_blended_and_cropped_back(hole: tuple[int, int, int, int]) -> None:
    truth = smooth_image(48, 64)
    mask = box(48, 64, *hole)
    output = np.clip(truth + 0.15, 0, 1)
    result = poisson_blend(truth, output, mask)  # no OpenCV ROI assertion
    assert np.array_equal(result[mask < 0.5], truth[mask < 0.5])
    assert hole_error(result, truth, mask) < 0.1 < hole_error(output, truth, mask)


def test_each_hole_is_blended_on_its_own_and_only_its_neighbourhood_matters() -> None:
    truth = smooth_image(96, 128)
    first, second = box(96, 128, 10, 10, 30, 34), box(96, 128, 60, 80, 84, 110)
    both = np.maximum(first, second)
    output = truth.copy()
    output[first > 0.5] += 0.2  # each hole has its own colour error
    output[second > 0.5] -= 0.2
    output = np.clip(output, 0, 1)
    result = poisson_blend(truth, output, both)
    assert np.array_equal(result[both < 0.5], truth[both < 0.5])
    assert hole_error(result, truth, both) < 0.05
    # one solve per hole: blending both equals blending each alone
    for mask in (first, second):
        alone = poisson_blend(truth, output, mask)
        assert np.array_equal(result[mask > 0.5], alone[mask > 0.5])
    # the work stays in the hole's box + margin: a crop around it gives the same pixels
    top, left, bottom, right = (
        60 - BLEND_MARGIN - 3,
        80 - BLEND_MARGIN - 3,
        84 + BLEND_MARGIN + 3,
        110 + BLEND_MARGIN + 3,
    )
    rows, cols = slice(top, bottom), slice(left, right)
    cropped = poisson_blend(truth[rows, cols], output[rows, cols], second[rows, cols])
    assert np.array_equal(cropped, result[rows, cols])


def test_a_hole_over_almost_the_whole_image_keeps_the_output_and_says_so_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processing, "_LOGGED_ONCE", set())
    truth = smooth_image(40, 40)
    output = np.clip(truth + 0.15, 0, 1)
    almost = np.ones((40, 40), np.float32)
    almost[0, :8] = 0.0  # 0.5 % known
    with caplog.at_level(logging.WARNING, logger="gantool.core.processing"):
        for mask in (np.ones((40, 40), np.float32), almost, almost):
            result = poisson_blend(truth, output, mask)
            assert np.array_equal(result[mask > 0.5], output[mask > 0.5])
            assert np.array_equal(result[mask < 0.5], truth[mask < 0.5])
    warnings = [r for r in caplog.records if "nothing to blend onto" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.parametrize("noise", [0, 2])  # exact grey, and JPEG's chroma noise of 2 levels
def test_a_grey_picture_stored_as_rgb_gets_grey_holes(noise: int) -> None:
    """The network may paint a hue the data taught it; a grey picture has none to give."""
    rng = np.random.default_rng(noise)
    grey = smooth_image(40, 48)[..., :1].repeat(3, axis=2)
    grey = (np.rint(grey * 255) + rng.integers(-noise // 2, noise // 2 + 1, grey.shape)) / 255.0
    image = np.clip(grey, 0, 1).astype(np.float32)
    mask = box(40, 48, 10, 12, 28, 34)
    y, x = np.mgrid[0:40, 0:48].astype(np.float32)
    waves = np.stack([np.sin(x / 3), np.sin(y / 4), np.cos((x + y) / 5)], axis=2)
    hole = mask > 0.5
    # a greenish textured patch, as the photo-trained model paints: its channels' gradients differ
    tinted = np.where(hole[..., None], np.clip((0.3, 0.6, 0.2) + 0.2 * waves, 0, 1), image).astype(np.float32)
    result = poisson_blend(image, tinted, mask)
    assert np.array_equal(result[~hole], image[~hole])  # known pixels stay exact
    assert np.array_equal(result[hole][:, 0], result[hole][:, 1])
    assert np.array_equal(result[hole][:, 0], result[hole][:, 2])
    colour = smooth_image(40, 48)
    kept = poisson_blend(colour, np.where(hole[..., None], tinted, colour), mask)
    assert float(np.ptp(kept[hole], axis=1).max()) > 0.1  # a colour picture keeps its colours
    almost = np.array(image, copy=True)
    almost[0, 0] = (0.5, 0.5, 0.52)  # one known pixel 5 levels off grey: a colour picture
    assert float(np.ptp(poisson_blend(almost, tinted, mask)[hole], axis=1).max()) > 0.05


def test_mask_conventions_and_the_127_128_threshold() -> None:
    truth = smooth_image(32, 40)
    output = np.clip(truth + 0.15, 0, 1)
    zero_one = box(32, 40, 8, 8, 20, 24)
    eight_bit = (zero_one * 255).astype(np.uint8)
    expected = poisson_blend(truth, output, zero_one)
    assert np.array_equal(poisson_blend(truth, output, eight_bit), expected)
    assert np.array_equal(poisson_blend(truth, output, zero_one.astype(bool)), expected)
    threshold = np.where(zero_one > 0.5, 128, 127).astype(np.uint8)  # 128 = hole, 127 = known
    assert np.array_equal(poisson_blend(truth, output, threshold), expected)
    assert np.array_equal(poisson_blend(truth, output, np.zeros((32, 40), np.float32)), truth)  # no hole


def test_bad_shapes_and_modes_are_one_line_errors() -> None:
    truth = smooth_image(16, 16)
    with pytest.raises(InputError, match="H x W x 3"):
        poisson_blend(truth, truth[:8], np.zeros((16, 16), np.float32))
    with pytest.raises(InputError, match="H x W x 3"):
        poisson_blend(truth[..., 0], truth[..., 0], np.zeros((16, 16), np.float32))
    with pytest.raises(InputError, match="unknown blend mode 'soft'"):
        processing.blend_output(truth, truth, np.zeros((16, 16), np.float32), "soft")
    assert DEFAULT_BLEND in BLEND_MODES and "none" in BLEND_MODES


# --------------------------------------------------------------------- the pipeline


def test_inpainter_blend_keeps_known_pixels_exact_in_every_mode_family(exported_model: ExportedModel) -> None:
    rgb = textured_rgb(26, 30)
    mask = np.asarray(box_mask_image(26, 30, 7, 9, 17, 22)) > 127
    rgba = np.dstack([rgb, np.where(mask, 0, 255).astype(np.uint8)])  # transparent = hole
    deep = (np.linspace(0, 65535, 26 * 30).reshape(26, 30)).astype(np.uint16)
    cases = {
        "RGB": (Image.fromarray(rgb), mask.astype(np.uint8) * 255, rgb),
        "L": (Image.fromarray(rgb).convert("L"), mask, np.asarray(Image.fromarray(rgb).convert("L"))),
        "RGBA": (Image.fromarray(rgba), None, rgb),
        "I;16": (Image.fromarray(deep), mask, deep),
    }
    poisson = Inpainter(exported_model.folder, provider="cpu", blend="poisson")
    assert poisson.blend == "poisson"
    for name, (image, hole_mask, known) in cases.items():
        blended = np.asarray(poisson.inpaint(image, hole_mask))
        raw = np.asarray(poisson.inpaint(image, hole_mask, blend="none"))
        assert blended.dtype == known.dtype and blended.shape == known.shape, name
        assert np.array_equal(blended[~mask], known[~mask]), name  # byte-identical outside the hole
        assert np.array_equal(raw[~mask], known[~mask]), name
        assert not np.array_equal(blended[mask], raw[mask]), name  # the blend did something
    with pytest.raises(InputError, match="unknown blend mode"):
        Inpainter(exported_model.folder, provider="cpu", blend="seamless")


def test_the_mask_threshold_through_the_inpainter(exported_model: ExportedModel) -> None:
    rgb = textured_rgb(24, 32)
    hole = np.asarray(box_mask_image(24, 32, 6, 8, 16, 20)) > 127
    at_127 = np.where(hole, 127, 0).astype(np.uint8)
    at_128 = np.where(hole, 128, 0).astype(np.uint8)
    inpainter = Inpainter(exported_model.folder, provider="cpu")
    assert np.array_equal(np.asarray(inpainter.inpaint(rgb, at_127)), rgb)  # 127 is no hole
    filled = np.asarray(inpainter.inpaint(rgb, at_128))
    assert np.array_equal(filled[~hole], rgb[~hole]) and not np.array_equal(filled[hole], rgb[hole])
    assert np.array_equal(filled, np.asarray(inpainter.inpaint(rgb, hole.astype(np.uint8))))  # 0/1 mask


def test_crop_strategy_blends_per_window(exported_model: ExportedModel) -> None:
    image = textured_rgb(200, 220).astype(np.float32) / 255.0
    mask = np.maximum(box(200, 220, 10, 12, 24, 30), box(200, 220, 150, 170, 170, 196))
    backend = load_backend(exported_model.folder, "cpu", "onnx")
    windows = plan_windows(mask, "crop", backend.train_size)
    assert len(windows) == 2  # one window per hole, far apart
    raw = inpaint_arrays(backend, [(image, mask)], strategy="crop", blend="none")[0]
    blended = inpaint_arrays(backend, [(image, mask)], strategy="crop", blend="poisson")[0]
    assert np.array_equal(blended[mask < 0.5], image[mask < 0.5])
    for window in windows:
        region = window.region
        # the model composites in its graph, so the raw result is the window's model output
        expected = poisson_blend(image[region], raw[region], mask[region])
        assert np.array_equal(blended[region], expected)


# -------------------------------------------------------------------------- commands


def test_inpaint_command_blend_option(exported_model: ExportedModel, tmp_path: Path) -> None:
    image, mask = tmp_path / "photo.png", tmp_path / "mask.png"
    Image.fromarray(textured_rgb(30, 36)).save(image)
    box_mask_image(30, 36, 0, 10, 12, 26).save(mask)  # touches the top border
    outputs = {}
    for mode in BLEND_MODES:
        out = tmp_path / f"{mode}.png"
        result = CliRunner().invoke(
            cli,
            [
                "inpaint",
                str(image),
                "--mask",
                str(mask),
                "-o",
                str(out),
                "--blend",
                mode,
                "--model",
                str(exported_model.folder),
            ],
        )
        assert result.exit_code == 0, result.output
        assert f"blend: {mode}" in result.output
        outputs[mode] = np.asarray(Image.open(out).convert("RGB"))
    hole = np.asarray(Image.open(mask)) > 127
    assert np.array_equal(outputs["poisson"][~hole], outputs["none"][~hole])
    assert not np.array_equal(outputs["poisson"][hole], outputs["none"][hole])
    bad = CliRunner().invoke(cli, ["inpaint", str(image), "--mask", str(mask), "--blend", "soft"])
    assert bad.exit_code == 2 and "soft" in bad.output and "Traceback" not in bad.output


def test_missing_opencv_fails_every_inpaint_in_one_line_before_any_work(
    exported_model: ExportedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OpenCV is a core dependency: it finds the holes (windows, cost estimate) whatever the blend,
    # so a broken install is one line that says how to mend it, for every blend and strategy.
    image, mask = tmp_path / "photo.png", tmp_path / "mask.png"
    Image.fromarray(textured_rgb(20, 24)).save(image)
    box_mask_image(20, 24, 5, 5, 12, 14).save(mask)
    monkeypatch.setitem(sys.modules, "cv2", None)  # import cv2 now raises ImportError
    base = ["inpaint", str(image), "--mask", str(mask), "--model", str(exported_model.folder), "--overwrite"]
    for index, extra in enumerate([[], ["--blend", "none"], ["--blend", "none", "--strategy", "crop"]]):
        out = tmp_path / f"out{index}.png"
        result = CliRunner().invoke(cli, [*base, "-o", str(out), *extra])
        assert result.exit_code == 1 and "pip install opencv-python-headless" in result.output, (extra, result.output)
        assert "Traceback" not in result.output and "--blend none" not in result.output, result.output
        assert not out.exists()
    for blend in BLEND_MODES:
        with pytest.raises(InputError, match="opencv"):
            Inpainter(exported_model.folder, provider="cpu", blend=blend)


@pytest.mark.parametrize("command", [["inpaint"], ["eval"], ["bench", "inpaint"]])
def test_help_documents_blend(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0 and "--blend" in result.output and "poisson" in result.output

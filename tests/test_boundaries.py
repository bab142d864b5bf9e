"""Boundaries of the mask contract at every entry point, and odd sizes around the stride.

Contract: a mask pixel > 127 is a hole, so 127 is kept and 128 is a hole. For
the alpha channel the hole is the transparent part: transparency 255 - alpha
> 127, i.e. alpha 127 is a hole and alpha 128 is kept. Only hole pixels change.

The model is a tiny trained checkpoint run by the eager backend (no export
needed); whether a pixel was treated as a hole is read from the output: known
pixels are copied bit for bit, hole pixels hold the network's output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from gantool import Inpainter
from gantool.cli import cli

SIZE = 32
# value -> (top, left) of a 6 x 4 block of that value in the mask
BLOCKS = {126: (4, 2), 127: (4, 10), 128: (4, 18), 255: (4, 26)}
BLOCK_H, BLOCK_W = 6, 4


def _image(height: int = SIZE, width: int = SIZE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 7 * 30], axis=2)
    return np.clip(base + rng.integers(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)


def _block_mask(background: int = 0) -> np.ndarray:
    mask = np.full((SIZE, SIZE), background, np.uint8)
    for value, (top, left) in BLOCKS.items():
        mask[top : top + BLOCK_H, left : left + BLOCK_W] = value
    return mask


def _region(value: int) -> tuple[slice, slice]:
    top, left = BLOCKS[value]
    return slice(top, top + BLOCK_H), slice(left, left + BLOCK_W)


def _expected_hole(hole_values: tuple[int, ...]) -> np.ndarray:
    hole = np.zeros((SIZE, SIZE), bool)
    for value in hole_values:
        hole[_region(value)] = True
    return hole


def assert_hole_is(before: np.ndarray, after: np.ndarray, hole: np.ndarray) -> None:
    """Known pixels byte-identical; every connected part of the hole filled."""
    assert after.shape == before.shape and after.dtype == before.dtype
    changed = (after != before).reshape(*after.shape[:2], -1).any(axis=2)
    assert not changed[~hole].any(), f"known pixels changed at {np.argwhere(changed & ~hole)[:5].tolist()}"
    assert changed[hole].any(), "the hole was not filled"


def assert_blocks(before: np.ndarray, after: np.ndarray, hole_values: tuple[int, ...]) -> None:
    assert_hole_is(before, after, _expected_hole(hole_values))
    for value in hole_values:  # each hole block, not only one of them, was filled
        assert (after[_region(value)] != before[_region(value)]).any(), f"block {value} was not a hole"


@pytest.fixture(scope="module")
def model(checkpoint_factory: Callable[..., Path]) -> Path:
    return checkpoint_factory("trained", seed=3, step=4, phase="g")


@pytest.fixture(scope="module")
def inpainter(model: Path) -> Inpainter:
    return Inpainter(model, provider="cpu", backend="eager")


def run_cli(*args: str | Path) -> str:
    result = CliRunner().invoke(cli, ["inpaint", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output


def read_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


# ------------------------------------------------------------------- 126 / 127 / 128 / 255


def test_mask_file_127_is_kept_and_128_is_a_hole(model: Path, tmp_path: Path) -> None:
    image = _image()
    Image.fromarray(image).save(tmp_path / "photo.png")
    Image.fromarray(_block_mask()).save(tmp_path / "mask.png")
    run_cli(tmp_path / "photo.png", "--mask", tmp_path / "mask.png", "--model", model, "--backend", "eager")
    assert_blocks(image, read_rgb(tmp_path / "photo.inpainted.png"), (128, 255))


def test_mask_folder_127_is_kept_and_128_is_a_hole(model: Path, tmp_path: Path) -> None:
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    image = _image(seed=1)
    Image.fromarray(image).save(images / "a.png")
    Image.fromarray(_block_mask()).save(masks / "a.png")
    run_cli(images, "--mask", masks, "-o", tmp_path / "out", "--model", model, "--backend", "eager")
    assert_blocks(image, read_rgb(tmp_path / "out" / "a.inpainted.png"), (128, 255))


@pytest.mark.parametrize("form", ["uint8 array", "rgb array", "PIL L", "path"])
def test_inpainter_mask_127_is_kept_and_128_is_a_hole(inpainter: Inpainter, tmp_path: Path, form: str) -> None:
    image = _image(seed=2)
    mask = _block_mask()
    given = {
        "uint8 array": lambda: mask,
        "rgb array": lambda: np.repeat(mask[..., None], 3, axis=2),
        "PIL L": lambda: Image.fromarray(mask),
        "path": lambda: (Image.fromarray(mask).save(tmp_path / "m.png"), tmp_path / "m.png")[1],
    }[form]()
    out = inpainter.inpaint(image, given, strategy="full")
    assert_blocks(image, np.asarray(out.convert("RGB")), (128, 255))


def test_alpha_channel_128_is_kept_and_127_is_a_hole_cli(model: Path, tmp_path: Path) -> None:
    """Alpha is opacity: the hole is transparency 255 - alpha > 127, so alpha <= 127."""
    image = _image(seed=3)
    rgba = np.dstack([image, _block_mask(background=255)])
    Image.fromarray(rgba).save(tmp_path / "cutout.png")
    run_cli(tmp_path / "cutout.png", "--model", model, "--backend", "eager")
    assert_blocks(image, read_rgb(tmp_path / "cutout.inpainted.png"), (126, 127))


def test_alpha_channel_128_is_kept_and_127_is_a_hole_inpainter(inpainter: Inpainter) -> None:
    image = _image(seed=4)
    rgba = np.dstack([image, _block_mask(background=255)])
    out = inpainter.inpaint(rgba, None, strategy="full")
    assert_blocks(image, np.asarray(out.convert("RGB")), (126, 127))


@pytest.mark.parametrize(
    "box", [(5, 7, 6, 4), (0, 0, 3, 5), (27, 29, 5, 3)], ids=["inside", "top-left", "bottom-right"]
)
def test_box_covers_exactly_its_pixels(model: Path, tmp_path: Path, box: tuple[int, int, int, int]) -> None:
    """--box X,Y,W,H: columns X..X+W-1 and rows Y..Y+H-1 are the hole; the next ones are kept."""
    image = _image(seed=5)
    Image.fromarray(image).save(tmp_path / "photo.png")
    x, y, w, h = box
    run_cli(tmp_path / "photo.png", "--box", ",".join(map(str, box)), "--model", model, "--backend", "eager")
    after = read_rgb(tmp_path / "photo.inpainted.png")
    hole = np.zeros((SIZE, SIZE), bool)
    hole[y : y + h, x : x + w] = True
    assert_hole_is(image, after, hole)
    changed = (after != image).any(axis=2)
    # each edge row and column of the box was filled (not only its middle)
    assert changed[y, x : x + w].any() and changed[y + h - 1, x : x + w].any()
    assert changed[y : y + h, x].any() and changed[y : y + h, x + w - 1].any()


# ------------------------------------------------------------------------ 0/1 mask PNGs


def _zero_one_case(tmp_path: Path) -> tuple[np.ndarray, Path, np.ndarray]:
    image = _image(seed=6)
    hole = np.zeros((SIZE, SIZE), bool)
    hole[8:20, 6:22] = True
    Image.fromarray(hole.astype(np.uint8)).save(tmp_path / "mask01.png")  # values 0 and 1 only
    return image, tmp_path / "mask01.png", hole


def test_zero_one_mask_png_is_read_as_a_zero_one_mask_cli(model: Path, tmp_path: Path) -> None:
    image, mask, hole = _zero_one_case(tmp_path)
    Image.fromarray(image).save(tmp_path / "photo.png")
    run_cli(tmp_path / "photo.png", "--mask", mask, "--model", model, "--backend", "eager")
    assert_hole_is(image, read_rgb(tmp_path / "photo.inpainted.png"), hole)


def test_zero_one_mask_png_is_read_as_a_zero_one_mask_inpainter(inpainter: Inpainter, tmp_path: Path) -> None:
    image, mask, hole = _zero_one_case(tmp_path)
    assert_hole_is(image, np.asarray(inpainter.inpaint(image, mask, strategy="full").convert("RGB")), hole)


def test_zero_one_mask_array_is_a_zero_one_mask(inpainter: Inpainter) -> None:
    image = _image(seed=7)
    hole = np.zeros((SIZE, SIZE), bool)
    hole[10:18, 3:15] = True
    out = inpainter.inpaint(image, hole.astype(np.uint8), strategy="full")
    assert_hole_is(image, np.asarray(out.convert("RGB")), hole)


# ------------------------------------------------------------- odd sizes around the stride

ODD_SIZES = [(31, 31), (32, 32), (33, 33), (31, 33), (33, 32)]  # 4k-1, 4k, 4k+1 (stride 4)


@pytest.mark.parametrize("height,width", ODD_SIZES, ids=[f"{h}x{w}" for h, w in ODD_SIZES])
def test_run_any_size_keeps_known_pixels_exactly(inpainter: Inpainter, height: int, width: int) -> None:
    """Inpainter.run pads to the stride and crops back: a crop off by one row or
    column would move the (in-graph composited) known pixels."""
    rng = np.random.default_rng(height * 100 + width)
    image = rng.random((2, 3, height, width), dtype=np.float32)
    mask = np.zeros((2, 1, height, width), np.float32)
    mask[0, :, 5:14, 7:20] = 1
    mask[1, :, height - 6 :, width - 9 :] = 1  # touches the bottom-right edge, where padding is
    out = inpainter.run(image, mask)
    assert out.shape == image.shape and out.dtype == np.float32
    hole = np.broadcast_to(mask > 0.5, image.shape)
    assert np.array_equal(out[~hole], image[~hole])
    assert (out[hole] != image[hole]).all()


@pytest.mark.parametrize("strategy", ["full", "crop", "resize"])
@pytest.mark.parametrize("height,width", ODD_SIZES, ids=[f"{h}x{w}" for h, w in ODD_SIZES])
def test_strategies_at_sizes_around_the_stride(inpainter: Inpainter, strategy: str, height: int, width: int) -> None:
    image = _image(height, width, seed=height + width)
    hole = np.zeros((height, width), bool)
    hole[height - 9 : height - 1, 2:11] = True  # near the bottom edge: inside the padded rows
    out = inpainter.inpaint(image, hole.astype(np.uint8) * 255, strategy=strategy)
    assert out.size == (width, height)
    after = np.asarray(out.convert("RGB"))
    assert_hole_is(image, after, hole)
    assert (after[hole] != image[hole]).any(axis=1).mean() > 0.9  # nearly every hole pixel filled


@pytest.mark.parametrize("height,width", [(31, 33), (33, 31)])
def test_full_strategy_fills_the_hole_with_the_model_output_at_the_right_place(
    inpainter: Inpainter, height: int, width: int
) -> None:
    """The hole holds the network's output for the same pixel: padding here with
    numpy (reflect, top/left = half the padding, rounded down) and cropping back
    must give what gantool writes."""
    image = _image(height, width, seed=9)
    hole = np.zeros((height, width), bool)
    hole[4:20, 6:25] = True
    out = np.asarray(inpainter.inpaint(image, hole.astype(np.uint8) * 255, strategy="full", blend="none").convert("RGB"))
    ph, pw = (-height) % 4, (-width) % 4
    top, left = ph // 2, pw // 2
    spec = ((top, ph - top), (left, pw - left))
    padded = np.pad(image.astype(np.float32) / 255, (*spec, (0, 0)), mode="reflect")
    padded_hole = np.pad(hole, spec, mode="constant")
    raw = inpainter.backend.run(padded.transpose(2, 0, 1)[None].copy(), padded_hole[None, None].astype(np.float32))
    expected = np.clip(np.rint(raw[0].transpose(1, 2, 0) * 255), 0, 255).astype(np.uint8)
    expected = expected[top : top + height, left : left + width]
    assert np.abs(out[hole].astype(int) - expected[hole].astype(int)).max() <= 1


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "I;16", "LA"])
def test_save_png_is_lossless_for_every_mode(tmp_path, mode):
    # The one PNG writer of the CLI, Ray and the service: libpng (OpenCV) for the output modes,
    # Pillow for the rest. Exact pixels back, the same mode, the same bytes to a path or a file.
    import io

    from gantool.core.processing import save_png

    rng = np.random.default_rng(3)
    if mode == "I;16":
        pixels = rng.integers(0, 65536, (37, 53), dtype=np.uint16)
        pixels[:20] = np.arange(53, dtype=np.uint16) * 1000  # rows zlib can shrink, rows it cannot
        image = Image.fromarray(pixels)  # mode I;16
    else:
        channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
        pixels = rng.integers(0, 256, (37, 53, channels), dtype=np.uint8)
        pixels[:20] = np.arange(53, dtype=np.uint8)[None, :, None]
        pixels = pixels.squeeze(axis=2) if channels == 1 else pixels
        image = Image.fromarray(pixels, mode)
    buffer = io.BytesIO()
    save_png(image, buffer)
    path = tmp_path / "out.png"
    save_png(image, path)
    assert path.read_bytes() == buffer.getvalue()
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert np.array_equal(np.asarray(img).astype(pixels.dtype), pixels)
        assert img.mode == mode or (mode == "I;16" and img.mode in ("I", "I;16"))

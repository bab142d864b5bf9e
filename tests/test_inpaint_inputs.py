"""The same input means the same thing everywhere (issue #23): one mask rule for files,
PIL images and arrays; animated images refused; ICC profiles kept; ``-o`` names only PNG
files; ``--skip-existing`` resumes a run; empty arrays and decompression bombs get one line."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, ImageCms

import inpaint_helpers
from gantool.cli import cli
from gantool.core.errors import InputError, SizeLimitError
from gantool.core.processing import mask_to_array, read_image, save_png
from gantool.inference.inpainter import Inpainter, load_mask
from gantool.inference.pipeline import run_inpaint
from gantool.runtime.backends import load_backend
from inpaint_helpers import ExportedModel, textured_rgb

exported_model = inpaint_helpers.exported_model  # the session's tiny exported model (a fixture)

H, W = 20, 24
HOLE = (slice(5, 12), slice(6, 16))  # 7 x 10 = 70 hole pixels


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args))


# ------------------------------------------------------------------- one mask rule


def red_hole_rgb() -> np.ndarray:
    mask = np.zeros((H, W, 3), np.uint8)
    mask[HOLE] = (255, 0, 0)  # a hole painted in red
    return mask


def alpha_only_rgba() -> np.ndarray:
    mask = np.zeros((H, W, 4), np.uint8)  # colour all 0: the alpha is the mask
    mask[HOLE + (3,)] = 255
    return mask


def opaque_rgba_white_hole() -> np.ndarray:
    mask = np.zeros((H, W, 4), np.uint8)
    mask[..., 3] = 255  # opaque everywhere: only the white pixels are holes
    mask[HOLE + (slice(0, 3),)] = 255
    return mask


@pytest.mark.parametrize("make", [red_hole_rgb, alpha_only_rgba, opaque_rgba_white_hole])
def test_a_mask_file_a_pil_image_and_an_array_give_the_same_holes(make, tmp_path: Path) -> None:
    # Before the fix: the red and the alpha-only masks had 0 holes as a file or PIL image and
    # 70 as an array; the opaque RGBA array had every pixel a hole.
    array = make()
    path = tmp_path / "mask.png"
    Image.fromarray(array).save(path)
    image = Image.fromarray(textured_rgb(H, W))
    expected = np.zeros((H, W), np.float32)
    expected[HOLE] = 1.0
    for given in (array, Image.fromarray(array), path, str(path)):
        np.testing.assert_array_equal(load_mask(given, image), expected)
    np.testing.assert_array_equal(mask_to_array(read_image(path)), expected)  # what --mask FILE reads


def test_arrays_follow_their_dtypes_range() -> None:
    grey = np.zeros((4, 4), np.uint16)
    grey[0, 0], grey[0, 1] = 200, 40000  # 200 of 65535 is known; 40000 is a hole, as in a 16-bit PNG
    assert mask_to_array(grey)[0, :2].tolist() == [0.0, 1.0]
    assert mask_to_array(Image.fromarray(grey))[0, :2].tolist() == [0.0, 1.0]
    assert mask_to_array(np.array([[0, 255, 127, 128]]))[0].tolist() == [0, 1, 0, 1]  # int64 from Python ints
    assert mask_to_array(np.array([[0.0, 0.4, 0.6, 1.0]]))[0].tolist() == [0, 0, 1, 1]
    assert mask_to_array(np.array([[False, True]]))[0].tolist() == [0, 1]
    with pytest.raises(InputError, match="H x W"):
        mask_to_array(np.zeros((2, 2, 5), np.uint8))
    opaque_black = np.zeros((4, 4, 4), np.uint8)
    opaque_black[..., 3] = 255  # an RGBA mask with nothing painted: no hole, not all hole
    assert not mask_to_array(opaque_black).any() and not mask_to_array(Image.fromarray(opaque_black)).any()


# ---------------------------------------------------------------- animated images


def test_an_animated_gif_is_refused_in_one_line(exported_model: ExportedModel, tmp_path: Path) -> None:
    # Before the fix: the first frame was inpainted, without a word about the other two.
    frames = [Image.fromarray(textured_rgb(H, W, seed)) for seed in range(3)]
    gif = tmp_path / "anim.gif"
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=50, loop=0)
    with pytest.raises(InputError, match=r"animated or multi-page image \(3 frames\)"):
        read_image(gif, lossless=True)
    result = _cli("inpaint", str(gif), "--box", "2,2,6,6", "--model", str(exported_model.folder), "--provider", "cpu")
    assert result.exit_code == 1 and "3 frames" in result.output and "Traceback" not in result.output
    # Named once: the line said "anim.gif: anim.gif: an animated ..." before.
    (line,) = [line for line in result.output.splitlines() if "3 frames" in line]
    assert line.count(str(gif)) == 1, line
    assert not list(tmp_path.glob("*.inpainted.*"))
    still = tmp_path / "still.gif"
    frames[0].save(still)
    assert read_image(still).size == (W, H)  # a one-frame GIF is an image like any other


# ---------------------------------------------------------- PNG data that ends early


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _short_png(width: int, height: int, rows: int, interlace: int = 0) -> bytes:
    """An 8-bit RGB PNG whose header says ``height`` rows and whose (complete) zlib stream holds
    ``rows`` rows' bytes: a valid stream, too short for its header."""
    raw = bytes((1 + 3 * width) * rows)  # filter byte 0 and black, wherever Adam7's rows start
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, interlace)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b"")


@pytest.mark.parametrize(("width", "height", "rows", "interlace"), [(1, 200000, 4, 0), (24, 20, 19, 0), (24, 20, 20, 1)])
def test_a_png_whose_data_ends_before_its_last_row_is_refused(
    exported_model: ExportedModel, tmp_path: Path, width: int, height: int, rows: int, interlace: int
) -> None:
    # Before the fix Pillow padded the missing rows with black and the image was inpainted (200 in serve).
    # (24 x 20 interlaced needs more than 20 plain rows' bytes: each Adam7 pass has its own filter bytes.)
    data = _short_png(width, height, rows, interlace)
    with pytest.raises(InputError, match=r"the uploaded image: image file is truncated \(its data ends after \d+ of"):
        read_image(io.BytesIO(data))
    path = tmp_path / "short.png"
    path.write_bytes(data)
    result = _cli("inpaint", str(path), "--box", "0,0,1,1", "--model", str(exported_model.folder), "--provider", "cpu")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (line,) = [line for line in result.output.splitlines() if "truncated" in line]
    assert str(path) in line
    whole = _short_png(width, 4, 4) if height > 1000 else _short_png(width, height, height + 8 * interlace)
    assert read_image(io.BytesIO(whole)).size[0] == width  # data for every row (and more): it reads


def test_every_png_layout_with_all_its_data_reads() -> None:
    """The completeness check must never refuse a whole PNG: every colour type and bit depth,
    plain and Adam7-interlaced (written by pypng, whose passes gantool does not share), odd sizes."""
    import png  # pypng: the dev extra

    from gantool.core.png import png_data_shortfall

    rng = np.random.default_rng(0)
    layouts = [(True, False, d) for d in (1, 2, 4, 8, 16)] + [(True, True, 8), (True, True, 16)]
    layouts += [(False, a, d) for a in (False, True) for d in (8, 16)]
    for width, height in [(1, 1), (2, 3), (3, 2), (5, 7), (9, 13), (17, 8)]:
        for interlace in (False, True):
            for grey, alpha, depth in layouts:
                planes = (1 if grey else 3) + alpha
                rows = rng.integers(0, 2**depth, (height, width * planes)).tolist()
                buffer = io.BytesIO()
                png.Writer(width, height, greyscale=grey, alpha=alpha, bitdepth=depth, interlace=interlace).write(
                    buffer, rows
                )
                buffer.seek(0)
                assert png_data_shortfall(buffer) is None, (width, height, interlace, grey, alpha, depth)
                assert read_image(buffer).size == (width, height)
            palette = io.BytesIO()
            png.Writer(width, height, palette=[(i, 255 - i, i) for i in range(4)], bitdepth=2, interlace=interlace).write(
                palette, rng.integers(0, 4, (height, width)).tolist()
            )
            palette.seek(0)
            assert read_image(palette).size == (width, height)


# ------------------------------------------------------------------- colour profiles


def test_an_icc_profile_is_kept_in_the_output(exported_model: ExportedModel, tmp_path: Path) -> None:
    # Before the fix: the output PNG had no profile, so a wide-gamut photo's colours shifted.
    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB")).tobytes()
    source = tmp_path / "x.png"
    Image.fromarray(textured_rgb(H, W)).save(source, icc_profile=profile)
    summary = run_inpaint([source], load_backend(exported_model.folder, "cpu", "onnx"), boxes=[(3, 3, 8, 6)])
    assert summary.inpainted == 1
    with Image.open(tmp_path / "x.inpainted.png") as out:
        assert out.info.get("icc_profile") == profile
        out.load()  # a valid PNG (the chunk's CRC is checked on load)


def test_save_png_writes_a_valid_iccp_chunk() -> None:
    profile = b"not a real profile, but bytes a PNG must carry unchanged" * 3
    image = Image.fromarray(textured_rgb(8, 8))
    image.info["icc_profile"] = profile
    buffer = io.BytesIO()
    save_png(image, buffer)
    data = buffer.getvalue()
    at = data.index(b"iCCP")
    length = struct.unpack(">I", data[at - 4 : at])[0]
    body = data[at : at + 4 + length]
    assert struct.unpack(">I", data[at + 4 + length : at + 8 + length])[0] == zlib.crc32(body)
    with Image.open(io.BytesIO(data)) as back:
        assert back.info["icc_profile"] == profile and np.array_equal(np.asarray(back), np.asarray(image))


# ----------------------------------------------------------------------------- -o


@pytest.mark.parametrize("name", ["result.jpg", "result.WEBP", "result.tif"])
def test_an_output_named_in_another_image_format_is_refused(
    exported_model: ExportedModel, tmp_path: Path, name: str
) -> None:
    # Before the fix: -o result.jpg made a folder result.jpg/ holding x.inpainted.png.
    source = tmp_path / "x.png"
    Image.fromarray(textured_rgb(H, W)).save(source)
    result = _cli("inpaint", str(source), "--box", "2,2,6,6", "-o", str(tmp_path / name),
                  "--model", str(exported_model.folder))  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"-o {tmp_path / name}: outputs are written as PNG" in result.output
    assert not (tmp_path / name).exists()


# ----------------------------------------------------------------- resuming a run


def test_skip_existing_resumes_a_folder_run(exported_model: ExportedModel, tmp_path: Path) -> None:
    # Before the fix: the re-run failed every existing output ("exists (use --overwrite)") and exited 1.
    folder, out = tmp_path / "album", tmp_path / "out"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(textured_rgb(H, W, i)).save(folder / f"{i}.png")
    base = ["inpaint", str(folder), "--box", "2,2,6,6", "-o", str(out), "--model", str(exported_model.folder),
            "--provider", "cpu"]  # fmt: skip
    assert _cli(*base).exit_code == 0
    kept = (out / "0.inpainted.png").read_bytes()
    (out / "2.inpainted.png").unlink()  # as if the run had been killed before the last file

    result = _cli(*base)  # without the flag: each existing output fails (the missing one is made)
    assert result.exit_code == 1 and "exists (use --overwrite to replace it, or --skip-existing" in result.output
    (out / "2.inpainted.png").unlink()
    result = _cli(*base, "--skip-existing")
    assert result.exit_code == 0, result.output
    assert "1 inpainted, 2 skipped (output exists), 0 failed" in result.output
    assert (out / "2.inpainted.png").is_file() and (out / "0.inpainted.png").read_bytes() == kept
    result = _cli(*base, "--skip-existing")  # nothing left to do: a success, not "nothing inpainted"
    assert result.exit_code == 0 and "0 inpainted, 3 skipped (output exists)" in result.output
    result = _cli(*base, "--skip-existing", "--overwrite")
    assert result.exit_code == 2 and "contradict" in result.output


# ----------------------------------------------------------------- odd and huge inputs


def test_an_empty_array_is_one_clear_error(exported_model: ExportedModel) -> None:
    # Before the fix: numpy's "cannot reshape array of size 0".
    inpainter = Inpainter(exported_model.folder, "cpu", "onnx")
    with pytest.raises(InputError, match="is 0x0: there is nothing to inpaint"):
        inpainter.inpaint(np.zeros((0, 0, 3), np.uint8), np.zeros((0, 0), np.uint8))
    with pytest.raises(InputError, match="is 0x5"):
        inpainter.inpaint(np.zeros((5, 0), np.uint8), np.zeros((5, 0), np.uint8))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header says width x height (8-bit grey) with no pixel data: enough for Pillow's bomb check."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) + chunk(
        b"IEND", b""
    )


def test_a_huge_image_over_pillows_limit_says_how_to_proceed(
    exported_model: ExportedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before the fix: Pillow's "could be decompression bomb DOS attack" and nothing else.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after the test
    huge = tmp_path / "huge.png"
    huge.write_bytes(png_header_only(20000, 20000))
    with pytest.raises(SizeLimitError, match=r"decompression-bomb limit.*--max-pixels"):
        read_image(huge, lossless=True)
    args = ["inpaint", str(huge), "--box", "0,0,8,8", "--model", str(exported_model.folder), "--provider", "cpu"]
    result = _cli(*args)
    assert result.exit_code == 1 and "--max-pixels" in result.output
    result = _cli(*args, "--max-pixels", "400000000")  # allowed now: it fails only on its missing pixel data
    assert result.exit_code == 1 and "decompression" not in result.output, result.output
    assert f"cannot read image {huge}" in result.output

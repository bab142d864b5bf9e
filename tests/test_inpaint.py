"""``gantool inpaint`` end to end: inputs, masks, outputs, modes, providers, strategies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from PIL import Image, ImageOps

from gantool.cli import cli
from gantool.core import artifacts
from gantool.core.constants import AUTO_CROP_FACTOR
from gantool.inference.pipeline import collect_images
from inpaint_helpers import (  # noqa: F401
    NO_GPU_ONLY,
    ExportedModel,
    box_mask_image,
    exported_model,
    hole_of,
    textured_rgb,
)


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, ["inpaint", *map(str, args)])


def decoded(path: Path, mode: str) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(ImageOps.exif_transpose(img).convert(mode) if mode != "raw" else img.copy())


@pytest.fixture
def rgb_case(tmp_path: Path) -> tuple[Path, Path]:
    """A 37 x 23 (W x H) RGB image and a mask with one hole."""
    image, mask = tmp_path / "photo.png", tmp_path / "photo_mask.png"
    Image.fromarray(textured_rgb(23, 37)).save(image)
    box_mask_image(23, 37, 5, 9, 14, 22).save(mask)
    return image, mask


def assert_only_hole_changed(before: np.ndarray, after: np.ndarray, hole: np.ndarray) -> None:
    assert after.shape == before.shape and after.dtype == before.dtype
    assert np.array_equal(after[~hole], before[~hole])  # known pixels byte-identical
    assert (after[hole] != before[hole]).any()  # the hole was filled


# ---------------------------------------------------------------- sizes and modes


def test_odd_size_rgb_changes_only_the_hole(exported_model: ExportedModel, rgb_case: tuple[Path, Path]) -> None:
    image, mask = rgb_case
    result = invoke(image, "--mask", mask, "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    out = image.with_name("photo.inpainted.png")
    assert f"wrote {out}" in result.output and "1 inpainted, 0 failed" in result.output
    with Image.open(out) as written:
        assert written.format == "PNG" and written.mode == "RGB" and written.size == (37, 23)
    assert_only_hole_changed(decoded(image, "RGB"), decoded(out, "RGB"), hole_of(mask))


def test_rgba_alpha_is_the_mask_and_output_is_rgb(exported_model: ExportedModel, tmp_path: Path) -> None:
    rgba = np.dstack([textured_rgb(30, 26), np.full((30, 26), 255, np.uint8)])
    rgba[8:16, 5:20, 3] = 0  # transparent = hole
    image = tmp_path / "cutout.png"
    Image.fromarray(rgba).save(image)
    result = invoke(image, "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    out = tmp_path / "cutout.inpainted.png"
    assert Image.open(out).mode == "RGB"
    assert_only_hole_changed(rgba[..., :3], decoded(out, "RGB"), rgba[..., 3] <= 127)


def test_grey_palette_and_16bit_inputs_keep_their_family(exported_model: ExportedModel, tmp_path: Path) -> None:
    rgb = textured_rgb(21, 30)
    grey = tmp_path / "grey.png"
    Image.fromarray(rgb).convert("L").save(grey)
    palette = tmp_path / "palette.png"
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=32).save(palette)
    deep = tmp_path / "deep.png"
    deep_values = (np.linspace(0, 65535, 21 * 30).reshape(21, 30)).astype(np.uint16)
    Image.fromarray(deep_values).save(deep)
    mask = tmp_path / "masks"
    mask.mkdir()
    for name in ("grey", "palette", "deep"):
        box_mask_image(21, 30, 4, 6, 12, 18).save(mask / f"{name}.png")
    result = invoke(grey, palette, deep, "--mask", mask, "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    hole = hole_of(mask / "grey.png")
    with Image.open(tmp_path / "grey.inpainted.png") as out:
        assert out.mode == "L"
    assert_only_hole_changed(decoded(grey, "L"), decoded(tmp_path / "grey.inpainted.png", "L"), hole)
    with Image.open(tmp_path / "palette.inpainted.png") as out:
        assert out.mode == "RGB"
    assert_only_hole_changed(decoded(palette, "RGB"), decoded(tmp_path / "palette.inpainted.png", "RGB"), hole)
    with Image.open(tmp_path / "deep.inpainted.png") as out:
        assert out.mode == "I;16"  # written as a 16-bit PNG
        written = np.asarray(out)
    assert_only_hole_changed(deep_values, written, hole)


def test_jpeg_exif_rotation_mask_applies_to_the_displayed_image(
    exported_model: ExportedModel, tmp_path: Path
) -> None:
    stored = Image.fromarray(textured_rgb(40, 24))  # 24 wide, 40 high as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated: 40 wide, 24 high
    image = tmp_path / "phone.jpg"
    stored.save(image, quality=95, exif=exif)
    displayed_mask = tmp_path / "displayed.png"
    box_mask_image(24, 40, 3, 25, 12, 36).save(displayed_mask)
    result = invoke(image, "--mask", displayed_mask, "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    out = tmp_path / "phone.inpainted.png"
    assert Image.open(out).size == (40, 24)  # upright; the PNG has no rotation left to apply
    assert_only_hole_changed(decoded(image, "RGB"), decoded(out, "RGB"), hole_of(displayed_mask))

    stored_mask = tmp_path / "stored.png"  # drawn on the stored (unrotated) pixels: wrong size
    box_mask_image(40, 24, 3, 3, 12, 12).save(stored_mask)
    result = invoke(image, "--mask", stored_mask, "--model", exported_model.folder, "--overwrite")
    assert result.exit_code == 1
    assert "mask stored.png is 24x40 but phone.jpg is 40x24" in result.output


def test_box_option_and_empty_mask(exported_model: ExportedModel, rgb_case: tuple[Path, Path], tmp_path: Path) -> None:
    image, mask = rgb_case
    result = invoke(image, "--box", "2,3,6,5", "--box", "30,18,20,20", "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    hole = np.zeros((23, 37), bool)
    hole[3:8, 2:8] = hole[18:, 30:] = True  # the second box is clipped to the image
    assert_only_hole_changed(decoded(image, "RGB"), decoded(image.with_name("photo.inpainted.png"), "RGB"), hole)

    both = tmp_path / "both.png"
    result = invoke(image, "--mask", mask, "--box", "2,3,6,5", "-o", both, "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    union = hole_of(mask) | (np.arange(23)[:, None] >= 3) & (np.arange(23)[:, None] < 8) & (np.arange(37) < 8) & (
        np.arange(37) >= 2
    )
    assert_only_hole_changed(decoded(image, "RGB"), decoded(both, "RGB"), union)

    empty = tmp_path / "empty.png"
    Image.new("L", (37, 23), 0).save(empty)
    result = invoke(image, "--mask", empty, "-o", tmp_path / "same.png", "--model", exported_model.folder)
    # No hole: skipped, nothing written, and with nothing inpainted the exit status is 1.
    assert result.exit_code == 1, result.output
    assert "0 inpainted, 1 skipped (no hole)" in result.output
    assert not (tmp_path / "same.png").exists()

    for bad in ("1,2,3", "a,b,c,d", "1,2,0,4"):
        result = invoke(image, "--box", bad, "--model", exported_model.folder)
        assert result.exit_code == 2 and "--box" in result.output
    result = invoke(image, "--box", "100,100,5,5", "--model", exported_model.folder, "--overwrite")
    assert result.exit_code == 1 and "lies outside the 37x23 image" in result.output


# ------------------------------------------------------------------ failures


def test_corrupt_image_and_wrong_size_mask_fail_in_one_line(
    exported_model: ExportedModel, rgb_case: tuple[Path, Path], tmp_path: Path
) -> None:
    image, mask = rgb_case
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(image.read_bytes()[:60])
    result = invoke(corrupt, "--mask", mask, "--model", exported_model.folder)
    assert result.exit_code == 1
    assert "failed: " in result.output and "cannot read image" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "corrupt.inpainted.png").exists()

    small = tmp_path / "small_mask.png"
    box_mask_image(20, 30, 1, 1, 5, 5).save(small)
    result = invoke(image, "--mask", small, "--model", exported_model.folder)
    assert result.exit_code == 1
    assert "mask small_mask.png is 30x20 but photo.png is 37x23" in result.output
    assert not image.with_name("photo.inpainted.png").exists()

    plain = tmp_path / "plain.png"
    Image.fromarray(textured_rgb(10, 10)).save(plain)
    result = invoke(plain, "--model", exported_model.folder)
    assert result.exit_code == 1 and "no mask for plain.png" in result.output


def test_missing_inputs_and_models(
    exported_model: ExportedModel, rgb_case: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image, mask = rgb_case
    result = invoke(tmp_path / "nothing.png", "--mask", mask, "--model", exported_model.folder)
    assert result.exit_code == 1 and "no such file or folder" in result.output
    result = invoke(image, "--mask", tmp_path / "nomask.png", "--model", exported_model.folder)
    assert result.exit_code == 1 and "mask not found" in result.output
    result = invoke(image, "--mask", mask, "--model", tmp_path / "missing.onnx")
    assert result.exit_code == 1 and "model not found" in result.output
    monkeypatch.setattr(artifacts, "DEFAULT_MODEL_DIRS", (tmp_path / "no_models",))
    result = invoke(image, "--mask", mask)
    assert result.exit_code == 1
    assert "gantool train" in result.output and "gantool export" in result.output
    assert "Traceback" not in result.output


def test_folder_with_one_bad_file(exported_model: ExportedModel, tmp_path: Path) -> None:
    folder = tmp_path / "album"
    (folder / "sub").mkdir(parents=True)
    masks = folder / "masks"  # inside the input folder: not an input
    masks.mkdir()
    for name, where in (("a", folder), ("b", folder / "sub"), ("c", folder)):
        Image.fromarray(textured_rgb(24, 28, seed=ord(name))).save(where / f"{name}.png")
        box_mask_image(24, 28, 6, 6, 14, 16).save(masks / f"{name}.png")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    box_mask_image(24, 28, 6, 6, 14, 16).save(masks / "broken.png")
    out = tmp_path / "out"
    result = invoke(folder, "--mask", masks, "-o", out, "--model", exported_model.folder, "--batch-size", "2")
    assert result.exit_code == 1
    assert "3 inpainted, 1 failed" in result.output and "broken.png" in result.output
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")) == [
        "a.inpainted.png", "c.inpainted.png", "sub/b.inpainted.png",
    ]  # fmt: skip
    # a second scan skips the mask folder and the *.inpainted.* outputs written beside inputs
    result = invoke(folder / "a.png", "--mask", masks, "--model", exported_model.folder)
    assert result.exit_code == 0
    found = [p.name for p, _ in collect_images([folder], skip=[masks])]
    assert sorted(found) == ["a.png", "b.png", "broken.png", "c.png"]


def test_glob_inputs(exported_model: ExportedModel, rgb_case: tuple[Path, Path], tmp_path: Path) -> None:
    _, mask = rgb_case
    shots = tmp_path / "shots"
    shots.mkdir()
    for i in range(2):
        Image.fromarray(textured_rgb(23, 37, seed=i)).save(shots / f"shot{i}.png")
    (shots / "notes.txt").write_text("not an image")
    result = invoke(str(shots / "*"), "--mask", mask, "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    assert "2 inpainted, 0 failed" in result.output
    assert sorted(p.name for p in shots.glob("*.inpainted.png")) == ["shot0.inpainted.png", "shot1.inpainted.png"]
    result = invoke(str(tmp_path / "nothing*.png"), "--mask", mask, "--model", exported_model.folder)
    assert result.exit_code == 1 and "no images match" in result.output


def test_mask_file_inside_an_input_folder_is_not_an_input(exported_model: ExportedModel, tmp_path: Path) -> None:
    folder = tmp_path / "scan"
    folder.mkdir()
    Image.fromarray(textured_rgb(16, 20)).save(folder / "page.png")
    box_mask_image(16, 20, 2, 2, 8, 8).save(folder / "mask.png")
    result = invoke(folder, "--mask", folder / "mask.png", "--model", exported_model.folder)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["mask.png", "page.inpainted.png", "page.png"]


# ------------------------------------------------------------------ outputs


def test_overwrite_needs_the_flag_and_inputs_are_never_overwritten(
    exported_model: ExportedModel, rgb_case: tuple[Path, Path], tmp_path: Path
) -> None:
    image, mask = rgb_case
    out = image.with_name("photo.inpainted.png")
    out.write_bytes(b"user data")
    result = invoke(image, "--mask", mask, "--model", exported_model.folder)
    assert result.exit_code == 1 and "exists (use --overwrite to replace it" in result.output
    assert out.read_bytes() == b"user data"
    result = invoke(image, "--mask", mask, "--model", exported_model.folder, "--overwrite")
    assert result.exit_code == 0, result.output
    assert Image.open(out).size == (37, 23)

    before = image.read_bytes(), mask.read_bytes()
    for target in (image, mask):
        result = invoke(image, "--mask", mask, "-o", target, "--model", exported_model.folder, "--overwrite")
        assert result.exit_code == 1 and "it is an input or mask file" in result.output
    assert (image.read_bytes(), mask.read_bytes()) == before
    assert not list(tmp_path.glob(".gantool-tmp-*"))  # no half-written files left behind


def test_output_option_rules(exported_model: ExportedModel, rgb_case: tuple[Path, Path], tmp_path: Path) -> None:
    image, mask = rgb_case
    other = tmp_path / "other.png"
    Image.fromarray(textured_rgb(23, 37, seed=9)).save(other)
    result = invoke(image, other, "--mask", mask, "-o", tmp_path / "one.png", "--model", exported_model.folder)
    assert result.exit_code == 1 and "names one file but there are 2 images" in result.output
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    result = invoke(image, "--mask", mask, "-o", blocker, "--model", exported_model.folder)
    assert result.exit_code == 1 and "not a .png" in result.output
    result = invoke(image, "--mask", mask, "-o", blocker / "sub", "--model", exported_model.folder)
    assert result.exit_code == 1 and "cannot create output folder" in result.output
    assert blocker.read_text() == "a file, not a folder"
    twin = tmp_path / "twin"
    twin.mkdir()
    Image.fromarray(textured_rgb(23, 37)).save(twin / "photo.png")
    result = invoke(image, twin / "photo.png", "--mask", mask, "-o", tmp_path / "out", "--model", exported_model.folder)
    assert result.exit_code == 1 and "would both be written to" in result.output


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_unwritable_output_folder(exported_model: ExportedModel, rgb_case: tuple[Path, Path], tmp_path: Path) -> None:
    image, mask = rgb_case
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = invoke(image, "--mask", mask, "-o", locked, "--model", exported_model.folder)
    finally:
        locked.chmod(0o700)
    assert result.exit_code == 1 and "not writable" in result.output
    assert not list(locked.iterdir())


# ------------------------------------------------------------- backends, batches


def test_backends_agree_within_one_level(exported_model: ExportedModel, rgb_case: tuple[Path, Path]) -> None:
    image, mask = rgb_case
    outputs = []
    for backend in ("onnx", "torchscript", "eager"):
        out = image.with_name(f"{backend}.png")
        result = invoke(image, "--mask", mask, "-o", out, "--backend", backend, "--model", exported_model.folder)
        assert result.exit_code == 0, result.output
        assert f"backend: {backend}" in result.output
        outputs.append(decoded(out, "RGB").astype(int))
    for other in outputs[1:]:
        assert np.abs(other - outputs[0]).max() <= 1


def test_batching_does_not_change_results(exported_model: ExportedModel, tmp_path: Path) -> None:
    folder = tmp_path / "same_size"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(textured_rgb(20, 24, seed=i)).save(folder / f"img{i}.png")
    mask = tmp_path / "mask.png"
    box_mask_image(20, 24, 4, 4, 12, 14).save(mask)
    for batch in ("3", "1"):
        result = invoke(folder, "--mask", mask, "-o", tmp_path / f"b{batch}", "--batch-size", batch,
                        "--model", exported_model.folder)  # fmt: skip
        assert result.exit_code == 0, result.output
    for i in range(3):
        a = decoded(tmp_path / "b3" / f"img{i}.inpainted.png", "RGB").astype(int)
        b = decoded(tmp_path / "b1" / f"img{i}.inpainted.png", "RGB").astype(int)
        assert np.abs(a - b).max() <= 1


def test_crop_strategy_on_a_large_image(exported_model: ExportedModel, tmp_path: Path) -> None:
    image = tmp_path / "large.png"
    Image.fromarray(textured_rgb(200, 200)).save(image)
    mask = tmp_path / "mask.png"
    box_mask_image(200, 200, 90, 100, 104, 115).save(mask)
    assert AUTO_CROP_FACTOR * 32 < 200  # so auto picks crop for this train-size-32 model
    runs = {
        "auto": [],
        "full": ["--strategy", "full"],
        "wide": ["--strategy", "crop", "--crop-margin", "200"],
        "resize": ["--strategy", "resize"],
    }
    for name, extra in runs.items():
        result = invoke(image, "--mask", mask, "-o", tmp_path / f"{name}.png", *extra, "--model", exported_model.folder)
        assert result.exit_code == 0, result.output
        assert_only_hole_changed(decoded(image, "RGB"), decoded(tmp_path / f"{name}.png", "RGB"), hole_of(mask))
    full = decoded(tmp_path / "full.png", "RGB").astype(int)
    # a window that covers the model's whole context reproduces the full run
    assert np.abs(decoded(tmp_path / "wide.png", "RGB").astype(int) - full).max() <= 1
    crop = decoded(tmp_path / "auto.png", "RGB").astype(int)
    assert np.abs(crop - full)[hole_of(mask)].mean() < 25


# --------------------------------------------------------------------- providers


@NO_GPU_ONLY
def test_provider_selection_without_a_gpu(exported_model: ExportedModel, rgb_case: tuple[Path, Path]) -> None:
    image, mask = rgb_case
    result = invoke(image, "--mask", mask, "--model", exported_model.folder, "--provider", "cuda")
    assert result.exit_code == 1
    assert "provider 'cuda' could not be loaded" in result.output and "no NVIDIA GPU is visible" in result.output
    assert not image.with_name("photo.inpainted.png").exists()
    result = invoke(image, "--mask", mask, "--model", exported_model.folder, "--backend", "eager", "--provider", "cuda")
    import torch

    # the cause depends on the torch build: a CPU-only wheel, or a CUDA wheel on a machine without a GPU
    cause = "CPU-only build" if torch.version.cuda is None else "torch finds no CUDA device"
    assert result.exit_code == 1 and cause in result.output, result.output
    result = invoke(image, "--mask", mask, "--model", exported_model.folder)  # auto
    assert result.exit_code == 0, result.output
    assert "provider: CPUExecutionProvider (no CUDA device found; running on the CPU)" in result.output
    assert "(provider CPUExecutionProvider, backend onnx)" in result.output


@NO_GPU_ONLY
def test_real_console_entry(
    exported_model: ExportedModel, rgb_case: tuple[Path, Path], subprocess_env: dict[str, str]
) -> None:
    image, mask = rgb_case
    command = [sys.executable, "-m", "gantool", "inpaint", str(image), "--mask", str(mask),
               "--model", str(exported_model.folder)]  # fmt: skip
    done = subprocess.run(command, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "running on the CPU" in done.stdout and "1 inpainted, 0 failed" in done.stdout
    assert image.with_name("photo.inpainted.png").is_file()

    done = subprocess.run([*command, "--provider", "cuda", "--overwrite"], env=subprocess_env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1
    # one line naming the cause; ONNX Runtime's own load errors are not shown
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("Error: provider 'cuda' could not be loaded: ")
    assert done.stdout == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ends_inpaint_in_one_line_and_skip_existing_finishes(
    exported_model: ExportedModel, tmp_path: Path, subprocess_env: dict[str, str], sig: signal.Signals
) -> None:
    """Ctrl-C or SIGTERM while a folder is inpainted: one line saying how far it got and how to
    finish, exit 130 / 143, only whole outputs; the same command with --skip-existing finishes.
    Before: Ctrl-C printed click's "Aborted!" and exited 1, as for an error."""
    images = tmp_path / "my images"
    images.mkdir()
    for i in range(80):
        Image.fromarray(textured_rgb(96, 96, seed=i)).save(images / f"p{i:03d}.png")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "gantool", "inpaint", str(images), "--box", "8,8,64,64",
               "--model", str(exported_model.folder), "-o", str(out), "--skip-existing"]  # fmt: skip
    proc = subprocess.Popen(command, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out.is_dir() and any(out.iterdir())) and proc.poll() is None:
            assert time.monotonic() < deadline, "no output within 120 s"
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "Aborted" not in err, err[-2000:]
    assert lines[0].startswith(f"interrupted ({sig.name}): ") and "of 80 input(s) done" in lines[0], lines[0]
    assert "--skip-existing" in lines[0]
    written = sorted(out.iterdir())
    assert 0 < len(written) < 80 and all(p.name.endswith(".inpainted.png") for p in written)
    for path in written:  # whole files only
        with Image.open(path) as image:
            image.load()
    done = subprocess.run(command, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{80 - len(written)} inpainted" in done.stdout and len(list(out.iterdir())) == 80


def test_a_failed_write_on_the_writer_thread_fails_that_file_only(exported_model: ExportedModel, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a", "b", "c"):
        Image.fromarray(textured_rgb(24, 28, seed=ord(name))).save(folder / f"{name}.png")
    mask = tmp_path / "mask.png"
    box_mask_image(24, 28, 6, 6, 14, 16).save(mask)
    out = tmp_path / "out"
    (out / "b.inpainted.png").mkdir(parents=True)  # the rename onto a folder fails at write time
    result = invoke(folder, "--mask", mask, "-o", out, "--model", exported_model.folder, "--overwrite",
                    "--batch-size", "2")
    assert result.exit_code == 1, result.output
    assert "2 inpainted, 1 failed" in result.output and "b.png" in result.output
    assert (out / "a.inpainted.png").is_file() and (out / "c.inpainted.png").is_file()
    assert (out / "b.inpainted.png").is_dir() and not list((out / "b.inpainted.png").iterdir())
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp file left behind


def test_a_blend_over_max_blend_pixels_warns_with_its_time_and_still_runs(
    exported_model: ExportedModel, rgb_case: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    # The hole is rows 5..13, cols 9..21: its blend region is (9+2+16) x (13+2+16) = 837 pixels
    # (the dilated box plus 8 px on every side), the estimate gantool serve refuses over its limit.
    image, mask = rgb_case
    out = image.with_name("photo.inpainted.png")
    with caplog.at_level("WARNING", logger="gantool.inference.pipeline"):
        result = invoke(image, "--mask", mask, "--model", exported_model.folder, "--max-blend-pixels", 836)
    assert result.exit_code == 0, result.output
    assert out.is_file()  # warned, not refused: the job runs
    warnings = [r.getMessage() for r in caplog.records if "--max-blend-pixels" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "solves over 837 pixels" in warnings[0] and "(836)" in warnings[0] and "--blend none" in warnings[0]
    assert " s to " in warnings[0]  # how long it takes
    caplog.clear()
    out.unlink()
    for limit in ("837", "0"):  # at the limit, or no limit: silent
        with caplog.at_level("WARNING", logger="gantool.inference.pipeline"):
            result = invoke(image, "--mask", mask, "--model", exported_model.folder, "--max-blend-pixels", limit,
                            "--overwrite")  # fmt: skip
        assert result.exit_code == 0 and out.is_file(), result.output
        assert "--max-blend-pixels" not in caplog.text

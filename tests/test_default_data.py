"""examples/make_default_data.py: the default model's photographs from Debian's wallpaper
packages (one resolution per picture, illustrations left out, whole photographs held out)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from numerics import fp32_tol

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "make_default_data.py"


def _script():
    spec = importlib.util.spec_from_file_location("make_default_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_packages(root: Path, script) -> None:
    """An unpacked mate-backgrounds + plasma-workspace-wallpapers tree of tiny JPEGs: every
    photograph, plus two illustrations; plasma pictures at three resolutions each."""
    for index, where in enumerate(script.DEBIAN_PHOTOS.values()):
        colour = (index * 9 % 256, 80, 200 - index * 5)
        if where.endswith(".jpg"):
            (root / where).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (64, 48), colour).save(root / where)
        else:
            (root / where).mkdir(parents=True, exist_ok=True)
            for w, h in ((40, 30), (80, 50), (64, 48)):  # the largest is 80 x 50
                Image.new("RGB", (w, h), colour).save(root / where / f"{w}x{h}.jpg")
    for name in script.DEBIAN_ILLUSTRATIONS[:2]:
        folder = root / script.PLASMA / name / "contents" / "images"
        folder.mkdir(parents=True)
        Image.new("RGB", (80, 50), (255, 0, 255)).save(folder / "80x50.jpg")


def test_the_lists_are_disjoint_and_the_held_out_photos_are_photographs():
    script = _script()
    assert set(script.DEBIAN_HELDOUT) <= set(script.DEBIAN_PHOTOS)
    assert not set(script.DEBIAN_PHOTOS) & set(script.DEBIAN_ILLUSTRATIONS)
    assert len(set(script.DEBIAN_PHOTOS) - set(script.DEBIAN_HELDOUT)) >= 12


def test_debian_photos_split_by_whole_picture_at_one_resolution(tmp_path: Path):
    script = _script()
    root = tmp_path / "debian-photos"
    _fake_packages(root, script)
    written = script.write_debian_photos(root, tmp_path / "data")
    train = {p.stem for p in written["train"]}
    heldout = {p.stem for p in written["heldout"]}
    assert heldout == set(script.DEBIAN_HELDOUT)
    assert train == set(script.DEBIAN_PHOTOS) - heldout  # no illustration, every photo once
    assert not train & heldout
    plasma = next(p for p in written["train"] if p.stem == "Grey")
    assert Image.open(plasma).size == (80, 50)  # the largest of the three resolutions
    assert sorted(p.name for p in (tmp_path / "data" / "train").iterdir()) == sorted(f"{n}.png" for n in train)


def test_large_photos_are_capped_and_missing_sources_are_one_line(tmp_path: Path):
    script = _script()
    root = tmp_path / "debian-photos"
    where = root / script.DEBIAN_PHOTOS["Dune"]
    where.parent.mkdir(parents=True)
    Image.new("RGB", (script.PHOTO_MAX_SIDE * 2, 100), (10, 20, 30)).save(where)
    written = script.write_debian_photos(root, tmp_path / "data")
    assert [p.stem for p in written["train"]] == ["Dune"]
    assert Image.open(written["train"][0]).size == (script.PHOTO_MAX_SIDE, 50)

    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "none"), "--debian", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "skipping Debian's photographs: none under" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "none").exists() and not (tmp_path / ".none.partial").exists()


def test_an_existing_output_folder_is_never_written_into(tmp_path: Path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--debian", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "not empty" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def _learn_harmonic_target():
    pytest.importorskip("scipy", reason='the harmonic target needs scipy (pip install "gantool[demo]")')
    spec = importlib.util.spec_from_file_location(
        "learn_harmonic_target", REPO / "examples" / "learn_harmonic_target.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_harmonic_target_solves_laplaces_equation_in_the_hole():
    """examples/learn_harmonic_target.py's target: known pixels kept, a linear ramp (harmonic)
    reproduced exactly, and each hole pixel the mean of its four neighbours."""
    module = _learn_harmonic_target()
    yy, xx = np.mgrid[0:24, 0:20].astype(np.float32)
    ramp = np.stack([0.01 * xx, 0.02 * yy, 0.5 + 0.005 * (xx - yy)])
    mask = np.zeros((24, 20), np.float32)
    mask[5:15, 4:17] = 1.0
    filled = module.harmonic_fill(np.where(mask > 0, 0.9, ramp).astype(np.float32), mask)
    # float64 solves rounded to float32: a few ulps
    np.testing.assert_allclose(filled, ramp, rtol=0, atol=fp32_tol(ramp, 4))
    rng = np.random.default_rng(0)
    noisy = rng.random((3, 24, 20)).astype(np.float32)
    filled = module.harmonic_fill(noisy, mask)
    assert np.array_equal(filled[:, mask == 0], noisy[:, mask == 0])
    neighbours = (filled[:, 4:14, 4:17] + filled[:, 6:16, 4:17] + filled[:, 5:15, 3:16] + filled[:, 5:15, 5:18]) / 4
    np.testing.assert_allclose(filled[:, 5:15, 4:17], neighbours, rtol=0, atol=fp32_tol(filled, 4))


def test_the_full_resolution_control_starts_as_the_push_pull_fill():
    """The control network of examples/learn_harmonic_target.py (--network full-res): untrained it
    returns the push-pull fill in the hole (its last convolution starts at 0) and the known pixels
    unchanged, and one step on a batch moves its output."""
    import torch

    from gantool.nn.networks import push_pull_fill

    module = _learn_harmonic_target()
    torch.manual_seed(0)
    net = module.FullResolutionCorrection((0.5, 0.4, 0.3), width=8, dilations=(1, 2))
    image = torch.rand(2, 3, 24, 20)
    mask = torch.zeros(2, 1, 24, 20)
    mask[:, :, 6:16, 5:14] = 1.0
    fill = push_pull_fill(image, 1.0 - mask, net.fill)
    out = net(image, mask)
    assert torch.equal(out, image * (1 - mask) + fill * mask)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    (((net(image, mask) - image) ** 2) * mask).sum().backward()
    optimizer.step()
    moved = net(image, mask)
    assert torch.equal(moved * (1 - mask), image * (1 - mask)) and not torch.equal(moved, out)


@pytest.mark.slow  # the example's full-size network (width 32, 128 px crops): 20-50 s on 2 cores
def test_fresh_harmonic_training_saves_weights_that_init_a_run(tmp_path: Path, subprocess_env):
    """examples/learn_harmonic_target.py --fresh --save: new crops and holes each step, and the
    network written as generator.safetensors, which `gantool train --init-from` reads; mixed holes
    come with their harmonic targets."""
    module = _learn_harmonic_target()
    rng = np.random.default_rng(0)
    for folder in ("train", "heldout"):
        (tmp_path / folder).mkdir()
        for i in range(2):
            pixels = (rng.random((160, 200, 3)) * 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / folder / f"{i}.png")
    photos = [Image.open(p).convert("RGB") for p in sorted((tmp_path / "train").iterdir())]
    images, masks, targets = module.make_set(photos, 3, rng, "mixed")
    assert images.shape == targets.shape == (3, 3, 128, 128) and masks.shape == (3, 1, 128, 128)
    known = (masks == 0).expand_as(images)
    assert bool((masks.sum(dim=(1, 2, 3)) > 0).all()) and bool((targets[known] == images[known]).all())
    saved = tmp_path / "distilled.safetensors"
    args = ["--data", str(tmp_path / "train"), "--heldout", str(tmp_path / "heldout"), "--crops", "4",
            "--steps", "2", "--report-every", "2", "--fresh", "--masks", "mixed", "--save", str(saved)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "learn_harmonic_target.py"), *args],
        capture_output=True, text=True, env=subprocess_env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step     2:" in done.stdout
    from gantool.training.init_from import load_init

    init = load_init(saved)
    assert (init.model_config.width, init.model_config.size, init.model_config.hole_fill) == (32, 128, "push-pull")
    assert init.discriminator is None and init.generator

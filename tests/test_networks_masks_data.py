"""Networks, masks and the data pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import briefly_trained_generator
from gantool.core.config import ModelConfig, TrainConfig
from gantool.core.errors import InputError
from gantool.core.processing import image_to_array, read_image
from gantool.nn.masks import box_mask, free_form_mask, generate_mask, hole_window
from gantool.nn.networks import (
    PUSH_PULL_LEVELS,
    CompletionNetwork,
    ContextDiscriminator,
    count_parameters,
    fold_batchnorm,
    hole_input,
    hole_output,
    num_downsamples,
    push_pull_fill,
)
from gantool.training.data import (
    ImageFolderSource,
    InpaintingDataset,
    StepBatchSampler,
    SyntheticSource,
    random_crop_resize,
    random_scaled_crop,
)
from numerics import assert_fp32_close, conv_fan_in
from tiny import TINY_MODEL


def test_glcic_generator_has_the_paper_size():
    generator = CompletionNetwork(ModelConfig())
    convs = [m for m in generator.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
    assert len(convs) == 17
    assert count_parameters(generator) == pytest.approx(6.07e6, rel=0.01)


def test_discriminator_depth_follows_the_input_size():
    assert [num_downsamples(s) for s in (96, 128, 160, 256)] == [5, 5, 5, 6]
    d = ContextDiscriminator(ModelConfig(**TINY_MODEL))
    logits = d(torch.rand(3, 3, 16, 16), torch.rand(3, 3, 32, 32))
    assert logits.shape == (3,)


@pytest.mark.parametrize("shape", [(1, 32, 32), (2, 20, 44), (3, 64, 36)])
def test_generator_keeps_known_pixels_exactly_at_any_stride_multiple(shape):
    n, h, w = shape
    g = CompletionNetwork(ModelConfig(**TINY_MODEL)).eval()
    image = torch.rand(n, 3, h, w)
    mask = (torch.rand(n, 1, h, w) > 0.7).float()
    with torch.no_grad():
        out = g(image, mask)
    assert out.shape == image.shape
    keep = mask.expand_as(image) == 0
    assert torch.equal(out[keep], image[keep])
    assert out.min() >= 0 and out.max() <= 1


def test_fold_batchnorm_matches_unfolded_with_trained_statistics():
    g = CompletionNetwork(ModelConfig(**TINY_MODEL))
    g.train()
    with torch.no_grad():
        for _ in range(3):  # move BN running statistics away from their defaults
            g(torch.rand(4, 3, 32, 32), (torch.rand(4, 1, 32, 32) > 0.5).float())
    g.eval()
    folded = fold_batchnorm(g)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    image, mask = torch.rand(2, 3, 24, 40), torch.ones(2, 1, 24, 40)
    with torch.no_grad():
        assert_fp32_close(folded(image, mask), g(image, mask), conv_fan_in(g))  # equal in exact arithmetic


@pytest.mark.parametrize("kind", ["box", "free", "mixed"])
def test_masks_are_seeded_binary_and_inside_the_local_window(kind):
    for seed in range(20):
        mask, (top, left) = generate_mask(kind, np.random.default_rng(seed), (48, 64), 24)
        again, corner = generate_mask(kind, np.random.default_rng(seed), (48, 64), 24)
        assert np.array_equal(mask, again) and corner == (top, left)
        assert set(np.unique(mask)) <= {0.0, 1.0} and mask.sum() > 0
        assert mask[top : top + 24, left : left + 24].sum() == mask.sum()
        assert 0 <= top <= 48 - 24 and 0 <= left <= 64 - 24


def test_box_mask_sides_stay_in_the_requested_range():
    for seed in range(30):
        mask, _ = box_mask(np.random.default_rng(seed), 96, 48, (10, 20))
        ys, xs = np.nonzero(mask)
        assert 10 <= ys.max() - ys.min() + 1 <= 20 and 10 <= xs.max() - xs.min() + 1 <= 20


def test_free_form_masks_vary_and_mixed_uses_both():
    areas = {free_form_mask(np.random.default_rng(s), 64, 32)[0].sum() for s in range(10)}
    assert len(areas) > 5
    kinds = set()
    for s in range(30):
        m, _ = generate_mask("mixed", np.random.default_rng(s), 64, 32)
        ys, xs = np.nonzero(m)
        kinds.add(m.sum() == (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    assert kinds == {True, False}


def test_hole_window_contains_a_centered_hole():
    mask = np.zeros((100, 100), np.float32)
    mask[40:50, 60:70] = 1
    top, left = hole_window(mask, 32)
    assert mask[top : top + 32, left : left + 32].sum() == mask.sum()


# ---------------------------------------------------------------------------------- data


def save_modes(folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rgb = Image.new("RGB", (40, 30), (200, 50, 10))
    rgb.convert("L").save(folder / "gray.png")
    rgb.convert("LA").save(folder / "gray_alpha.png")
    rgb.convert("P").save(folder / "palette.bmp")
    rgb.convert("RGBA").save(folder / "rgba.webp")
    rgb.convert("CMYK").save(folder / "cmyk.jpg")
    rgb.save(folder / "plain.tif")
    Image.fromarray(np.full((30, 40), 65535, np.uint16)).save(folder / "deep16.png")


def test_every_mode_becomes_rgb_in_unit_range(tmp_path):
    save_modes(tmp_path / "sub")
    source = ImageFolderSource(tmp_path)
    assert len(source) == 7 and source.skipped == []
    rng = np.random.default_rng(0)
    for i in range(len(source)):
        arr = source.load(i, 24, rng)
        assert arr.shape == (3, 24, 24) and arr.dtype == np.float32
        assert arr.min() >= 0.0 and arr.max() <= 1.0
    deep = image_to_array(Image.open(tmp_path / "sub" / "deep16.png"))
    assert deep.max() == pytest.approx(1.0)  # 16-bit white is white, not clipped garbage


def test_exif_orientation_is_applied(tmp_path):
    img = Image.new("RGB", (40, 20), (255, 0, 0))
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90 degrees when displayed
    img.save(tmp_path / "rotated.jpg", exif=exif)
    assert read_image(tmp_path / "rotated.jpg").size == (20, 40)


def test_unreadable_files_are_skipped_and_counted(tmp_path):
    save_modes(tmp_path)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    (tmp_path / "empty.jpg").write_bytes(b"")
    source = ImageFolderSource(tmp_path)
    assert len(source) == 9 and source.skipped == []  # nothing is opened before it is read
    rng = np.random.default_rng(0)
    for i in range(len(source)):
        source.load(i, 24, rng)
    assert sorted(Path(p).name for p in source.skipped) == ["corrupt.png", "empty.jpg"]
    assert source.unreadable() == (2, str(tmp_path / "corrupt.png"))
    read = []
    real_read = source.read
    source.read = lambda i: read.append(i) or real_read(i)
    for i in range(len(source)):
        source.load(i, 24, rng)
    bad = {i for i in range(len(source)) if source.paths[i].name in ("corrupt.png", "empty.jpg")}
    assert len(bad) == 2 and not bad & set(read)  # an image found unreadable is never read again


def test_truncated_image_is_replaced_by_the_next_one(tmp_path, caplog):
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "a.jpg")
    Image.new("RGB", (64, 64), (0, 0, 255)).save(tmp_path / "b.png")
    data = (tmp_path / "a.jpg").read_bytes()
    (tmp_path / "a.jpg").write_bytes(data[: len(data) // 2])  # header intact, data truncated
    source = ImageFolderSource(tmp_path)
    assert len(source) == 2  # passes the cheap scan; fails only when decoded
    arr = source.load(0, 32, np.random.default_rng(0))
    assert arr[2].mean() == pytest.approx(1.0)  # the blue image stood in
    assert any("unreadable" in r.message for r in caplog.records)


@pytest.mark.parametrize("setup, fragment", [
    (lambda p: None, "not found"),
    (lambda p: p.mkdir(), "no image files"),
    (lambda p: (p.mkdir(), (p / "x.png").write_text("nope")), "none of its 1 image file"),
    (lambda p: p.write_text("file"), "got a file"),
])
def test_unusable_data_folders_are_clear_errors(tmp_path, setup, fragment):
    path = tmp_path / "data"
    setup(path)
    with pytest.raises(InputError, match=fragment):  # an unreadable file is found when it is read
        ImageFolderSource(path).load(0, 24, np.random.default_rng(0))


def test_random_crop_resize_is_seeded():
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8))
    a = random_crop_resize(img, 32, np.random.default_rng(5))
    b = random_crop_resize(img, 32, np.random.default_rng(5))
    assert a.shape == (3, 32, 32) and np.array_equal(a, b)


def test_synthetic_images_are_deterministic_and_varied():
    source = SyntheticSource(seed=3)
    a = source.load(4, 32, np.random.default_rng(1))
    b = source.load(4, 32, np.random.default_rng(1))
    c = source.load(5, 32, np.random.default_rng(1))
    assert np.array_equal(a, b) and not np.array_equal(a, c) and a.std() > 0.02


def test_batch_sampler_covers_each_epoch_and_splits_ranks():
    sampler = StepBatchSampler(10, 5, seed=1, start_step=0, end_step=4)
    batches = list(sampler)
    epoch0 = [i for b in batches[:2] for i, _ in b]
    assert sorted(epoch0) == list(range(10))
    seeds = [s for b in batches for _, s in b]
    assert len(set(seeds)) == len(seeds)
    # resuming at step 2 yields the same batches as the straight run
    assert list(StepBatchSampler(10, 5, 1, 2, 4)) == batches[2:]
    # two ranks together see exactly the global batch
    ranks = [StepBatchSampler(10, 4, 1, 0, 3, rank=r, world_size=2) for r in (0, 1)]
    single = StepBatchSampler(10, 4, 1, 0, 3)
    for step in range(3):
        assert ranks[0].batch_keys(step) + ranks[1].batch_keys(step) == single.batch_keys(step)
    with pytest.raises(InputError, match="divisible"):
        StepBatchSampler(10, 5, 1, 0, 3, rank=0, world_size=2)


def test_atomic_writes_leave_nothing_on_failure_and_use_normal_permissions(tmp_path):
    import os
    import stat

    from gantool.core.fileio import atomic_path, atomic_write_text

    target = tmp_path / "out.txt"
    atomic_write_text(target, "first")
    mode = stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half-writ")
        raise RuntimeError("disk full")
    assert target.read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with pytest.raises(InputError, match="refusing to overwrite"):
        atomic_write_text(target, "second", overwrite=False)
    assert target.read_text() == "first"


def _noise_photo(path, width=300, height=200, seed=0):
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


def test_a_unit_scale_crop_is_a_window_of_the_photo_itself():
    photo = Image.fromarray(np.random.default_rng(1).integers(0, 256, (120, 160, 3), dtype=np.uint8))
    whole = image_to_array(photo).transpose(2, 0, 1)
    for seed in range(5):
        crop = random_scaled_crop(photo, 32, (1.0, 1.0), np.random.default_rng(seed))
        # side 32 at scale 1: no resampling, so the crop (or its mirror) is found verbatim
        found = [
            (top, left)
            for top in range(120 - 31)
            for left in range(160 - 31)
            if np.array_equal(whole[:, top : top + 32, left : left + 32], crop)
            or np.array_equal(whole[:, top : top + 32, left : left + 32][:, :, ::-1], crop)
        ]
        assert len(found) == 1


def test_scaled_crops_are_capped_by_the_shorter_side():
    photo = Image.fromarray(np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    full = image_to_array(photo.resize((16, 16), Image.Resampling.BICUBIC, reducing_gap=3.0)).transpose(2, 0, 1)
    for seed in range(4):  # 16 x 8 = 128 > 64: every window is the whole photo
        crop = random_scaled_crop(photo, 16, (8.0, 8.0), np.random.default_rng(seed))
        assert np.array_equal(crop, np.clip(full, 0, 1)) or np.array_equal(crop, np.clip(full, 0, 1)[:, :, ::-1])


def test_scale_range_sets_how_much_of_the_photo_a_crop_sees():
    # A photo of one smooth ramp: a wider window sees a wider span of values.
    ramp = np.tile(np.linspace(0, 255, 400, dtype=np.float32), (400, 1))
    photo = Image.fromarray(np.repeat(ramp[..., None], 3, axis=2).astype(np.uint8))

    def spans(scales):
        crops = [random_scaled_crop(photo, 20, scales, np.random.default_rng(s)) for s in range(30)]
        return [float(c[0].max() - c[0].min()) for c in crops]

    narrow, wide = spans((1.0, 1.5)), spans((8.0, 12.0))
    assert max(narrow) < 0.1 and min(wide) > 0.35  # 20..30 px of 400 against 160..240 px


def test_decoding_once_changes_no_sample(tmp_path):
    for i in range(3):
        _noise_photo(tmp_path / f"p{i}.png", seed=i)
    cached = ImageFolderSource(tmp_path, (1.0, 3.0))
    fresh = ImageFolderSource(tmp_path, (1.0, 3.0))
    fresh.cache_decoded = False
    assert cached.cache_decoded  # three small photos fit the budget
    keys = [(i % 3, 1000 + i) for i in range(9)]
    a = [InpaintingDataset(cached, 32, 16, "mixed")[k] for k in keys]
    b = [InpaintingDataset(fresh, 32, 16, "mixed")[k] for k in keys]
    for x, y in zip(a, b):
        assert all(torch.equal(u, v) for u, v in zip(x, y))
    for path in tmp_path.iterdir():  # decoded once: later samples need no file at all
        path.unlink()
    again = InpaintingDataset(cached, 32, 16, "mixed")[keys[0]]
    assert all(torch.equal(u, v) for u, v in zip(again, a[0]))


def test_a_folder_too_large_to_cache_is_decoded_per_sample(tmp_path, monkeypatch):
    from gantool.training import readers as readers_module

    _noise_photo(tmp_path / "big.png")
    monkeypatch.setattr(readers_module, "DECODE_CACHE_BYTES", 300 * 200 * 3 - 1)
    source = ImageFolderSource(tmp_path, (1.0, 2.0))
    source.load(0, 32, np.random.default_rng(0))
    assert source._decoded == {}


@pytest.mark.parametrize("changes, fragment", [
    ({"scale_min": 3.0, "scale_max": 2.0}, "scale_min <= scale_max"),
    ({"scale_min": 0.5}, "scale_min = 0.5: expected a number in [1, 64]"),
    ({"scale_max": "big"}, "scale_max = 'big': expected a number"),
    ({"scale_max": 65}, "scale_max = 65"),
])
def test_bad_crop_scales_are_one_line(changes, fragment):
    with pytest.raises(InputError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        TrainConfig.from_dict(changes).validate()


def test_one_crop_bound_alone_takes_the_other_from_the_defaults():
    assert TrainConfig().scale_range() is None  # the older draw: runs made before resume bitwise
    assert TrainConfig(scale_min=2.0).scale_range() == (2.0, 64.0)
    assert TrainConfig(scale_max=3.0).scale_range() == (1.0, 3.0)


def test_channel_shuffle_permutes_or_greys_each_crop_and_keeps_the_holes(tmp_path):
    """--channel-shuffle: each crop's channels in one of the 6 orders, or (one in 8) grey luma; the
    crop and the hole are those of the same key without it, and a key always gives the same sample."""
    from gantool.core.processing import LUMA_WEIGHTS
    from gantool.training.data import GREY_SHARE, shuffle_channels

    image = (np.random.default_rng(0).random((3, 8, 8)) * np.array([0.2, 0.5, 1.0])[:, None, None]).astype(np.float32)
    orders, greys, draws = set(), 0, 480
    for seed in range(draws):
        out = shuffle_channels(image, np.random.default_rng(seed))
        order = [next((j for j in range(3) if np.array_equal(out[i], image[j])), None) for i in range(3)]
        if None in order:
            np.testing.assert_array_equal(out, np.broadcast_to(np.tensordot(LUMA_WEIGHTS, image, axes=1), image.shape))
            greys += 1
        else:
            assert sorted(order) == [0, 1, 2]
            orders.add(tuple(order))
    assert len(orders) == 6
    expected, spread = draws / GREY_SHARE, 4 * (draws / GREY_SHARE * (1 - 1 / GREY_SHARE)) ** 0.5  # 4 sigma
    assert abs(greys - expected) < spread, greys
    folder = tmp_path / "photos"
    folder.mkdir()
    _noise_photo(folder / "a.png")
    plain = InpaintingDataset(ImageFolderSource(folder), 32, 16, "mixed")
    shuffled = InpaintingDataset(ImageFolderSource(folder), 32, 16, "mixed", channel_shuffle=True)
    for key in [(0, s) for s in range(12)]:
        (img, mask, corner), (shuf, shuf_mask, shuf_corner) = plain[key], shuffled[key]
        assert torch.equal(mask, shuf_mask) and torch.equal(corner, shuf_corner)
        permuted = any(torch.equal(shuf, img[list(p)]) for p in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0),
                                                                 (2, 0, 1), (2, 1, 0)])  # fmt: skip
        grey = torch.equal(shuf, torch.from_numpy(np.tensordot(LUMA_WEIGHTS, img.numpy(), axes=1)).expand(3, -1, -1))
        assert permuted or grey
        assert all(torch.equal(a, b) for a, b in zip(shuffled[key], (shuf, shuf_mask, shuf_corner)))


def test_the_fill_of_a_channel_shuffled_run_is_the_grey_its_network_sees(tmp_path):
    from gantool.core.processing import LUMA_WEIGHTS
    from gantool.training.data import GREY_SHARE, estimate_fill

    folder = tmp_path / "photos"
    folder.mkdir()
    green = np.zeros((40, 60, 3), np.uint8)
    green[..., 1], green[..., 0] = 200, 40
    Image.fromarray(green).save(folder / "green.png")
    source = ImageFolderSource(folder)
    plain = np.array(estimate_fill(source, 32))
    np.testing.assert_allclose(plain, [40 / 255, 200 / 255, 0], atol=1e-6)
    grey = estimate_fill(source, 32, channel_shuffle=True)
    value = (1 - 1 / GREY_SHARE) * plain.mean() + float(LUMA_WEIGHTS @ plain) / GREY_SHARE
    assert grey == pytest.approx((value, value, value), abs=1e-6)


# ------------------------------------------------------------------ the push-pull hole fill


def _two_holes(height: int = 44, width: int = 36) -> torch.Tensor:
    mask = torch.zeros(2, 1, height, width)
    mask[0, :, 5:30, 4:20] = 1
    mask[1, :, 20:, 10:] = 1  # touches the bottom and right borders
    return mask


def test_push_pull_fill_keeps_known_pixels_and_fills_holes_with_a_mix_of_known_ones():
    image = torch.rand(2, 3, 44, 36, generator=torch.Generator().manual_seed(0))
    mask = _two_holes()
    known = 1 - mask
    fill = push_pull_fill(image, known, torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1))
    assert fill.shape == image.shape and fill.dtype == image.dtype
    assert torch.equal(fill * known, image * known)  # a cell of one known pixel is that pixel
    for n in range(2):  # every hole value is a weighted mean of known values: inside their range
        seen = image[n][:, known[n, 0] > 0]
        filled = fill[n][:, mask[n, 0] > 0]
        eps = torch.finfo(torch.float32).eps * PUSH_PULL_LEVELS
        assert (filled >= seen.min(dim=1, keepdim=True).values - eps).all()
        assert (filled <= seen.max(dim=1, keepdim=True).values + eps).all()


def test_push_pull_fill_takes_each_holes_own_surroundings():
    image = torch.zeros(1, 3, 32, 48)
    image[:, 0, :, :24] = 1.0  # left half red, right half blue
    image[:, 2, :, 24:] = 1.0
    mask = torch.zeros(1, 1, 32, 48)
    mask[..., 8:24, 12:36] = 1
    fill = push_pull_fill(image, 1 - mask, torch.full((1, 3, 1, 1), 0.5))
    red, blue = fill[0, 0, 16], fill[0, 2, 16]
    assert red[12] > 0.75 and blue[12] < 0.25  # the hole's left edge is red, its right edge blue
    assert red[35] < 0.25 and blue[35] > 0.75
    assert bool((red[12:36].diff() <= 1e-6).all())  # and it fades across
    assert float(fill[0, 1].abs().max()) == 0.0  # no green appears: no channel is invented
    constant = torch.full((1, 3, 32, 48), 0.3)
    tol = torch.finfo(torch.float32).eps * PUSH_PULL_LEVELS * 2
    assert float((push_pull_fill(constant, 1 - mask, torch.zeros(1, 3, 1, 1)) - 0.3).abs().max()) <= tol


def test_push_pull_fill_without_known_pixels_is_the_fill_colour():
    image = torch.rand(2, 3, 20, 28)
    default = torch.tensor([0.25, 0.5, 0.75]).view(1, 3, 1, 1)
    fill = push_pull_fill(image, torch.zeros(2, 1, 20, 28), default)
    # bilinear upsampling of a constant: weights summing to 1, so float32 rounding per level at most
    tol = torch.finfo(torch.float32).eps * PUSH_PULL_LEVELS
    assert float((fill - default).abs().max()) <= tol


def test_a_push_pull_generator_sees_the_surroundings_and_keeps_known_pixels():
    config = ModelConfig(**TINY_MODEL, hole_fill="push-pull")
    generator = briefly_trained_generator(config, seed=2)  # random BN statistics give a flat output
    image, mask = torch.rand(2, 3, 44, 36), _two_holes()
    fill = push_pull_fill(image, 1 - mask, generator.fill)
    expected = torch.cat([image * (1 - mask) + fill * mask, mask], dim=1)
    x, filled = hole_input(image, mask, generator.fill, config.hole_fill)
    assert torch.equal(x, expected) and torch.equal(filled, fill)
    with torch.no_grad():  # the body corrects the fill: out = clamp(fill + 2 * sigmoid - 1)
        body = generator.body(x)
        assert torch.equal(hole_output(body, fill, config.hole_fill), (fill + (2 * body - 1)).clamp(0, 1))
    with torch.no_grad():
        out = generator(image, mask)
        mean_pixel = CompletionNetwork(ModelConfig(**TINY_MODEL)).eval()
        mean_pixel.load_state_dict(generator.state_dict())
        other = mean_pixel(image, mask)
    assert torch.equal(out * (1 - mask), image * (1 - mask))
    assert not torch.equal(out, other)  # the same weights see another input


def test_an_untrained_push_pull_generator_returns_the_fill():
    torch.manual_seed(0)
    generator = CompletionNetwork(ModelConfig(**TINY_MODEL, hole_fill="push-pull")).eval()
    image, mask = torch.rand(2, 3, 44, 36), _two_holes()
    with torch.no_grad():
        out = generator(image, mask)
    expected = image * (1 - mask) + push_pull_fill(image, 1 - mask, generator.fill) * mask
    assert torch.equal(out, expected)  # a zero correction: sigmoid(0) = 0.5, 2 * 0.5 - 1 = 0 exactly


def test_hole_fill_is_checked_in_the_model_config():
    with pytest.raises(InputError, match="hole_fill = 'blur': expected one of mean-pixel, push-pull"):
        ModelConfig(**TINY_MODEL, hole_fill="blur").validate()
    with pytest.raises(InputError, match="hole_fill"):
        TrainConfig(**TINY_MODEL, hole_fill="blur").validate()
    assert ModelConfig.from_dict({**ModelConfig(**TINY_MODEL).to_dict(), "hole_fill": "push-pull"}).hole_fill == "push-pull"
    assert ModelConfig.from_dict({"width": 4}).hole_fill == "mean-pixel"  # files from before the option

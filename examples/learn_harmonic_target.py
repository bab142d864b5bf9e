"""Can the default generator learn a smooth, deterministic correction? (models/README.md, "What the
network adds").

The shipped network (push-pull hole fill plus a learned correction) ends up returning the fill
almost unchanged. This trains the same architecture, with plain MSE and no discriminator, towards a
target that is fully determined by each hole's border: the exact harmonic fill (Laplace's
equation, scipy's sparse solver), which is closer to the photographs than push-pull is. Crops and
holes are fixed, so the mapping is a finite table the network only has to fit.

    pip install "gantool[demo]"      # scikit-image, and with it scipy
    python examples/learn_harmonic_target.py --data data/photos/train --heldout data/photos/heldout

prints, every ``--report-every`` steps, each set's hole MSE (the first 128 training crops, 64 held-out) to the harmonic target as a ratio to
the push-pull fill's (1.0: the network adds nothing; 0.0: it reproduces the target), and at the
start how much closer to the truth the target is than the fill. ``--crops 8`` (one batch) is the
control: there the same loop drives the ratio down. ``--network full-res`` trains a control
architecture instead: 8 dilated 3x3 convolutions at full resolution (no downsampling), a linear
correction of the push-pull fill, its last convolution starting at 0, to tell whether GLCIC's
quarter-resolution body is what stops the learning.

``--fresh`` draws new crops and holes (``--masks``) every step instead of the fixed set, ``--bf16``
trains under bf16 autocast, and ``--save generator.safetensors`` writes the network at every
report, so ``gantool train --init-from`` can go on from it on the photographs themselves (the
distil-then-train pilot of models/README.md).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch
from PIL import Image
from torch import nn

from gantool.core.artifacts import META_MODEL_CONFIG
from gantool.core.config import ModelConfig
from gantool.nn.masks import generate_mask
from gantool.nn.networks import CompletionNetwork, hole_input, push_pull_fill
from gantool.training.checkpoint import save_generator_weights
from gantool.training.data import find_images, random_scaled_crop


def harmonic_fill(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``image`` (3 x H x W) with the holes (``mask`` H x W, 1 = hole) solving Laplace's equation,
    the known pixels as the boundary (4-neighbours; the image's edge a mirror)."""
    height, width = mask.shape
    ys, xs = np.nonzero(mask > 0.5)
    count = len(ys)
    index = -np.ones((height, width), np.int64)
    index[ys, xs] = np.arange(count)
    degree = np.zeros(count)
    rhs = np.zeros((count, 3))
    rows, cols = [], []
    for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        ny, nx = ys + dy, xs + dx
        inside = (ny >= 0) & (ny < height) & (nx >= 0) & (nx < width)
        degree += inside
        k, ny, nx = np.nonzero(inside)[0], ny[inside], nx[inside]
        neighbour = index[ny, nx]
        unknown = neighbour >= 0
        rows.append(k[unknown]), cols.append(neighbour[unknown])
        np.add.at(rhs, k[~unknown], image[:, ny[~unknown], nx[~unknown]].T)
    off_rows, off_cols = np.concatenate(rows), np.concatenate(cols)
    system = scipy.sparse.csr_matrix(
        (
            np.concatenate([degree, -np.ones(len(off_rows))]),
            (np.concatenate([np.arange(count), off_rows]), np.concatenate([np.arange(count), off_cols])),
        ),
        shape=(count, count),
    )
    out = image.copy()
    solved = scipy.sparse.linalg.spsolve(system.tocsc(), rhs)
    out[:, ys, xs] = np.asarray(solved, np.float32).reshape(count, 3).T
    return out


class FullResolutionCorrection(nn.Module):
    """The control: dilated 3x3 conv -> BN -> ReLU blocks at full resolution (receptive field
    133 px), then a linear correction of the push-pull fill; known pixels composited back."""

    def __init__(
        self, fill: tuple[float, ...], width: int = 32, dilations: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 1, 1)
    ):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 4
        for d in dilations:
            layers += [
                nn.Conv2d(channels, width, 3, padding=d, dilation=d, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
            ]
            channels = width
        last = nn.Conv2d(width, 3, 3, padding=1)
        nn.init.zeros_(last.weight), nn.init.zeros_(last.bias)
        self.body = nn.Sequential(*layers, last)
        self.register_buffer("fill", torch.tensor(fill).view(1, 3, 1, 1))

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x, fill = hole_input(image, mask, self.fill, "push-pull")  # the generator's own input
        return image * (1.0 - mask) + (fill + self.body(x)) * mask


def load_photos(folder: str) -> list[Image.Image]:
    """The folder's photographs, decoded once."""
    return [Image.open(p).convert("RGB") for p in find_images(folder)]


def make_set(
    photos: list[Image.Image], count: int, seed: int | np.random.Generator, masks: str = "box"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` 128 px crops (windows of 128-512 px), one 32-64 px hole each (``masks``: box,
    free or mixed, gantool's generators), and their harmonic fills."""
    rng = np.random.default_rng(seed)
    images, holes, targets = [], [], []
    for i in range(count):
        # A set at least as large as the folder takes the photographs in turn; a batch, at random.
        photo = photos[i % len(photos)] if count >= len(photos) else photos[int(rng.integers(len(photos)))]
        crop = random_scaled_crop(photo, 128, (1.0, 4.0), rng)
        mask, _ = generate_mask(masks, rng, 128, 64)
        mask = mask.astype(np.float32)
        images.append(crop), holes.append(mask[None]), targets.append(harmonic_fill(crop, mask))
    return tuple(torch.from_numpy(np.stack(a)) for a in (images, holes, targets))  # type: ignore[return-value]


def hole_mse(out: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    return float((((out - target) ** 2) * mask).sum() / (3 * mask.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="training photographs (make_default_data.py's train/)")
    parser.add_argument("--heldout", required=True, help="held-out photographs")
    parser.add_argument("--crops", type=int, default=512)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--beta1", type=float, default=0.5, help="Adam's beta1 (gantool train's default: 0.5)")
    parser.add_argument("--report-every", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--network", choices=("glcic", "full-res"), default="glcic", help="the default generator, or the control"
    )
    parser.add_argument(
        "--fresh", action="store_true", help="new random crops and holes every step (the photos decoded once)"
    )
    parser.add_argument("--masks", choices=("box", "free", "mixed"), default="box", help="the training holes")
    parser.add_argument("--bf16", action="store_true", help="train under bf16 autocast (as gantool train's amp)")
    parser.add_argument("--save", help="write the trained generator here (safetensors; for gantool train --init-from)")
    args = parser.parse_args()
    if args.save and args.network != "glcic":
        parser.error("--save needs --network glcic (gantool's generator)")

    torch.manual_seed(args.seed)
    started = time.perf_counter()
    photos = load_photos(args.data)
    train = make_set(photos, args.crops, args.seed)
    val = make_set(load_photos(args.heldout), 64, args.seed + 1)
    print(f"sets: {args.crops} training crops, 64 held-out crops ({time.perf_counter() - started:.0f} s)")
    mean_pixel = tuple(float(v) for v in train[0].mean(dim=(0, 2, 3)))
    if args.network == "glcic":
        net: nn.Module = CompletionNetwork(
            ModelConfig(
                width=32, disc_width=32, disc_fc=512, size=128, local_size=64, fill=mean_pixel, hole_fill="push-pull"
            )
        )
    else:
        net = FullResolutionCorrection(mean_pixel)
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    fill_mse = {}
    # Scored on the first 128 training crops (a forward over all of them takes a minute on 2 cores).
    scored = {"train": tuple(t[:128] for t in train), "held-out": val}
    for name, (images, masks, targets) in scored.items():
        fills = push_pull_fill(images, 1.0 - masks, torch.tensor(mean_pixel).view(1, 3, 1, 1))
        composited = images * (1 - masks) + fills * masks
        fill_mse[name] = hole_mse(composited, targets, masks)
        truth_ratio = hole_mse(targets, images, masks) / hole_mse(composited, images, masks)
        print(f"{name}: harmonic target's hole MSE to the truth = {truth_ratio:.3f} x push-pull's")

    def report(step: int) -> None:
        net.eval()
        with torch.no_grad():
            ratios = [
                hole_mse(torch.cat([net(i[k : k + 64], m[k : k + 64]) for k in range(0, len(i), 64)]), t, m)
                / fill_mse[name]
                for name, (i, m, t) in scored.items()
            ]
        net.train()
        print(
            f"step {step:5d}: hole MSE to the target / the fill's: train {ratios[0]:.4f}, "
            f"held-out {ratios[1]:.4f} ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )

    report(0)
    rng = np.random.default_rng(args.seed)
    for step in range(1, args.steps + 1):
        if args.fresh:
            images, masks, targets = make_set(photos, 8, rng, args.masks)
        else:
            batch = torch.from_numpy(rng.choice(args.crops, size=min(8, args.crops), replace=False))
            images, masks, targets = train[0][batch], train[1][batch], train[2][batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            out = net(images, masks)
        loss = (((out.float() - targets) ** 2) * masks).sum() / (3 * masks.sum())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.report_every == 0:
            report(step)
            if args.save:
                assert isinstance(net, CompletionNetwork)
                save_generator_weights(args.save, net, {META_MODEL_CONFIG: json.dumps(net.config.to_dict())})


if __name__ == "__main__":
    main()

"""Write the images bundled with scikit-image as PNGs for the default model.

    pip install "gantool[demo]"          # scikit-image
    python examples/make_default_data.py data/skimage

writes ``data/skimage/train/*.png`` (what the default model trains on) and
``data/skimage/heldout/*.png`` (never trained on; ``gantool eval`` uses them).
Only images shipped inside the scikit-image wheel are used (no downloads).
Grayscale images are converted to RGB; the longest side is capped at 512 px so
the training data loader stays cheap on a 2-core CPU.

Then train and evaluate (see models/README.md):

    gantool train --config examples/default_model.toml --data data/skimage/train --out runs/default
    gantool export runs/default/checkpoints/last.pt -o runs/default/export
    gantool eval runs/default/export/generator.onnx --data data/skimage/heldout --masks box
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

MAX_SIDE = 512

# name -> how to get it from skimage.data (a function name, or a lambda for the stereo pair).
TRAIN_IMAGES: tuple[str, ...] = (
    "astronaut", "rocket", "immunohistochemistry", "retina", "hubble_deep_field",
    "motorcycle_left", "motorcycle_right", "colorwheel", "logo", "moon", "coins",
    "clock", "cell", "grass", "gravel", "page", "text",
)
# Held out: never in the training folder. chelsea and coffee are colour photos,
# camera and brick grayscale (a face-free scene and a texture).
HELDOUT_IMAGES: tuple[str, ...] = ("chelsea", "coffee", "camera", "brick")


def _loader(name: str) -> Callable[[], np.ndarray]:
    import skimage.data

    if name == "motorcycle_left":
        return lambda: skimage.data.stereo_motorcycle()[0]
    if name == "motorcycle_right":
        return lambda: skimage.data.stereo_motorcycle()[1]
    return getattr(skimage.data, name)


def to_rgb_image(array: np.ndarray) -> Image.Image:
    """Any skimage.data array (gray, RGB, RGBA; uint8 or bool) -> an RGB PIL image."""
    if array.dtype == bool:
        array = array.astype(np.uint8) * 255
    if array.ndim == 2:
        return Image.fromarray(array.astype(np.uint8), "L").convert("RGB")
    if array.shape[2] == 4:  # RGBA logo: flatten onto white
        rgba = Image.fromarray(array.astype(np.uint8), "RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return Image.fromarray(array.astype(np.uint8), "RGB")


def cap_size(img: Image.Image, max_side: int = MAX_SIDE) -> Image.Image:
    scale = max_side / max(img.size)
    if scale >= 1:
        return img
    size = (round(img.width * scale), round(img.height * scale))
    return img.resize(size, Image.Resampling.LANCZOS)


def write_dataset(out: Path) -> dict[str, list[Path]]:
    written: dict[str, list[Path]] = {"train": [], "heldout": []}
    for split, names in (("train", TRAIN_IMAGES), ("heldout", HELDOUT_IMAGES)):
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            path = folder / f"{name}.png"
            cap_size(to_rgb_image(_loader(name)())).save(path)
            written[split].append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="data/skimage", help="output folder [data/skimage]")
    args = parser.parse_args(argv)
    try:
        import skimage  # noqa: F401
    except ModuleNotFoundError:
        print('scikit-image is missing: pip install "gantool[demo]"', file=sys.stderr)
        return 1
    written = write_dataset(Path(args.out))
    for split, paths in written.items():
        print(f"{split}: {len(paths)} images in {Path(args.out) / split}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

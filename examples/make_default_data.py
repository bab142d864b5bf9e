"""Write the default model's training and held-out photographs as PNGs.

Two sources, neither downloaded from a model or data hub:

- **Debian's wallpaper packages** (photographs, GPL-2+, see ``DEBIAN_PHOTOS``). Unpack them
  without installing them, then point ``--debian`` at the folder (or install the packages
  and leave ``--debian`` at ``/``):

      apt-get download mate-backgrounds plasma-workspace-wallpapers
      for f in mate-backgrounds_*.deb plasma-workspace-wallpapers_*.deb; do dpkg-deb -x "$f" debian-photos; done

- **scikit-image's bundled images** (``pip install "gantool[demo]"``): only its four photographs
  (``HELDOUT_IMAGES``) are used, and only as held-out images, as for every earlier default model.

    python examples/make_default_data.py data/photos --debian debian-photos

writes ``data/photos/train/*.png`` (what the default model trains on) and
``data/photos/heldout/*.png`` (never trained on; ``gantool eval`` uses them). The split is a
fixed rule on whole photographs (``DEBIAN_HELDOUT``), never crops of a training photo. Of the
plasma wallpapers, each stored at many resolutions, one file per picture is kept (the largest);
illustrations are left out by name (``DEBIAN_PHOTOS`` lists only photographs; the rest of the
package is listed in ``DEBIAN_ILLUSTRATIONS``). Photos are written with their longest side at
``PHOTO_MAX_SIDE``: large enough for crops at many scales, small enough to decode quickly.
A source that is missing is skipped with one line; with neither there is nothing to write.

Then train and evaluate (see models/README.md):

    gantool train --config examples/default_model.toml --data data/skimage/train --out runs/default
    gantool export runs/default/checkpoints/last.pt -o runs/default/export
    gantool eval runs/default/export/generator.onnx --data data/skimage/heldout --masks box
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

MAX_SIDE = 512
PHOTO_MAX_SIDE = 1280

# Photographs in Debian's wallpaper packages: name -> folder inside the unpacked package.
# mate-backgrounds 1.26 (GPL-2+): every picture in nature/ is a photograph.
MATE_NATURE = "usr/share/backgrounds/mate/nature"
PLASMA = "usr/share/wallpapers"
DEBIAN_PHOTOS: dict[str, str] = {
    **{
        name: f"{MATE_NATURE}/{name}.jpg"
        for name in (
            "Aqua",
            "Blinds",
            "Dune",
            "FreshFlower",
            "Garden",
            "GreenMeadow",
            "LadyBird",
            "RainDrops",
            "Storm",
            "TwoWings",
            "Wood",
            "YellowFlower",
        )
    },
    # plasma-workspace-wallpapers 5.27 (GPL-2+, KDE Visual Design Group): the photographs only.
    **{
        name: f"{PLASMA}/{name}/contents/images"
        for name in (
            "BytheWater",
            "ColdRipple",
            "ColorfulCups",
            "DarkestHour",
            "EveningGlow",
            "FallenLeaf",
            "Grey",
            "OneStandsOut",
            "Path",
            "summer_1am",
        )
    },
}
# The plasma pictures that are illustrations (drawn or rendered), never used.
DEBIAN_ILLUSTRATIONS: tuple[str, ...] = (
    "Altai",
    "Autumn",
    "Canopee",
    "Cascade",
    "Cluster",
    "Elarun",
    "Flow",
    "FlyingKonqui",
    "Honeywave",
    "IceCold",
    "Kay",
    "Kite",
    "Kokkini",
    "MilkyWay",
    "Opal",
    "PastelHills",
    "Patak",
    "SafeLanding",
    "Shell",
    "Volna",
)
# Whole photographs held out from training (one of each kind of scene: a flower, a
# close-up texture, a landscape with water, a forest).
DEBIAN_HELDOUT: tuple[str, ...] = ("YellowFlower", "RainDrops", "EveningGlow", "Path")

# name -> how to get it from skimage.data (a function name, or a lambda for the stereo pair).
TRAIN_IMAGES: tuple[str, ...] = (
    "astronaut",
    "rocket",
    "immunohistochemistry",
    "retina",
    "hubble_deep_field",
    "motorcycle_left",
    "motorcycle_right",
    "colorwheel",
    "logo",
    "moon",
    "coins",
    "clock",
    "cell",
    "grass",
    "gravel",
    "page",
    "text",
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


def _pixel_count(path: Path) -> int:
    with Image.open(path) as img:  # reads the header only
        return img.width * img.height


def debian_photo_file(root: Path, name: str) -> Path | None:
    """The file of one Debian photograph under ``root``: the JPEG itself, or for a plasma
    wallpaper stored at many resolutions the largest one; None when it is not there."""
    where = root / DEBIAN_PHOTOS[name]
    if where.is_file():
        return where
    if where.is_dir():
        files = [p for p in where.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
        if files:
            return max(files, key=_pixel_count)
    return None


def write_debian_photos(root: Path, out: Path) -> dict[str, list[Path]]:
    written: dict[str, list[Path]] = {"train": [], "heldout": []}
    for name in DEBIAN_PHOTOS:
        source = debian_photo_file(root, name)
        if source is None:
            continue
        split = "heldout" if name in DEBIAN_HELDOUT else "train"
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        with Image.open(source) as img:
            cap_size(img.convert("RGB"), PHOTO_MAX_SIDE).save(path)
        written[split].append(path)
    return written


def write_skimage_photos(out: Path) -> dict[str, list[Path]]:
    """scikit-image's photographs, held out (the default model never trains on them)."""
    written: dict[str, list[Path]] = {"train": [], "heldout": []}
    folder = out / "heldout"
    folder.mkdir(parents=True, exist_ok=True)
    for name in HELDOUT_IMAGES:
        path = folder / f"{name}.png"
        cap_size(to_rgb_image(_loader(name)())).save(path)
        written["heldout"].append(path)
    return written


def write_dataset(out: Path) -> dict[str, list[Path]]:
    """The earlier default model's data: all of scikit-image's bundled images (``--skimage-only``)."""
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
    parser.add_argument("out", nargs="?", default="data/photos", help="output folder [data/photos]")
    parser.add_argument(
        "--debian",
        type=Path,
        default=Path("/"),
        help="where mate-backgrounds and plasma-workspace-wallpapers are unpacked [/]",
    )
    parser.add_argument(
        "--skimage-only",
        action="store_true",
        help="the earlier default's data: every scikit-image image, 17 trained on",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists and is not empty: choose a new folder", file=sys.stderr)
        return 1
    try:
        import skimage  # noqa: F401
    except ModuleNotFoundError:
        skimage_ok = False
        print('skipping scikit-image\'s held-out photographs: pip install "gantool[demo]"', file=sys.stderr)
    else:
        skimage_ok = True
    # Written into a sibling folder and renamed at the end: a failed or interrupted run leaves no half dataset.
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    if args.skimage_only:
        if not skimage_ok:
            return 1
        written = write_dataset(partial)
    else:
        written = write_debian_photos(args.debian, partial)
        if not written["train"]:
            print(f"skipping Debian's photographs: none under {args.debian} (see this script's help)", file=sys.stderr)
        if skimage_ok:
            written["heldout"] += write_skimage_photos(partial)["heldout"]
        if not written["train"]:
            print("no training photographs written", file=sys.stderr)
            shutil.rmtree(partial, ignore_errors=True)
            return 1
    if out.exists():
        out.rmdir()  # empty, checked above
    partial.rename(out)
    written = {split: [out / p.relative_to(partial) for p in paths] for split, paths in written.items()}
    for split, paths in written.items():
        print(f"{split}: {len(paths)} images in {Path(args.out) / split}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's before/after picture of the quickstart: the photo with its holes, then what
`gantool inpaint` writes for it with the shipped model and its defaults.

    python examples/quickstart_figure.py examples/quickstart.png [--model models/]

The holes are shown white in the left half; the right half is the output, byte for byte what the
quickstart's first command writes (same image, mask, model and defaults).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from gantool.inference.inpainter import Inpainter, load_mask

EXAMPLES = Path(__file__).resolve().parent
GAP = 4  # px of white between the two halves


def before_after(model: str | None = None) -> Image.Image:
    """[photo with white holes | inpainted], side by side."""
    photo = Image.open(EXAMPLES / "chelsea.png").convert("RGB")
    hole = load_mask(EXAMPLES / "chelsea_mask.png", photo) > 0.5
    after = np.asarray(Inpainter(model).inpaint(photo, EXAMPLES / "chelsea_mask.png"))
    before = np.asarray(photo).copy()
    before[hole] = 255
    gap = np.full((before.shape[0], GAP, 3), 255, np.uint8)
    return Image.fromarray(np.concatenate([before, gap, after], axis=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default=None, help="model file or export folder (default: the shipped model)")
    args = parser.parse_args()
    before_after(args.model).save(args.out, optimize=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The model card's evaluation: hole PSNR per seed, mean and range, for every method.

    python examples/eval_default.py models/ --data data/photos/heldout --seeds 0 1 2

Runs ``gantool eval`` (the library call) at 128 and 256 px, box holes and free-form strokes,
``--masks-per-image`` holes per image and seed, and prints one markdown table per setting: each
method's hole PSNR for every seed, their mean and range, then the margin of the default
(the blended output) over Telea and Navier-Stokes, the figures the default model's goal is stated in.
"""

from __future__ import annotations

import argparse
import statistics

from gantool.tools.evaluate import METHOD_NAMES, evaluate

DEFAULT_ROW = "gantool_poisson"  # what `gantool inpaint` writes by default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model file or export folder (as for gantool eval)")
    parser.add_argument("--data", required=True, help="held-out photographs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--masks-per-image", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--masks", nargs="+", default=["box", "free"], choices=["box", "free"])
    args = parser.parse_args()
    for size, masks in [(size, masks) for size in args.sizes for masks in args.masks]:
        psnr: dict[str, list[float]] = {}
        for seed in args.seeds:
            result = evaluate(
                args.model, args.data, masks=masks, size=size, seed=seed, masks_per_image=args.masks_per_image
            )
            for method in result.methods:
                psnr.setdefault(method, []).append(result.mean(method, "psnr_hole"))
        seeds = " | ".join(f"seed {s}" for s in args.seeds)
        print(
            f"\n**{size} px, {'box holes' if masks == 'box' else 'free-form strokes'}** "
            f"(`--size {size} --masks {masks} --masks-per-image {args.masks_per_image}`), hole PSNR (dB):\n"
        )
        print(f"| method | {seeds} | mean | range |")
        print("|---|" + "---|" * (len(args.seeds) + 2))
        for method, values in psnr.items():
            cells = " | ".join(f"{v:.2f}" for v in values)
            print(
                f"| {METHOD_NAMES.get(method, method)} | {cells} | {statistics.fmean(values):.2f} | "
                f"{min(values):.2f}-{max(values):.2f} |"
            )
        for rival in ("telea", "ns"):
            margins = [a - b for a, b in zip(psnr[DEFAULT_ROW], psnr[rival])]
            print(
                f"\n{METHOD_NAMES[DEFAULT_ROW]} minus {METHOD_NAMES[rival]}: mean {statistics.fmean(margins):+.2f} dB "
                f"(per seed {', '.join(f'{m:+.2f}' for m in margins)})",
                end="",
            )
        print()


if __name__ == "__main__":
    main()

"""``gantool eval``: parse options, call :func:`gantool.tools.evaluate.evaluate`, print."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gantool.cli.options import backend_option, provider_option
from gantool.core.constants import BLEND_MODES, DEFAULT_BLEND, DEFAULT_EVAL_GRID, MASK_KINDS

HELP_EPILOG = """\b
Examples:
  gantool eval --data heldout/                      # the shipped model, box holes, 256 px
  gantool eval runs/x/export --data photos/ --masks free --size 128 --seed 1
  gantool eval model.onnx --data photos/ --json > eval.json
"""


@click.command("eval", epilog=HELP_EPILOG)
@click.argument("model", required=False, metavar="[MODEL]")
@click.option(
    "--data",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder of ground-truth images (searched recursively).",
)
@click.option(
    "--masks",
    type=click.Choice(MASK_KINDS),
    default=MASK_KINDS[0],
    show_default=True,
    help="Hole shapes (seeded: the same holes every run).",
)
@click.option(
    "--size",
    type=click.IntRange(min=16),
    default=256,
    show_default=True,
    help="Images are centre-cropped to squares of this size.",
)
@click.option(
    "--local-size",
    type=int,
    default=None,
    help="Window the holes are drawn in (box holes: half of it to all of it).  [default: size/2]",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the holes.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Use only the first N images.")
@click.option(
    "--masks-per-image",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Score each image with this many different holes.",
)
@click.option(
    "--grid",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path(DEFAULT_EVAL_GRID),
    show_default=True,
    help="Comparison grid PNG: masked | Telea | Navier-Stokes | gantool | gantool + blend "
    "| truth (never inside --data; eval's own grids found there are not scored).",
)
@click.option("--no-grid", is_flag=True, help="Do not write the grid.")
@click.option(
    "--blend",
    type=click.Choice(BLEND_MODES),
    default=DEFAULT_BLEND,
    show_default=True,
    help="Also score the model's output after this post-processing, as a row beside the raw output "
    "(none: the raw output only).",
)
@provider_option
@backend_option
@click.option("--overwrite", is_flag=True, help="Replace an existing grid file (never an input image).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (means and per-image values).")
def eval_(model: str | None, data: Path, grid: Path, no_grid: bool, as_json: bool, **options) -> None:
    """Compare MODEL (raw and blended) with mean-pixel fill and OpenCV's Telea and Navier-Stokes
    inpainting: PSNR, SSIM and L1 in the hole and over the whole image.

    MODEL is a .onnx / .pt / .safetensors file or an export folder; without it
    the model shipped with gantool is used. "gantool (raw output)" is the
    network alone; "gantool + Poisson blend" is what `gantool inpaint` writes
    by default (GLCIC's post-processing).
    """
    from gantool.tools.evaluate import evaluate

    result = evaluate(model, data, grid=None if no_grid else grid, **options)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    s = result.settings
    click.echo(
        f"{s['count']} image(s) x {s['masks_per_image']} hole(s) from {s['data']}, {s['masks']} holes in a "
        f"{s['local_size']} px window, {s['size']} px, seed {s['seed']}, blend {s['blend']}; "
        f"gantool = {s['model_file']} ({s['backend']} on {s['provider']})"
    )
    click.echo(result.markdown())
    if result.grid is not None:
        click.echo(f"grid: {result.grid}")

"""``gantool inpaint``: parse options, call gantool.inference, print."""

from __future__ import annotations

import sys

import click

from gantool.constants import BLEND_MODES, DEFAULT_BLEND
from gantool.errors import InputError

STRATEGY_HELP = "auto: crop when max(H, W) > 2 x the model's train size, else full."
BLEND_HELP = ("Post-processing of the model's output: poisson = GLCIC's fast-marching fill of the hole, then "
              "Poisson blending of the output onto it (OpenCV); none = the raw output.")


def _parse_boxes(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[tuple[int, int, int, int]]:
    from gantool.inference import parse_box

    try:
        return [parse_box(v) for v in values]
    except InputError as e:
        raise click.BadParameter(str(e)) from None


@click.command("inpaint")
@click.argument("images", nargs=-1, required=True)
@click.option("-m", "--mask", "mask", metavar="FILE|DIR",
              help="Mask image (> 127 = hole) for all images, or a folder of masks matched by file stem.")
@click.option("--box", "boxes", multiple=True, metavar="X,Y,W,H", callback=_parse_boxes,
              help="A rectangular hole in pixels; repeat for several. Combined with --mask if both are given.")
@click.option("--model", metavar="PATH",
              help="Export folder or model file (.onnx, .torchscript.pt, .pt checkpoint, .safetensors). "
              "Default: the model in models/.")
@click.option("-o", "--output", metavar="FILE|DIR",
              help="Output folder (default: beside each input), or a .png file for a single image.")
@click.option("--provider", type=click.Choice(["auto", "cuda", "tensorrt", "cpu"]), default="auto",
              show_default=True, help="Where to run; cuda/tensorrt fail instead of falling back to the CPU.")
@click.option("--backend", type=click.Choice(["auto", "onnx", "torchscript", "eager"]), default="auto",
              show_default=True, help="auto: from the model file (onnx for an export folder).")
@click.option("--batch-size", type=click.IntRange(min=1), default=4, show_default=True,
              help="Same-size images run together, up to this many.")
@click.option("--strategy", type=click.Choice(["auto", "full", "crop", "resize"]), default="auto",
              show_default=True, help=STRATEGY_HELP)
@click.option("--crop-margin", type=click.IntRange(min=0), default=None,
              help="Context in pixels around each hole for --strategy crop (default: train size / 4).")
@click.option("--blend", type=click.Choice(BLEND_MODES), default=DEFAULT_BLEND, show_default=True, help=BLEND_HELP)
@click.option("--precision", type=click.Choice(["auto", "fp32", "fp16"]), default="auto", show_default=True,
              help="auto: the exported fp16 ONNX model on the GPU when there is one.")
@click.option("--overwrite", is_flag=True, help="Replace existing outputs (inputs are never replaced).")
def inpaint(
    images: tuple[str, ...],
    mask: str | None,
    boxes: list[tuple[int, int, int, int]],
    model: str | None,
    output: str | None,
    provider: str,
    backend: str,
    batch_size: int,
    strategy: str,
    crop_margin: int | None,
    blend: str,
    precision: str,
    overwrite: bool,
) -> None:
    """Fill the holes in IMAGE... (files, folders or globs).

    \b
    Holes come from --mask, --box, or else the image's transparent pixels.
    Masks must have the image's displayed size (after EXIF rotation).
    Only hole pixels change; results are PNG: <stem>.inpainted.png.
    """
    from tqdm import tqdm

    from gantool.inference import FileResult, MaskSource, collect_images, inpaint_files, plan_jobs
    from gantool.runtime import load_backend

    masks = MaskSource(mask, boxes)
    # The mask (file or folder) may sit inside an input folder: it is not an input.
    found = collect_images(images, skip=[masks.path] if masks.path is not None else [])
    jobs = plan_jobs(found, output)
    runner = load_backend(model, provider=provider, backend=backend, precision=precision)
    click.echo(f"provider: {runner.provider} ({runner.provider_note}); backend: {runner.name}; blend: {blend}; "
               f"model: {runner.path}")

    with tqdm(total=len(jobs), unit="img", file=sys.stderr, disable=None, leave=False) as bar:
        def on_result(result: FileResult) -> None:
            if not result.ok:
                bar.write(f"failed: {result.error}", file=sys.stderr)
            bar.update(1)

        summary = inpaint_files(runner, jobs, masks, strategy=strategy, batch_size=batch_size,
                                crop_margin=crop_margin, blend=blend, overwrite=overwrite, on_result=on_result)
    if len(jobs) == 1 and summary.results[0].ok:
        click.echo(f"wrote {summary.results[0].output}")
    click.echo(summary.line())
    if summary.failed:
        click.get_current_context().exit(1)

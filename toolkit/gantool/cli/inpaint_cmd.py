"""``gantool inpaint``: parse options, call :func:`gantool.inference.pipeline.run_inpaint`, print."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from gantool.cli.options import (
    backend_option,
    blend_option,
    precision_option,
    provider_option,
    ray_address_option,
    ray_timeout_option,
    strategy_option,
)
from gantool.core.constants import (
    DEFAULT_INPAINT_BATCH,
    DEFAULT_MAX_BLEND_PIXELS,
    RAY_MANIFEST_NAME,
)
from gantool.core.errors import InputError


def _parse_boxes(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[tuple[int, int, int, int]]:
    from gantool.inference.inpainter import parse_box  # delayed: imports numpy and PIL

    try:
        return [parse_box(v) for v in values]
    except InputError as e:
        raise click.BadParameter(str(e)) from None


@click.command("inpaint")
@click.argument("images", nargs=-1, required=True)
@click.option(
    "-m",
    "--mask",
    "mask",
    metavar="FILE|DIR",
    help="Mask image (> 127 = hole) for all images, or a folder of masks matched by file stem.",
)
@click.option(
    "--box",
    "boxes",
    multiple=True,
    metavar="X,Y,W,H",
    callback=_parse_boxes,
    help="A rectangular hole in pixels; repeat for several. Combined with --mask if both are given.",
)
@click.option(
    "--model",
    metavar="PATH",
    help="Export folder or model file (.onnx, .pt2, .aoti.pt2, .torchscript.pt, .pt checkpoint, "
    ".safetensors), or an MLflow URI: models:/NAME/VERSION, models:/NAME@ALIAS, runs:/RUN_ID/PATH "
    "(downloaded once into the cache). Default: the model in models/.",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE|DIR",
    help="Output folder (default: beside each input), or a .png file for a single image.",
)
@provider_option
@backend_option
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DEFAULT_INPAINT_BATCH,
    show_default=True,
    help="Same-size images run together, up to this many.",
)
@strategy_option
@click.option(
    "--crop-margin",
    type=click.IntRange(min=0),
    default=None,
    help="Context in pixels around each hole for --strategy crop (default: train size / 4).",
)
@blend_option
@precision_option
@click.option("--overwrite", is_flag=True, help="Replace existing outputs (inputs are never replaced).")
@click.option(
    "--skip-existing",
    is_flag=True,
    help="Keep existing outputs and count them as skipped: resumes an interrupted run (with or without --ray).",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(min=1),
    default=None,
    help="Decode images of up to this many pixels. Default: Pillow's decompression-bomb limit (about 179 M, "
    "refused above twice that).",
)
@click.option(
    "--max-blend-pixels",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_BLEND_PIXELS,
    show_default=True,
    help="Warn (with how long it takes) when a file's Poisson blend solves over more pixels; 0 never. "
    "gantool serve refuses such requests; here it runs.",
)
@click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help='Run on a Ray cluster (Ray Data actor pool); needs pip install "gantool[ray]".',
)
@ray_address_option
@ray_timeout_option
@click.option(
    "--actors",
    type=click.IntRange(min=1),
    default=None,
    help="With --ray: model copies (actors). Default: one per GPU, or one per node on CPUs; never more than the batches to run.",
)
@click.option(
    "--gpus-per-actor",
    type=click.FloatRange(min=0),
    default=None,
    help="With --ray: GPUs each actor reserves (0.5 = two per GPU). Default: 1 with cuda/tensorrt "
    "or with auto on a cluster with GPUs, else 0.",
)
@click.option(
    "--manifest",
    metavar="FILE",
    help=f"With --ray: the JSON-lines record of the run. Default: <output folder>/{RAY_MANIFEST_NAME}.",
)
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
    skip_existing: bool,
    max_pixels: int | None,
    max_blend_pixels: int,
    use_ray: bool,
    ray_address: str | None,
    ray_timeout: float | None,
    actors: int | None,
    gpus_per_actor: float | None,
    manifest: str | None,
) -> None:
    """Fill the holes in IMAGE... (files, folders or globs).

    \b
    Holes come from --mask, --box, or else the image's transparent pixels.
    A mask pixel > 127 is a hole; a mask image whose maximum is 1 is a 0/1
    mask (1 = hole). Masks must have the image's displayed size (after EXIF
    rotation). An image whose mask has no hole is skipped (nothing written).
    Only hole pixels change; results are PNG: <stem>.inpainted.png.
    With --ray the same outputs are made by a pool of Ray actors.
    Exit status 1 when a file failed or nothing was inpainted.
    """
    from gantool.runtime.model_uri import local_model

    model = local_model(model)  # type: ignore[assignment]  # an MLflow URI: the cached export folder
    ray_options = {"ray_address": ray_address, "ray_timeout": ray_timeout, "actors": actors,
                   "gpus_per_actor": gpus_per_actor, "manifest": manifest}  # fmt: skip
    if overwrite and skip_existing:
        raise click.UsageError("--overwrite and --skip-existing contradict each other: give one")
    if not use_ray:
        given = [f"--{name.replace('_', '-')}" for name, value in ray_options.items() if value is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} needs --ray")
    else:
        _inpaint_on_ray(images, mask=mask, boxes=boxes, model=model, output=output, provider=provider,
                        backend_name=backend, batch_size=batch_size, strategy=strategy, crop_margin=crop_margin,
                        precision=precision, blend=blend, overwrite=overwrite, skip_existing=skip_existing,
                        max_pixels=max_pixels, address=ray_address, actors=actors, gpus_per_actor=gpus_per_actor,
                        manifest=manifest,
                        **({"timeout": ray_timeout} if ray_timeout is not None else {}))  # fmt: skip
        return
    _inpaint_here(images, model=model, provider=provider, backend_name=backend, precision=precision, mask=mask,
                  boxes=boxes, output=output, strategy=strategy, batch_size=batch_size, crop_margin=crop_margin,
                  blend=blend, overwrite=overwrite, skip_existing=skip_existing, max_pixels=max_pixels,
                  max_blend_pixels=max_blend_pixels)  # fmt: skip


def _inpaint_here(images: tuple[str, ...], blend: str, **options: Any) -> None:
    """The run in this process (``options``: :func:`gantool.inference.pipeline.run_inpaint`'s)."""
    from tqdm import tqdm

    from gantool.inference.pipeline import ImageJob, run_inpaint  # delayed: imports numpy, onnxruntime
    from gantool.inference.ray_connect import sigterm_as_interrupt
    from gantool.runtime.backends import Backend

    with tqdm(total=0, unit="img", file=sys.stderr, disable=None, leave=False) as bar:

        def on_start(runner: Backend, jobs: Sequence[ImageJob]) -> None:
            click.echo(
                f"provider: {runner.provider} ({runner.provider_note}); backend: {runner.name}; "
                f"precision: {runner.precision} ({runner.precision_note}); blend: {blend}; model: {runner.path}"
            )
            bar.reset(total=len(jobs))
            counts["total"] = len(jobs)

        counts = {"done": 0, "total": 0}  # the bar counts nothing where it is off (no terminal)
        reporter = _reporter(bar)

        def on_result(result: Any) -> None:
            reporter(result)
            counts["done"] += 1

        try:
            with sigterm_as_interrupt():  # Ctrl-C and SIGTERM alike: the writes under way end whole, then one line
                summary = run_inpaint(images, blend=blend, on_start=on_start, on_result=on_result, **options)
        except KeyboardInterrupt as e:
            bar.close()
            _stopped(e, f"{counts['done']} of {counts['total']} input(s) done" if counts["total"] else "no input done")
    if len(summary.results) == 1 and summary.results[0].inpainted:
        click.echo(f"wrote {summary.results[0].output}")
    click.echo(summary.line())
    if not summary.succeeded:
        click.get_current_context().exit(1)


def _stopped(interrupt: KeyboardInterrupt, done: str) -> NoReturn:
    """Ctrl-C (KeyboardInterrupt) or SIGTERM (Terminated): one line, exit 130 / 143 as a shell reports it."""
    signum = getattr(interrupt, "signum", signal.SIGINT)
    click.echo(
        f"interrupted ({signal.Signals(signum).name}): {done}; every output written is whole: "
        "run the same command with --skip-existing to finish",
        err=True,
    )
    sys.exit(128 + signum)


def _reporter(bar: Any) -> Callable[[Any], None]:
    """Per-file lines (failed, skipped) above the progress bar, and its count."""

    def on_result(result: Any) -> None:  # a gantool.inference.pipeline.FileResult
        if not result.ok:
            bar.write(f"failed: {result.error}", file=sys.stderr)
        elif result.no_hole:
            bar.write(f"skipped: {result.source}: the mask has no hole", file=sys.stderr)
        bar.update(1)

    return on_result


def _inpaint_on_ray(images: tuple[str, ...], **options: Any) -> None:
    from tqdm import tqdm

    from gantool.inference.ray import RayPlan, ray_inpaint

    with tqdm(total=0, unit="img", file=sys.stderr, disable=None, leave=False) as bar:

        def on_start(plan: RayPlan) -> None:
            gpus = f", {plan.gpus_per_actor:g} GPU each" if plan.gpus_per_actor else ""
            click.echo(f"ray: {plan.where}; {plan.actors} actor(s){gpus}, batch size {plan.batch_size}")
            if plan.skipped:
                click.echo(f"skipping {len(plan.skipped)} input(s) whose output exists (--skip-existing)")
            bar.reset(total=len(plan.jobs))

        on_result = _reporter(bar)

        try:
            summary = ray_inpaint(images, on_start=on_start, on_result=on_result, **options)
        except KeyboardInterrupt as e:  # the manifest is complete: say where, and exit as the signal asks
            _stopped(e, "every input is in the manifest with its state")
    click.echo(summary.line())
    if not summary.succeeded:
        click.get_current_context().exit(1)

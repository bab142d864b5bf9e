"""``gantool bench data``: the training data loader's throughput and start-up, per source."""

from __future__ import annotations

import click

from gantool.cli.options import echo_table


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not values or min(values) < 0:
        raise click.BadParameter(f"expected integers >= 0, got {value!r}")
    return values


def _image_size(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, int]:
    width, _, height = value.lower().partition("x")
    if not (width.isdigit() and height.isdigit() and int(width) >= 8 and int(height) >= 8):
        raise click.BadParameter(f"expected WIDTHxHEIGHT (at least 8x8), got {value!r}")
    return int(width), int(height)


@click.command("data")
@click.option("--images", default=600, show_default=True, help="Generated photo-like JPEGs for the throughput rows.")
@click.option("--image-size", default="512x384", show_default=True, callback=_image_size, help="Their WIDTHxHEIGHT.")
@click.option(
    "--data",
    "data",
    type=click.Path(exists=True, file_okay=False),
    help="Time this image folder instead of generated images (a list and shards of it are made in a temp folder).",
)
@click.option("--crop", default=160, show_default=True, help="Training size the samples are cropped to.")
@click.option("--batch-size", default=16, show_default=True)
@click.option("--batches", default=8, show_default=True, help="Timed batches per row and round (after the first).")
@click.option("--workers", default="0,1,2", show_default=True, callback=_int_list, help="DataLoader worker counts.")
@click.option("--rounds", default=3, show_default=True, help="Interleaved rounds per row.")
@click.option(
    "--startup-counts",
    default="1000,100000",
    show_default=True,
    callback=_int_list,
    help="Image counts for the start-up rows (tiny files; 0 rows: empty).",
)
@click.option("--train/--no-train", default=True, show_default=True, help="Also time what a training step consumes.")
@click.option(
    "--work-dir", type=click.Path(file_okay=False), help="Where the temp folder goes.  [default: the system's]"
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_data(as_json: bool, startup_counts: list[int], **options) -> None:
    """Images/s the loader delivers from a folder, a list and shards of the same images (per worker
    count), against what training consumes, and start-up time against the image count."""
    from gantool.tools.bench_data import bench_data as run
    from gantool.tools.bench_data import to_json

    result = run(startup_counts=[c for c in startup_counts if c > 0], **options)
    if as_json:
        click.echo(to_json(result))
        return
    m = result["machine_start"]
    click.echo(f"data benchmark: {m['cpu']} ({m['cores']} cores), load average {m['load_average']} at the start, "
               f"{result['machine_end']['load_average']} at the end")  # fmt: skip
    setup = result["throughput_setup"]
    click.echo(f"throughput: {setup['images']} images, crop {setup['crop']}, batch {setup['batch_size']}, "
               f"median of {setup['rounds']} interleaved rounds (decode cache off)")  # fmt: skip
    training = result.get("training")
    header = ["source", "workers", "images/s (min-max)"] + (["x training"] if training else [])
    echo_table(header, [
        [r["source"], str(r["workers"]), f"{r['images_per_s']:.0f} ({r['min_images_per_s']:.0f}-{r['max_images_per_s']:.0f})",
         *([f"{r['x_training']:.1f}x"] if training else [])]
        for r in result["throughput"]
    ])  # fmt: skip
    if training:
        click.echo(f"training consumes {training['images_per_s']:.1f} images/s at {training['size']} px "
                   f"(joint step, batch {training['batch_size']}, {training['device']}, bf16 {training['amp_bf16']})")  # fmt: skip
    if result["startup"]:
        click.echo(
            "start-up: launch to the first step (tiny images and model, --workers 0); first start builds the index"
        )
        echo_table(["source", "images", "first start s", "median s (later starts)"], [
            [r["source"], str(r["images"]), f"{r['first_start_s']:.2f}", f"{r['median_s']:.2f}"] for r in result["startup"]
        ])  # fmt: skip
    for kind, ratio in (result.get("startup_ratio") or {}).items():
        click.echo(f"start-up {kind}: {max(startup_counts)} vs {min(c for c in startup_counts if c)} images: {ratio:.2f}x "
                   f"(goal <= 2x: {'met' if ratio <= 2 else 'NOT met'})")  # fmt: skip

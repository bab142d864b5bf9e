"""``gantool bench``: benchmark commands that report medians and ratios."""

from __future__ import annotations

import json

import click

from gantool.config import BENCH_TRAIN_BATCH, TrainConfig
from gantool.constants import BACKENDS, DEFAULT_STRATEGY, STRATEGIES


def echo_table(header: list[str], rows: list[list[str]]) -> None:
    """Print a markdown table."""
    for cells in [header, ["---"] * len(header), *rows]:
        click.echo("| " + " | ".join(cells) + " |")


@click.group()
def bench() -> None:
    """Benchmark training or inference (medians, side by side)."""


@bench.command("train")
@click.option("--size", type=int, default=TrainConfig.size, show_default=True)
@click.option("--local-size", type=int, default=TrainConfig.local_size, show_default=True)
@click.option("--batch-size", type=int, default=BENCH_TRAIN_BATCH, show_default=True)
@click.option("--width", type=int, default=TrainConfig.width, show_default=True)
@click.option("--steps", type=int, default=5, show_default=True, help="Timed iterations (after 2 warm-up ones).")
@click.option("--device", default="auto", show_default=True)
@click.option("--amp/--no-amp", default=None, help="bf16 autocast.  [default: as gantool train: on for CUDA]")
@click.option("--channels-last/--no-channels-last", default=None,
              help="channels_last memory format.  [default: as gantool train: on for CUDA]")
@click.option("--reference/--no-reference", default=True, show_default=True,
              help="Also time the GLCIC-PyTorch phase-3 iteration for comparison.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_train(as_json: bool, **options) -> None:
    """Median seconds per joint training iteration and images/s."""
    from gantool.benchmarks import bench_train as run

    result = run(**options)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"train benchmark on {result['device']} ({result['threads']} threads, torch {result['torch']}): "
               f"batch {result['batch_size']}, {result['size']}px, local {result['local_size']}, width {result['width']}")
    echo_table(["loop", "bf16", "channels_last", "median s/iter", "images/s"],
               [[row["name"], str(row["amp_bf16"]), str(row["channels_last"]), f"{row['median_s_per_iter']:.3f}",
                 f"{row['images_per_s']:.2f}"] for row in result["rows"]])
    if "speedup_vs_reference" in result:
        click.echo(f"speed-up vs reference: {result['speedup_vs_reference']:.2f}x")


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return values


def _name_list(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@bench.command("inpaint")
@click.argument("model", required=False, metavar="[MODEL]")
@click.option("--sizes", default="256,512", show_default=True, callback=_int_list, help="Square image sizes.")
@click.option("--batch", "batches", default="1,8", show_default=True, callback=_int_list, help="Batch sizes.")
@click.option("--backends", default=",".join(BACKENDS[::-1]), show_default=True, callback=_name_list,
              help="Backends to time (torchscript is traced in memory when the model folder has none).")
@click.option("--providers", default="auto", show_default=True, callback=_name_list,
              help="cpu, cuda, tensorrt; auto = cpu, plus cuda when a GPU is visible.")
@click.option("--repeats", default=5, show_default=True, help="Timed runs per row (after --warmup).")
@click.option("--warmup", default=1, show_default=True)
@click.option("--e2e-images", default=32, show_default=True,
              help="Images for the end-to-end file-loop measurement (0 skips it).")
@click.option("--e2e-size", default=512, show_default=True)
@click.option("--e2e-strategy", type=click.Choice(STRATEGIES), default=DEFAULT_STRATEGY,
              show_default=True, help="--strategy of the end-to-end measurement.")
@click.option("--crop-check/--no-crop-check", default=True, show_default=True,
              help="Time --strategy crop on 2048 px with one 128 px hole against a 256 px image.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_inpaint(model: str | None, as_json: bool, **options) -> None:
    """Median ms per image, images/s, achieved GFLOP/s and peak memory of
    MODEL (default: the shipped model) per backend, provider, size and batch,
    and the inference goals, measured side by side."""
    from gantool.benchmarks import bench_inpaint as run

    result = run(model, **options)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"inpaint benchmark: {result['model']}; torch {result['torch']}, {result['threads']} threads, "
               f"{result['cpu_count']} CPUs")
    lines = []
    for row in result["rows"]:
        head = [row["backend"], row["provider"], str(row.get("size", "")), str(row.get("batch", ""))]
        if "error" in row:
            lines.append([*head, f"error: {row['error']}", "", "", "", ""])
            continue
        peak = "" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']:.0f}"
        if row.get("peak_cuda_mb") is not None:
            peak += f" (CUDA {row['peak_cuda_mb']:.0f})"
        lines.append([*head, f"{row['median_ms_per_image']:.1f}", f"{row['images_per_s']:.2f}",
                      f"{row['gflop_per_image']:.2f}", f"{row['achieved_gflop_per_s']:.1f}", peak])
    echo_table(["backend", "provider", "size", "batch", "median ms/image", "images/s", "GFLOP/image", "GFLOP/s",
                "peak MB"], lines)
    notes = sorted({row["note"] for row in result["rows"] if row.get("note")})
    for note in notes:
        click.echo(f"note: {note}")
    click.echo(f"peak MB: {result['peak_memory']}")
    goals = result["goals"]
    if "ort_cpu_vs_eager_512_b1" in goals:
        g = goals["ort_cpu_vs_eager_512_b1"]
        click.echo(f"goal ORT CPU >= 1.2x eager at 512 px, batch 1: {g['speedup']:.2f}x -> "
                   f"{'met' if g['met'] else 'NOT met'}")
    if "end_to_end_outside_model" in goals:
        g = goals["end_to_end_outside_model"]
        click.echo(f"goal <= 15% of the file loop outside the model ({g['images']} images of {g['size']} px, "
                   f"strategy {g['strategy']}): {g['outside_model_fraction']:.1%} "
                   f"(wall {g['wall_s']:.2f} s, model {g['model_run_s']:.2f} s) -> {'met' if g['met'] else 'NOT met'}")
    if "crop_2048_vs_256" in goals:
        g = goals["crop_2048_vs_256"]
        click.echo(f"goal crop on {g['large']} px with one {g['hole']} px hole <= 2x a {g['small']} px image: "
                   f"{g['ratio']:.2f}x ({g['large_crop_s'] * 1e3:.0f} ms vs {g['small_full_s'] * 1e3:.0f} ms) -> "
                   f"{'met' if g['met'] else 'NOT met'}")

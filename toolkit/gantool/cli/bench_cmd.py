"""``gantool bench``: benchmark commands that report medians and ratios."""

from __future__ import annotations

import json

import click


@click.group()
def bench() -> None:
    """Benchmark training or inference (medians, side by side)."""


@bench.command("train")
@click.option("--size", default=160, show_default=True)
@click.option("--local-size", default=96, show_default=True)
@click.option("--batch-size", default=8, show_default=True)
@click.option("--width", default=64, show_default=True)
@click.option("--steps", default=5, show_default=True, help="Timed iterations (after 2 warm-up ones).")
@click.option("--device", default="auto", show_default=True)
@click.option("--amp/--no-amp", default=None, help="bf16 autocast.  [default: when the device supports it]")
@click.option("--channels-last/--no-channels-last", default=True, show_default=True)
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
    click.echo("| loop | bf16 | channels_last | median s/iter | images/s |")
    click.echo("|---|---|---|---|---|")
    for row in result["rows"]:
        click.echo(f"| {row['name']} | {row['amp_bf16']} | {row['channels_last']} | "
                   f"{row['median_s_per_iter']:.3f} | {row['images_per_s']:.2f} |")
    if "speedup_vs_reference" in result:
        click.echo(f"speed-up vs reference: {result['speedup_vs_reference']:.2f}x")

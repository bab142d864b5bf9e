"""``gantool bench``: benchmark commands that report medians and ratios."""

from __future__ import annotations

import json

import click

from gantool.cli.options import echo_table
from gantool.core.config import BENCH_TRAIN_BATCH, TrainConfig
from gantool.core.constants import (
    BENCH_INPAINT_PATHS,
    BLEND_MODES,
    DEFAULT_BLEND,
    DEFAULT_STRATEGY,
    STRATEGIES,
)


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
@click.option(
    "--channels-last/--no-channels-last",
    default=None,
    help="channels_last memory format.  [default: as gantool train: on for CUDA]",
)
@click.option(
    "--reference/--no-reference",
    default=True,
    show_default=True,
    help="Also time the GLCIC-PyTorch phase-3 iteration for comparison.",
)
@click.option(
    "--mlflow",
    metavar="URI",
    default=None,
    help="Instead of the reference: time --log-every steps with and without sending their record to an MLflow "
    "run in this store (interleaved; the run is deleted after).",
)
@click.option(
    "--log-every", type=int, default=TrainConfig.log_every, show_default=True, help="With --mlflow: steps per record."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_train(as_json: bool, **options) -> None:
    """Median seconds per joint training iteration and images/s."""
    from gantool.tools.bench_train import bench_train as run

    result = run(**options)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"train benchmark on {result['device']} ({result['threads']} threads, torch {result['torch']}): "
        f"batch {result['batch_size']}, {result['size']}px, local {result['local_size']}, width {result['width']}"
    )
    echo_table(
        ["loop", "bf16", "channels_last", "median s/iter", "images/s"],
        [
            [
                row["name"],
                str(row["amp_bf16"]),
                str(row["channels_last"]),
                f"{row['median_s_per_iter']:.3f}",
                f"{row['images_per_s']:.2f}",
            ]
            for row in result["rows"]
        ],
    )
    if "speedup_vs_reference" in result:
        from gantool.tools.interleave import spread_text  # delayed: imports torch

        click.echo(f"speed-up vs reference: {spread_text(result['speedup_paired'])}")
    if "mlflow_overhead" in result:
        ratio = result["mlflow_overhead"]
        click.echo(
            f"MLflow tracking at --log-every {result['log_every']}: {(ratio['median'] - 1) * 100:+.2f} % time "
            f"(tracked / plain, median of {ratio['rounds']} paired blocks: {ratio['median']:.4f}x, "
            f"{ratio['min']:.4f}-{ratio['max']:.4f})"
        )


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
@click.option(
    "--backends",
    default=",".join(BENCH_INPAINT_PATHS),
    show_default=True,
    callback=_name_list,
    help="Paths to time: a backend, or backend:precision (eager:bf16, pt2:bf16, onnx:int8, onnx:fp16). "
    "torchscript is traced in memory when the model folder has none.",
)
@click.option(
    "--providers",
    default="auto",
    show_default=True,
    callback=_name_list,
    help="cpu, cuda, tensorrt; auto = cpu, plus cuda when a GPU is visible.",
)
@click.option("--repeats", default=5, show_default=True, help="Timed runs per row (after --warmup).")
@click.option("--warmup", default=1, show_default=True)
@click.option(
    "--e2e-images", default=32, show_default=True, help="Images for the end-to-end file-loop measurement (0 skips it)."
)
@click.option("--e2e-size", default=512, show_default=True)
@click.option(
    "--e2e-strategy",
    type=click.Choice(STRATEGIES),
    default=DEFAULT_STRATEGY,
    show_default=True,
    help="--strategy of the end-to-end measurement.",
)
@click.option(
    "--crop-check/--no-crop-check",
    default=True,
    show_default=True,
    help="Time --strategy crop on 2048 px with one 128 px hole against a 256 px image.",
)
@click.option(
    "--blend",
    type=click.Choice(BLEND_MODES),
    default=DEFAULT_BLEND,
    show_default=True,
    help="Post-processing in the end-to-end measurement, and whose cost is timed beside the model's.",
)
@click.option(
    "--blend-check/--no-blend-check",
    default=True,
    show_default=True,
    help="Time --blend against the model on 512 px with one 128 px hole (strategies full and auto).",
)
@click.option(
    "--ray",
    "use_ray",
    is_flag=True,
    help="Instead: images/s of `gantool inpaint --ray` vs the local pipeline on the same folder of "
    "--e2e-images images of --e2e-size px (first of --providers; Ray's start-up reported apart).",
)
@click.option("--actors", type=click.IntRange(min=1), default=None, help="With --ray: actors (default as inpaint).")
@click.option("--ray-address", metavar="ADDR", help="With --ray: connect to this cluster instead of a local one.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_inpaint(
    model: str | None, as_json: bool, use_ray: bool, actors: int | None, ray_address: str | None, **options
) -> None:
    """Median ms per image, images/s, achieved GFLOP/s and peak memory of
    MODEL (default: the shipped model) per backend, provider, size and batch,
    and the inference goals, measured side by side."""
    from gantool.runtime.model_uri import local_model

    model = local_model(model)  # type: ignore[assignment]  # an MLflow URI: the cached export folder
    if use_ray:
        _bench_ray(model, as_json, actors, ray_address, options)
        return
    from gantool.tools.bench_inpaint import bench_inpaint as run
    from gantool.tools.timing import strict_json

    result = run(model, **options)
    nothing = "no row could be measured: every one failed (see its error)"
    if as_json:
        click.echo(json.dumps(strict_json(result), indent=2, allow_nan=False))
        if not result["measured_rows"]:
            raise click.ClickException(nothing)
        return
    click.echo(
        f"inpaint benchmark: {result['model']}; torch {result['torch']}, {result['threads']} threads, "
        f"{result['cpu_count']} CPUs"
    )
    _echo_inpaint_rows(result["rows"])
    notes = sorted({row["note"] for row in result["rows"] if row.get("note")})
    for note in notes:
        click.echo(f"note: {note}")
    if not result["measured_rows"]:
        raise click.ClickException(nothing)
    click.echo(f"peak MB: {result['peak_memory']}")
    cpu = result.get("cpu_peak") or {}
    known = {k: v for k, v in (cpu.get("gops") or {}).items() if v}
    if known:
        figures = ", ".join(f"{k} {v:.0f} G op/s" for k, v in known.items())
        click.echo(f"CPU peak ({cpu['cores']} cores at {cpu['ghz']:.2f} GHz): {figures}; {cpu['how']}")
    click.echo(
        "rows at each size and batch are timed round by round (A, B, ..., B, A); speed-ups are medians of paired rounds"
    )
    click.echo("gates: fp32 max abs <= 1e-3 against eager fp32; fp16 >= 40 dB, bf16 and int8 >= 35 dB hole PSNR")
    for key, best in result.get("fastest_passing", {}).items():
        click.echo(
            f"fastest path passing its gate ({key}): {best['path']} on {best['provider']}, "
            f"{best['median_ms_per_image']:.1f} ms/image"
        )
    _echo_inpaint_goals(result)


def _echo_inpaint_rows(rows: list[dict]) -> None:
    lines = []
    for row in rows:
        head = [
            row["backend"],
            row.get("precision", "fp32"),
            row["provider"],
            str(row.get("size", "")),
            str(row.get("batch", "")),
        ]
        if "error" in row:
            lines.append([*head, f"error: {row['error']}", "", "", "", "", "", "", ""])
            continue
        peak = "" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']:.0f}"
        if row.get("peak_cuda_mb") is not None:
            peak += f" (CUDA {row['peak_cuda_mb']:.0f})"
        psnr = "inf" if row["psnr_hole_vs_fp32"] == float("inf") else f"{row['psnr_hole_vs_fp32']:.1f}"
        spread = f"{row['min_ms_per_batch'] / row['batch']:.1f}-{row['max_ms_per_batch'] / row['batch']:.1f}"
        lines.append(
            [
                *head,
                f"{row['median_ms_per_image']:.1f}",
                spread,
                f"{row['images_per_s']:.2f}",
                f"{row['gflop_per_image']:.2f}",
                f"{row['achieved_gflop_per_s']:.1f}",
                "" if row.get("fraction_of_peak") is None else f"{row['fraction_of_peak']:.0%}",
                peak,
                f"{psnr} ({'ok' if row['passes_gate'] else 'FAILS gate'})",
            ]
        )
    echo_table(
        [
            "backend",
            "precision",
            "provider",
            "size",
            "batch",
            "median ms/image",
            "min-max ms/image",
            "images/s",
            "GFLOP/image",
            "GFLOP/s",
            "of CPU peak",
            "peak MB",
            "hole PSNR vs fp32 (dB)",
        ],
        lines,
    )


def _echo_inpaint_goals(result: dict) -> None:
    """The post-processing table and the goals, met or not."""
    from gantool.tools.interleave import spread_text  # delayed: imports torch

    if result.get("blend_rows"):
        echo_table(
            ["post-processing", "strategy", "size", "hole", "model windows", "model ms", "blend ms", "blend / model"],
            [
                [
                    row["blend"],
                    row["strategy"],
                    str(row["size"]),
                    str(row["hole"]),
                    ", ".join(f"{h}x{w}" for h, w in row["windows"]),
                    f"{row['model_ms']:.1f}",
                    f"{row['blend_ms']:.1f}",
                    f"{row['blend_vs_model']:.1%}",
                ]
                for row in result["blend_rows"]
            ],
        )
    goals = result["goals"]
    if "fastest_vs_torch_bf16_512_b1" in goals:
        g = goals["fastest_vs_torch_bf16_512_b1"]
        click.echo(
            f"goal fastest passing path >= {g['goal']}x {g['baseline']} at 512 px, batch 1, CPU: "
            f"{g['fastest']} {g['fastest_ms']:.0f} ms vs {g['baseline_ms']:.0f} ms = {spread_text(g['spread'])} -> "
            f"{'met' if g['met'] else 'NOT met'}"
        )
    if "default_vs_ort_fp32_512_b1" in goals:
        g = goals["default_vs_ort_fp32_512_b1"]
        click.echo(
            f"goal default path >= {g['goal']}x ONNX Runtime fp32 at 512 px, batch 1, CPU: {g['default']} "
            f"{g['default_ms']:.0f} ms vs {g['ort_fp32_ms']:.0f} ms = {spread_text(g['spread'])} -> "
            f"{'met' if g['met'] else 'NOT met'}"
        )
    if "ort_cpu_vs_eager_512_b1" in goals:
        g = goals["ort_cpu_vs_eager_512_b1"]
        click.echo(
            f"goal ORT CPU >= 1.2x eager at 512 px, batch 1: {spread_text(g['spread'])} -> "
            f"{'met' if g['met'] else 'NOT met'}"
        )
    if "end_to_end_outside_model" in goals:
        g = goals["end_to_end_outside_model"]
        click.echo(
            f"goal <= 15% of the file loop outside the model ({g['images']} images of {g['size']} px, "
            f"strategy {g['strategy']}, blend {g['blend']}): {g['outside_model_fraction']:.1%} "
            f"(wall {g['wall_s']:.2f} s, model {g['model_run_s']:.2f} s) -> {'met' if g['met'] else 'NOT met'}"
        )
    if "blend_vs_model_512" in goals:
        g = goals["blend_vs_model_512"]
        click.echo(
            f"goal {g['blend']} blending <= 15% on top of the model at {g['size']} px "
            f"with a {g['hole']} px hole "
            f"(strategy full): {g['blend_vs_model']:.1%} ({g['blend_ms']:.1f} ms vs {g['model_ms']:.0f} ms) -> "
            f"{'met' if g['met'] else 'NOT met'}"
        )
    if "crop_2048_vs_256" in goals:
        g = goals["crop_2048_vs_256"]
        click.echo(
            f"goal crop on {g['large']} px with one {g['hole']} px hole <= 2x a {g['small']} px image: "
            f"{g['ratio']:.2f}x ({g['large_crop_s'] * 1e3:.0f} ms vs {g['small_full_s'] * 1e3:.0f} ms) -> "
            f"{'met' if g['met'] else 'NOT met'}"
        )


def _bench_ray(model: str | None, as_json: bool, actors: int | None, address: str | None, options: dict) -> None:
    from gantool.tools.bench_ray import bench_ray_inpaint

    provider = options["providers"][0] if options["providers"] else "auto"
    result = bench_ray_inpaint(model, images=options["e2e_images"], size=options["e2e_size"], provider=provider,
                               strategy=options["e2e_strategy"], actors=actors, address=address)  # fmt: skip
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    local, ray = result["local"], result["ray"]
    click.echo(f"inpaint --ray benchmark: {result['images']} images of {result['size']} px, batch "
               f"{result['batch_size']}, provider {result['provider']}; {result['where']}")  # fmt: skip
    echo_table(["path", "images/s", "wall s", "fixed start-up s", "failed"], [
        ["local pipeline", f"{local['images_per_s']:.2f}", f"{local['wall_s']:.1f}",
         f"{local['model_load_s']:.1f} (model load)", str(local["failed"])],
        ["ray (per image, start-up excluded)", f"{ray['images_per_s']:.2f}", f"{ray['wall_s']:.1f}",
         f"{ray['startup_s']:.1f} (ray.init {ray['ray_init_s']:.1f} of it)", str(ray["failed"])],
    ])  # fmt: skip
    click.echo(f"goal Ray per-image throughput >= {result['goal']}x the local pipeline: {result['ratio']:.2f}x -> "
               f"{'met' if result['met'] else 'NOT met'}")  # fmt: skip


def _add_serve() -> None:
    # The serve benchmarks live in their own module (a seam: a server process, its clients, its memory).
    from gantool.cli.bench_serve_cmd import bench_serve

    bench.add_command(bench_serve)


def _add_data() -> None:
    # `bench data` (the training data loader) lives in its own module too.
    from gantool.cli.bench_data_cmd import bench_data

    bench.add_command(bench_data)


_add_serve()
_add_data()

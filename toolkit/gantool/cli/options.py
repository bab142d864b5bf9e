"""Helpers shared by CLI commands."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from gantool.core.constants import (
    AUTO_CROP_FACTOR,
    BACKEND_CHOICES,
    BLEND_MODES,
    DEFAULT_BACKEND,
    DEFAULT_BLEND,
    DEFAULT_PRECISION,
    DEFAULT_PROVIDER,
    DEFAULT_RAY_TIMEOUT_S,
    DEFAULT_SERVE_BATCH_WAIT_MS,
    DEFAULT_SERVE_MAX_BATCH,
    DEFAULT_STRATEGY,
    PRECISIONS,
    PROVIDERS,
    STRATEGIES,
)


def explicit_options(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """Only the options the user gave (so a config file or checkpoint fills the rest)."""
    chosen = {}
    for name, value in values.items():
        source = ctx.get_parameter_source(name)
        if source not in (None, ParameterSource.DEFAULT) and value is not None:
            chosen[name] = value
    return chosen


# ----------------------------------------------------------------------------- the shared option schema
# One definition per inference option, used by `inpaint`, `serve`, `eval` and `bench`: the choices and
# defaults come from gantool.core.constants, so the CLI, the Python API and the service agree.

STRATEGY_HELP = f"auto: crop when max(H, W) > {AUTO_CROP_FACTOR} x the model's train size, else full."
BLEND_HELP = (
    "Post-processing of the model's output: poisson = GLCIC's fast-marching fill of the hole, then "
    "Poisson blending of the output onto it (OpenCV); none = the raw output."
)

provider_option = click.option(
    "--provider",
    type=click.Choice(PROVIDERS),
    default=DEFAULT_PROVIDER,
    show_default=True,
    help="Where to run; cuda/tensorrt fail instead of falling back to the CPU.",
)
backend_option = click.option(
    "--backend",
    type=click.Choice(BACKEND_CHOICES),
    default=DEFAULT_BACKEND,
    show_default=True,
    help="auto: from the model file (onnx for an export folder). pt2: generator.pt2 (torch.export); "
    "aoti: generator.aoti.pt2 (AOTInductor, this device only); torchscript: legacy.",
)
precision_option = click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default=DEFAULT_PRECISION,
    show_default=True,
    help="auto: fp32, or the exported fp16 ONNX model on a GPU. bf16: eager/pt2 under bf16 autocast "
    "(CUDA, or a CPU with native bf16). int8: the exported int8 ONNX model (export --int8).",
)
strategy_option = click.option(
    "--strategy", type=click.Choice(STRATEGIES), default=DEFAULT_STRATEGY, show_default=True, help=STRATEGY_HELP
)
blend_option = click.option(
    "--blend", type=click.Choice(BLEND_MODES), default=DEFAULT_BLEND, show_default=True, help=BLEND_HELP
)
max_batch_option = click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=DEFAULT_SERVE_MAX_BATCH,
    show_default=True,
    help="Requests run together, at most this many.",
)
batch_wait_option = click.option(
    "--batch-wait-ms",
    type=click.FloatRange(min=0),
    default=DEFAULT_SERVE_BATCH_WAIT_MS,
    show_default=True,
    help="How long the first request waits for others to batch with.",
)

# Joining a Ray cluster: `inpaint --ray` and `serve --ray` (the same probe, the same one-line errors).
ray_address_option = click.option(
    "--ray-address",
    metavar="ADDR",
    help="With --ray: connect to this cluster (e.g. HEAD_IP:6379 or auto). Default: start a local one.",
)
ray_timeout_option = click.option(
    "--ray-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help=f"With --ray-address: seconds to reach and join the cluster before failing [default: {DEFAULT_RAY_TIMEOUT_S:g}].",
)


def echo_table(header: list[str], rows: list[list[str]]) -> None:
    """Print a markdown table (the benchmarks' output)."""
    for cells in [header, ["---"] * len(header), *rows]:
        click.echo("| " + " | ".join(cells) + " |")

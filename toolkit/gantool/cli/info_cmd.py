"""``gantool info``: the metadata of an exported model or a checkpoint's summary."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import click

from gantool.core.constants import BLOCK_ORDERS, HOLE_FILLS
from gantool.core.errors import GantoolError, ModelError
from gantool.export.provenance import find_machine_traces


def _value(value: Any) -> str:
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


def architecture_line(arch: dict[str, Any]) -> str:
    """One line of the architecture variant: what a user checks before trusting an imported model."""
    glcic = arch["block_order"] == BLOCK_ORDERS[1]
    order = "conv -> ReLU -> BN" if glcic else "conv -> BN -> ReLU"
    bias = "with" if arch["conv_bias"] else "without"
    fill = "fill " + ", ".join(f"{v:.4f}" for v in arch["fill"])
    if arch.get("hole_fill", HOLE_FILLS[0]) != HOLE_FILLS[0]:  # older files carry no hole_fill: the mean pixel
        fill = f"{arch['hole_fill']} hole fill ({fill} where no pixel is known)"
    return (
        f"architecture: width {arch['width']}, {order} blocks {bias} conv biases "
        f"({'GLCIC-PyTorch' if glcic else 'gantool'}'s), {fill}, "
        f"training size {arch['train_size']} px (local {arch['local_size']} px)"
        + ("; imported" if arch["imported"] else "")
    )


def _imported_line(source: dict[str, Any]) -> str:
    files = ", ".join(f"{f['file']} (sha256 {f['sha256'][:12]})" for f in source.get("files", {}).values())
    return f"imported from: {source.get('format')}: {files}"


def _warn_traces(file: Path, traces: list[str]) -> None:
    if not traces:
        return
    click.echo(f"Warning: {file} carries traces of the machine that built it (absolute paths, stack traces):", err=True)
    for trace in traces:
        click.echo(f"  {trace}", err=True)


@click.command("info")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(file: Path, as_json: bool) -> None:
    """Show FILE's metadata (.onnx, .pt2, .aoti.pt2, .torchscript.pt, .safetensors) or a checkpoint's summary.

    FILE may also be an MLflow URI (models:/NAME/VERSION, models:/NAME@ALIAS, runs:/RUN_ID/PATH).

    A folder (an export, a run, models/) shows the file that `gantool inpaint
    --model FOLDER` runs. Warns when a model carries absolute paths or stack traces
    of the machine that exported it (from any exporter; the JSON lists them under
    "warnings").
    """
    from gantool.core.artifacts import resolve_model
    from gantool.export.exporter import describe_file  # delayed: imports torch
    from gantool.runtime.model_uri import is_mlflow_uri, local_model

    if is_mlflow_uri(str(file)):  # models:/NAME/VERSION, runs:/...: the cached export folder
        file = Path(str(local_model(str(file))))
    folder = None
    if file.is_dir():
        folder, (file, _) = file, resolve_model(file)
    try:
        description = describe_file(file)
    except ModelError:
        # A model without gantool metadata is refused, but its traces are still worth a warning.
        with contextlib.suppress(GantoolError):  # unreadable: the error below says why
            _warn_traces(file, find_machine_traces(file))
        raise
    if description["kind"] in ("onnx", "pt2", "safetensors", "aoti", "torchscript"):
        from gantool.runtime.choice import auto_choice  # delayed: imports the runtimes' probes

        with contextlib.suppress(GantoolError):  # a file no backend opens here: nothing to say
            description["auto"] = auto_choice(file)
    if folder is not None:
        description["folder"] = str(folder)
    if as_json:
        click.echo(json.dumps(description, indent=2, default=str))
        return
    if folder is not None:
        click.echo(f"{folder}: --model {folder} opens {file}")
    is_model = description["kind"] != "checkpoint"
    header = f"{description['file']}: {description['kind']}, {description['bytes']} bytes"
    click.echo(f"{header}, runs in {description['precision']}" if is_model else header)
    traces = description.get("machine_traces", [])
    for warning in description["warnings"]:
        if warning not in traces:
            click.echo(f"warning: {warning}", err=True)
    if description.get("architecture"):
        click.echo(architecture_line(description["architecture"]))
    if description.get("imported_from"):
        click.echo(_imported_line(description["imported_from"]))
    if is_model:
        if "auto" in description:
            auto = description["auto"]
            click.echo(f"default options run it here: {auto['backend']}, {auto['precision']} ({auto['why']})")
        for key, value in description["metadata"].items():
            click.echo(f"  {key}: {_value(value)}")
        _warn_traces(file, traces)
        return
    for key in ("gantool_version", "step", "phase", "weights_sha256", "model_config", "train_config"):
        click.echo(f"  {key}: {_value(description[key])}")
    metrics = description["metrics"]
    click.echo(f"  metrics: {_value(metrics) if metrics else '(none recorded)'}")

"""``gantool info``: the metadata of an exported model or a checkpoint's summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click



def _value(value: Any) -> str:
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


@click.command("info")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(file: Path, as_json: bool) -> None:
    """Show FILE's metadata (.onnx, .torchscript.pt, .safetensors) or a checkpoint's summary."""
    from gantool.export import describe_file  # delayed: imports torch

    description = describe_file(file)
    if as_json:
        click.echo(json.dumps(description, indent=2, default=str))
        return
    click.echo(f"{description['file']}: {description['kind']}, {description['bytes']} bytes")
    for warning in description.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)
    if description["kind"] != "checkpoint":
        for key, value in description["metadata"].items():
            click.echo(f"  {key}: {_value(value)}")
        return
    for key in ("gantool_version", "step", "phase", "weights_sha256", "model_config", "train_config"):
        click.echo(f"  {key}: {_value(description[key])}")
    metrics = description["metrics"]
    click.echo(f"  metrics: {_value(metrics) if metrics else '(none recorded)'}")

"""Helpers shared by CLI commands."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource


def explicit_options(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """Only the options the user gave (so a config file or checkpoint fills the rest)."""
    chosen = {}
    for name, value in values.items():
        source = ctx.get_parameter_source(name)
        if source not in (None, ParameterSource.DEFAULT) and value is not None:
            chosen[name] = value
    return chosen

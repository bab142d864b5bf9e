"""``gantool doctor``: print :func:`gantool.tools.doctor.diagnose`'s report."""

from __future__ import annotations

import json
import sys

import click


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(as_json: bool) -> None:
    """Check torch (CUDA, cuDNN), the installed onnxruntime packages, and which
    execution providers really load (a tiny session per provider).

    Exit code 0 when gantool is usable on the CPU (a missing GPU is not an
    error), 1 otherwise. Each problem found comes with what to install.
    """
    from gantool.tools.doctor import diagnose, report_lines

    report = diagnose()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in report_lines(report):
            click.echo(line)
    if not report.cpu_usable:
        sys.exit(1)

"""``gantool runs``: list run folders, summarise or plot one."""

from __future__ import annotations

from pathlib import Path

import click

HELP_EPILOG = """\b
Examples:
  gantool runs                                  list the runs under runs/
  gantool runs /data/experiments                list the runs under another folder
  gantool runs runs/demo                        one run's summary
  gantool runs runs/demo --plot runs/demo.png   ... and its curves as a PNG
"""


@click.command(epilog=HELP_EPILOG)
@click.argument("path", default="runs", type=click.Path(path_type=Path))
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw one run's losses, D outputs and validation PSNR to this image: .png, .jpg, .svg or .pdf "
    '(pip install "gantool[tensorboard]").',
)
@click.option("--overwrite", is_flag=True, help="Replace an existing --plot file.")
def runs(path: Path, plot_path: Path | None, overwrite: bool) -> None:
    """List training runs, or summarise one.

    PATH is a folder of runs (default: runs/), listed one line each: status
    (running, finished, stopped, failed, killed, incomplete, broken), step out of
    total, phase, last validation PSNR and newest checkpoint. PATH may also be
    one run folder: its summary is printed, and --plot draws its curves.
    """
    from gantool.training.runs import find_runs, looks_like_run, plot_run, run_report, runs_table, summarize_run

    if looks_like_run(path):
        info = summarize_run(path)
        if plot_path is not None:  # first, so a refused plot prints nothing else
            plot_run(info, plot_path, overwrite=overwrite)
        click.echo(run_report(info))
        if plot_path is not None:
            click.echo(f"plot:        {plot_path}")
        return
    if plot_path is not None:
        raise click.ClickException(f"--plot draws one run: {path} is not a run folder")
    found = find_runs(path)
    if not found:
        raise click.ClickException(f"{path} is not a run folder and holds no runs")
    click.echo(runs_table(found))

"""The ``gantool`` command line: thin wrappers over the library.

Each command lives in its own module and is imported only when it runs, so
``gantool --help`` does not pay for importing torch or onnxruntime. A
:class:`~gantool.core.errors.GantoolError` raised anywhere below becomes a one-line
``click.ClickException`` (exit 1), never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

import click

from gantool import __version__
from gantool.core.errors import GantoolError

# name -> (module, attribute, short help shown by `gantool --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("gantool.cli.train_cmd", "train", "Train a GLCIC inpainting GAN."),
    "export": ("gantool.cli.export_cmd", "export", "Export a generator to deployable formats."),
    "inpaint": ("gantool.cli.inpaint_cmd", "inpaint", "Fill the holes in images."),
    "info": ("gantool.cli.info_cmd", "info", "Show a model's or checkpoint's metadata."),
    "eval": ("gantool.cli.eval_cmd", "eval_", "Compare a model with classical inpainting."),
    "serve": ("gantool.cli.serve_cmd", "serve", "Serve inpainting over HTTP, with a browser page."),
    "bench": ("gantool.cli.bench_cmd", "bench", "Benchmark training or inference."),
    "doctor": ("gantool.cli.doctor_cmd", "doctor", "Check torch, CUDA and ONNX Runtime."),
    "runs": ("gantool.cli.runs_cmd", "runs", "List training runs; summarise or plot one."),
    "import": ("gantool.cli.import_cmd", "import_", "Import a model trained elsewhere (GLCIC-PyTorch)."),
    "data": ("gantool.cli.data_cmd", "data", "Pack images into WebDataset shards; check a data set."),
}


def run_library_call(ctx: click.Context, invoke: Callable[[click.Context], object]) -> object:
    try:
        return invoke(ctx)
    except GantoolError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        # Ctrl-C in a command with no stop handling of its own (data pack, eval, bench, import, ...):
        # click would print "Aborted!" and exit 1, as for an error; exit 130, as a shell reports Ctrl-C.
        click.echo(f"interrupted (SIGINT): gantool {ctx.invoked_subcommand} stopped", err=True)
        sys.exit(128 + signal.SIGINT)


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use.

    ``lazy`` maps names to ``(module, attribute, help)``.
    """

    def __init__(self, *args, lazy: dict[str, tuple[str, str, str]] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.lazy:
            return super().get_command(ctx, name)
        module, attr, _ = self.lazy[name]
        # A missing module or attribute is a packaging bug: raise it, never hide the command.
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module}.{attr} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, self.lazy[name][2]) for name in self.list_commands(ctx) if name in self.lazy]
        rows += [
            (name, cmd.get_short_help_str())
            for name in super().list_commands(ctx)
            if name not in self.lazy and (cmd := super().get_command(ctx, name)) is not None
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(sorted(rows))

    def invoke(self, ctx: click.Context):
        return run_library_call(ctx, super().invoke)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gantool")
@click.option("-v", "--verbose", is_flag=True, help="Show debug logging.")
def cli(verbose: bool) -> None:
    """gantool: train, export and run GLCIC-style inpainting GANs.

    \b
    Masks: 1 (or a pixel > 127) means hole, everywhere.
    """
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    # Third-party libraries stay at WARNING unless asked.
    if not verbose:
        for name in ("torch", "onnxscript", "onnx_ir", "PIL", "matplotlib"):
            logging.getLogger(name).setLevel(logging.WARNING)


# Exit codes a command ends with after a stop signal (as a shell reports them).
SIGNAL_EXIT_CODES = frozenset(128 + sig for sig in (signal.SIGINT, signal.SIGTERM))

# Set by main(): this process is the gantool program itself, not a command run in-process (CliRunner).
_as_program = False


def exit_stopped(code: int) -> NoReturn:
    """End a command stopped by a signal (130/143), a worker whose peer died (75), or a finished
    worker of a multi-process run (its code). As the program: at once, skipping the
    interpreter's teardown, which takes seconds with torch loaded *after* it has put the default
    signal handlers back, so a second Ctrl-C there would kill the process by the signal. Called
    while the command's own handlers still hold, this leaves no such window. In-process: SystemExit."""
    if _as_program:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main() -> None:
    """The console script (and ``python -m gantool``)."""
    global _as_program
    _as_program = True
    try:
        cli(prog_name="gantool")
    except SystemExit as stop:
        if stop.code in SIGNAL_EXIT_CODES:  # the commands that do not call exit_stopped themselves
            exit_stopped(int(stop.code))
        raise

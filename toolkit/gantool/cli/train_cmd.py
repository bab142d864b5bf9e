"""``gantool train``: parse options, call :func:`gantool.training.loop.train`, print.

Every option's default comes from :class:`gantool.core.config.TrainConfig` (shown
by ``--help``); values are checked by the library before anything is written.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from gantool.cli import exit_stopped
from gantool.cli.options import explicit_options
from gantool.core.config import TrainConfig
from gantool.core.constants import HOLE_FILLS, MASK_KINDS
from gantool.core.errors import GantoolError, ProcessLostError
from gantool.training.launch import LAUNCHER_ENV, report_worker_failure

HELP_EPILOG = """\b
Examples:
  gantool train --data synthetic --size 64 --local-size 32 --width 16 --steps-g 200 --steps-d 50 --steps-joint 200
  gantool train --data ~/photos --config examples/train_small.toml --out runs/photos
  gantool train --resume runs/photos/checkpoints/last.pt --steps-joint 5000
  gantool train --resume runs/photos/checkpoints/step_5000.pt --out runs/photos-branch
  gantool train --init-from imported/ --data ~/faces --steps-g 0 --steps-d 1000 --steps-joint 5000
"""

DEFAULTS = TrainConfig()


def config_option(name: str, help: str, show: str | bool = True, **kwargs: Any) -> Callable[[Any], Any]:
    """``--name`` for the TrainConfig field ``name``, its default taken from the dataclass."""
    flag = "--" + name.replace("_", "-")
    default = getattr(DEFAULTS, name)
    if default is None:  # decided at run time: say how instead of "None"
        return click.option(flag, name, default=None, show_default=show, help=help, **kwargs)
    return click.option(flag, name, default=default, show_default=show, help=help, **kwargs)


def flag_option(name: str, help: str, show: str | bool = True) -> Callable[[Any], Any]:
    """``--name/--no-name`` for a boolean TrainConfig field."""
    flag = name.replace("_", "-")
    return click.option(
        f"--{flag}/--no-{flag}",
        name,
        default=getattr(DEFAULTS, name),
        show_default=show,
        help=help,
    )


class OneLineErrors(click.Command):
    """Bad option values are one line (no usage block), like every other error."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            # An option whose value is optional (--mlflow [URI]) leaves a value that starts with "-"
            # to be read as an option: name the option it was given to.
            owner = _optional_value_owner(self, given, e.option_name)
            message = f"{owner} {e.option_name}: not a value {owner} takes" if owner else e.format_message()
            raise click.ClickException(message) from None
        except click.UsageError as e:
            raise click.ClickException(e.format_message()) from None


def _optional_value_owner(command: click.Command, args: list[str], token: str) -> str | None:
    optional = {name for p in command.params if isinstance(p, click.Option) and p._flag_needs_value for name in p.opts}
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if (eq and value == token and name in optional) or (arg == token and i and args[i - 1] in optional):
            return name if eq else args[i - 1]
    return None


@click.command(cls=OneLineErrors, epilog=HELP_EPILOG)
@config_option(
    "data",
    "Image folder (recursive), list file (an image path per line), WebDataset shards (a .tar, a brace pattern "
    "like 'shards/train-{000000..000099}.tar', a gantool data pack folder) or 'synthetic'.",
)
@config_option(
    "out",
    "Run folder: new or empty (an existing run is never written into, except by --resume).",
    show="runs/<timestamp>",
    type=click.Path(file_okay=False),
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="TOML file of options (keys as below, e.g. batch_size = 8); command-line options override it.",
)
@config_option("size", "Training image size (multiple of 4).", type=int)
@config_option("local_size", "Local discriminator crop; holes lie inside it.", type=int)
@config_option("batch_size", "Global batch size.", type=int)
@config_option("width", "Generator base width (GLCIC: 64).", type=int)
@config_option("disc_width", "Discriminator base width.", type=int)
@config_option("disc_fc", "Discriminator fully connected width.", type=int)
@config_option("steps_g", "Phase 1: reconstruction-only steps.", type=int)
@config_option("steps_d", "Phase 2: discriminator-only steps.", type=int)
@config_option("steps_joint", "Phase 3: joint steps.", type=int)
@config_option("lr", "Adam learning rate.", type=float)
@config_option("lr_d", "Discriminator learning rate.", show="--lr", type=float)
@config_option("betas", "Adam betas.", type=(float, float))
@config_option("alpha", "Adversarial loss weight.", type=float)
@config_option("recon_weight", "Reconstruction loss weight.", type=float)
@config_option("mask", "Hole shapes.", type=click.Choice(MASK_KINDS))
@config_option("hole_min", "Smallest box hole side in pixels.", show="local_size/2", type=int)
@config_option("hole_max", "Largest box hole side in pixels.", show="local_size", type=int)
@config_option(
    "scale_min", "Smallest crop window in multiples of --size (1 if only --scale-max is set).", show="off", type=float
)
@config_option(
    "scale_max", "Largest crop window in multiples of --size (64 if only --scale-min is set).", show="off", type=float
)
@flag_option(
    "channel_shuffle",
    "Shuffle each crop's RGB channels at random and make one in 8 grey, so mostly green (or any one-colour) "
    "data teaches no colour cast.",
)
@config_option(
    "hole_fill",
    "What the generator's input has in its holes: the data's mean pixel (GLCIC) or the surroundings' colours "
    "(a push-pull pyramid fill).",
    type=click.Choice(HOLE_FILLS),
)
@config_option("seed", "Seed for weights, data order, crops and masks.", type=int)
@config_option("device", "auto, cpu, cuda or cuda:N.")
@flag_option("amp", "bf16 autocast (auto: on for CUDA and CPUs with native bf16).", show="auto")
@flag_option("channels_last", "channels_last memory format (auto: on for CUDA and with amp).", show="auto")
@flag_option("compile", "torch.compile both networks.")
@flag_option("sync_bn", "SyncBatchNorm across processes (torchrun).")
@config_option(
    "collective_timeout",
    "Seconds a process waits for the others in a collective (several processes) before the run ends, "
    "naming the one that stopped answering.",
    type=float,
)
@click.option(
    "--resume",
    type=click.Path(),
    help="Continue exactly from a checkpoint (a run folder: its newest), in its own run (or in a new --out).",
)
@config_option(
    "init_from",
    "Start a NEW run from these weights: a checkpoint, a `gantool import` folder or generator.safetensors "
    "(the model is theirs; optimizers and step start fresh).",
    show="random weights",
    type=click.Path(),
)
@config_option("val_images", "Held-out validation images.", type=int)
@config_option("sample_every", "Validate and save a sample grid every N steps.", type=int)
@config_option("checkpoint_every", "Checkpoint every N steps.", type=int)
@flag_option("keep_checkpoints", "Also keep checkpoints/step_<N>.pt.")
@config_option("log_every", "Append to metrics.jsonl every N steps.", type=int)
@config_option("workers", "DataLoader worker processes.", type=int)
@flag_option("tensorboard", 'Write TensorBoard logs to <run>/tensorboard/ (pip install "gantool[tensorboard]").')
@config_option(
    "mlflow",
    "Track the run in MLflow: a tracking URI (sqlite:///mlflow.db, http://host:5000); alone, MLflow's default "
    '(MLFLOW_TRACKING_URI, else its local store). pip install "gantool[mlflow]".',
    show="off",
    is_flag=False,
    flag_value="",
    metavar="[URI]",
)
@config_option("mlflow_experiment", "With --mlflow: the MLflow experiment.")
@flag_option("mlflow_checkpoints", "With --mlflow: also upload every checkpoint to the MLflow run.")
@config_option(
    "fill",
    "Pixel written into holes (R G B in [0, 1]).",
    show="mean pixel of the data",
    type=(float, float, float),
)
@click.option(
    "--allow-data-change",
    is_flag=True,
    help="With --resume: continue on data (a folder, list or shards) other than (or changed from) the checkpoint's.",
)
@click.option(
    "--nproc-per-node",
    "nproc",
    type=int,
    default=1,
    show_default=True,
    help="Launch N DDP processes on this machine (torch's own launcher, as torchrun does).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(
    config_file: str | None, resume: str | None, allow_data_change: bool, nproc: int, quiet: bool, **options: Any
) -> None:
    """Train a GLCIC inpainting GAN with the fixed GAN loop.

    Phases: reconstruction only (--steps-g), discriminator only (--steps-d), then
    joint (--steps-joint). Writes checkpoints/, samples/, metrics.jsonl and
    config.toml to the run folder. Ctrl-C or SIGTERM finishes the step, saves a
    checkpoint and exits 130 or 143; a second one stops at once, keeping the
    last complete checkpoint; SIGUSR1 saves a checkpoint and continues.
    """
    from gantool.training.signals import StopFlag  # stdlib only: installed before torch is imported

    if nproc != 1:
        _launch(config_file, resume, allow_data_change, nproc, options)
        return
    stop = StopFlag()
    with stop.installed():
        try:
            result = _run(config_file, resume, allow_data_change, quiet, options, stop)
        except KeyboardInterrupt:  # a second signal before the run's own handling began
            click.echo("interrupted before training started; nothing was written", err=True)
            sys.exit(128 + (stop.signum or signal.SIGINT))
        except ProcessLostError as e:  # under DDP, another process died
            stop.settle()
            if not os.environ.get(LAUNCHER_ENV):  # --nproc-per-node's launcher names the dead process, once
                click.ClickException(str(e)).show()
            # At once: the launcher's SIGTERM would otherwise end a slow teardown by the signal.
            exit_stopped(e.exit_code)
        except GantoolError as e:
            if os.environ.get("WORLD_SIZE", "1") == "1":
                raise
            stop.settle()
            from gantool.training.tracking import failure_reason  # torch is loaded by now

            if not report_worker_failure(str(e), failure_reason(e)):  # else the launcher prints it, once
                click.ClickException(str(e)).show()
            exit_stopped(1)  # at once, as a finished worker (below)
        stop.settle()  # a signal while reporting (or exiting) is ignored: the checkpoint is on disk
        _report(result)
        if result.world_size > 1:
            # DDP keeps its process group alive after destroy_process_group (pytorch#107298): gloo's
            # threads would run through the interpreter's teardown, seconds long with torch loaded, where
            # a worker once aborted ("terminate called without an active exception") and the launcher
            # reported a finished run as failed. Its files are closed and flushed: it ends at once.
            # A worker that failed (a checkpoint it cannot write, a non-finite loss) ends so too.
            exit_stopped(result.exit_code)


def _run(
    config_file: str | None,
    resume: str | None,
    allow_data_change: bool,
    quiet: bool,
    options: dict[str, Any],
    stop: Any,
) -> Any:
    from gantool.training.loop import train as run_training  # imports torch: only when training

    chosen = _chosen_options(config_file, options)
    return run_training(chosen, resume=resume, progress=not quiet, allow_data_change=allow_data_change, stop=stop)


def _launch(
    config_file: str | None, resume: str | None, allow_data_change: bool, nproc: int, options: dict[str, Any]
) -> None:
    """Check everything once, then run this same command in ``nproc`` processes."""
    from gantool.training.launch import check_launch, launch

    chosen = _chosen_options(config_file, options)
    plan = check_launch(chosen, resume, nproc, allow_data_change)
    sys.exit(launch(nproc, _argv_without_nproc(), plan.run_dir, plan.collective_timeout))


def _chosen_options(config_file: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The TOML file's keys (each checked, even those the command line overrides), then the options given."""
    from gantool.core.config import read_config_file

    chosen = read_config_file(config_file) if config_file else {}
    chosen.update(explicit_options(click.get_current_context(), options))
    return chosen


def _argv_without_nproc() -> list[str]:
    """This command's arguments after ``train``, less --nproc-per-node (the workers are single processes)."""
    args = sys.argv[1:]
    args = args[args.index("train") + 1 :] if "train" in args else args
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out


def _report(result: Any) -> None:
    if result.rank != 0:  # under torchrun, rank 0 speaks for the run
        return
    where = result.last_checkpoint
    at = f" (step {result.checkpoint_step})" if result.checkpoint_step is not None else ""
    if result.interrupted:
        name = signal.Signals(result.stop_signal or signal.SIGINT).name
        if result.aborted:
            kept = f"the last complete checkpoint is {where}{at}" if where else "no checkpoint was written"
            _say(f"stopped at once by a second {name}: nothing saved after the last checkpoint; {kept}", err=True)
        elif where is None:
            _say(f"interrupted by {name} before the first step; nothing was kept", err=True)
        else:
            _say(f"interrupted at step {result.step} by {name}; checkpoint: {where}", err=True)
        if where is not None:
            _say(f"resume with: gantool train --resume {shlex.quote(str(where))}", err=True)  # to paste
        exit_stopped(result.exit_code)
    _say(f"done: step {result.step} ({result.phase} phase); run folder {result.run_dir}; checkpoint {where}")


def _say(line: str, err: bool = False) -> None:
    """echo that survives a closed pipe (``gantool train ... | head``): the line goes to stderr instead."""
    try:
        click.echo(line, err=err)
    except BrokenPipeError:
        # Python would report the broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if not err:
            click.echo(line, err=True)

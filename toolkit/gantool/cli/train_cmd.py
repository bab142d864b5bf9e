"""``gantool train``: parse options, call :func:`gantool.train.train`, print."""

from __future__ import annotations

import sys
from typing import Any

import click

from gantool.cli.options import explicit_options

HELP_EPILOG = """\b
Examples:
  gantool train --data synthetic --size 64 --local-size 32 --width 16 --steps-g 200 --steps-d 50 --steps-joint 200
  gantool train --data ~/photos --config examples/train_small.toml --out runs/photos
  gantool train --resume runs/photos/checkpoints/last.pt --steps-joint 5000
"""


@click.command(epilog=HELP_EPILOG)
@click.option("--data", help="Image folder (recursive) or 'synthetic'.  [default: synthetic]")
@click.option("--out", type=click.Path(file_okay=False), help="Run folder.  [default: runs/<timestamp>]")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML file of options; command-line options override it.")
@click.option("--size", type=int, help="Training image size (multiple of 4).  [default: 160]")
@click.option("--local-size", type=int, help="Local discriminator crop; holes lie inside it.  [default: 96]")
@click.option("--batch-size", type=int, help="Global batch size.  [default: 16]")
@click.option("--width", type=int, help="Generator base width (GLCIC: 64).  [default: 64]")
@click.option("--disc-width", type=int, help="Discriminator base width.  [default: 64]")
@click.option("--disc-fc", type=int, help="Discriminator fully connected width.  [default: 1024]")
@click.option("--steps-g", type=int, help="Phase 1: reconstruction-only steps.  [default: 90000]")
@click.option("--steps-d", type=int, help="Phase 2: discriminator-only steps.  [default: 10000]")
@click.option("--steps-joint", type=int, help="Phase 3: joint steps.  [default: 400000]")
@click.option("--lr", type=float, help="Adam learning rate.  [default: 2e-4]")
@click.option("--lr-d", type=float, help="Discriminator learning rate.  [default: --lr]")
@click.option("--betas", type=(float, float), help="Adam betas.  [default: 0.5 0.999]")
@click.option("--alpha", type=float, help="Adversarial loss weight.  [default: 4e-4]")
@click.option("--recon-weight", type=float, help="Reconstruction loss weight.  [default: 1.0]")
@click.option("--mask", type=click.Choice(["box", "free", "mixed"]), help="Hole shapes.  [default: box]")
@click.option("--seed", type=int, help="Seed for weights, data order, crops and masks.  [default: 0]")
@click.option("--device", help="auto, cpu, cuda or cuda:N.  [default: auto]")
@click.option("--amp/--no-amp", default=None, help="bf16 autocast.  [default: on for CUDA]")
@click.option("--channels-last/--no-channels-last", default=None, help="channels_last memory format.  [default: on for CUDA]")
@click.option("--compile", "compile_", is_flag=True, default=None, help="torch.compile both networks.")
@click.option("--sync-bn", is_flag=True, default=None, help="SyncBatchNorm across processes (torchrun).")
@click.option("--resume", type=click.Path(dir_okay=False), help="Continue exactly from a checkpoint.")
@click.option("--sample-every", type=int, help="Validate and save a sample grid every N steps.  [default: 500]")
@click.option("--checkpoint-every", type=int, help="Checkpoint every N steps.  [default: 1000]")
@click.option("--log-every", type=int, help="Append to metrics.jsonl every N steps.  [default: 10]")
@click.option("--workers", type=int, help="DataLoader worker processes.  [default: 2]")
@click.option("--tensorboard/--no-tensorboard", default=None,
              help='Write TensorBoard logs to <run>/tensorboard/ (pip install "gantool[tensorboard]").')
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(config_file: str | None, resume: str | None, quiet: bool, compile_: bool | None, **options: Any) -> None:
    """Train a GLCIC inpainting GAN with the fixed GAN loop.

    Phases: reconstruction only (--steps-g), discriminator only (--steps-d), then
    joint (--steps-joint). Writes checkpoints/, samples/, metrics.jsonl and
    config.toml to the run folder. Ctrl-C saves a checkpoint and exits 130.
    """
    from gantool.config import read_toml
    from gantool.train import train as run_training

    options["compile"] = compile_
    chosen = read_toml(config_file) if config_file else {}
    chosen.update(explicit_options(click.get_current_context(), options))
    result = run_training(chosen, resume=resume, progress=not quiet)
    if result.rank != 0:  # under torchrun, rank 0 speaks for the run
        sys.exit(130 if result.interrupted else 0)
    where = result.last_checkpoint or "(no checkpoint)"
    if result.interrupted:
        click.echo(f"interrupted at step {result.step}; checkpoint: {where}", err=True)
        click.echo(f"resume with: gantool train --resume {where}", err=True)
        sys.exit(130)
    click.echo(f"done: step {result.step} ({result.phase} phase); run folder {result.run_dir}; checkpoint {where}")

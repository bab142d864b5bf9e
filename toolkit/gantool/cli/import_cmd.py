"""``gantool import``: convert a model trained by another GLCIC implementation into gantool files."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from gantool.core.constants import IMPORT_CHECKPOINT, IMPORT_FORMATS

HELP_EPILOG = f"""\b
Examples:
  gantool import glcic-pytorch model_cn config.json -o imported/
  gantool import glcic-pytorch model_cn config.json --discriminator model_cd -o imported/
  gantool export imported/{IMPORT_CHECKPOINT} --onnx --int8 --pt2
  gantool inpaint photo.jpg --box 40,40,64,64 --model imported/export --blend none
"""


@click.command("import", epilog=HELP_EPILOG)
@click.argument("source_format", metavar="FORMAT", type=click.Choice(IMPORT_FORMATS))
@click.argument("model_cn", type=click.Path(path_type=Path))
@click.argument("config_json", type=click.Path(path_type=Path))
@click.option(
    "--discriminator",
    "model_cd",
    type=click.Path(path_type=Path),
    default=None,
    help="The discriminator's state_dict (GLCIC-PyTorch's model_cd), for fine-tuning with --init-from.",
)
@click.option(
    "-o",
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Folder to write {IMPORT_CHECKPOINT}, generator.safetensors and import_report.json into.",
)
@click.option("--overwrite", is_flag=True, help="Replace the files of an earlier import in --out.")
def import_(
    source_format: str, model_cn: Path, config_json: Path, model_cd: Path | None, out_dir: Path, overwrite: bool
) -> None:
    """Import MODEL_CN (a state_dict) and its CONFIG_JSON from FORMAT into a gantool checkpoint.

    glcic-pytorch: otenim/GLCIC-PyTorch's model_cn and config.json (its "mpv" is the
    fill, "cn_input_size" the training size). Loaded weights-only; a `module.` prefix
    (--data_parallel) is stripped; every key and shape is checked.
    """
    from gantool.training.glcic_import import import_glcic_pytorch  # delayed: imports torch

    result = import_glcic_pytorch(model_cn, config_json, out_dir, discriminator=model_cd, overwrite=overwrite)
    parts = "generator and discriminator" if result.discriminator else "generator"
    click.echo(f"imported the {parts} of {model_cn} ({source_format}) into {result.out_dir}:")
    for path in result.files.values():
        click.echo(f"  {path}")
    for note in result.notes:
        click.echo(f"  {note}")
    click.echo(f"next: gantool export {shlex.quote(str(result.files['checkpoint']))} --onnx --int8 --pt2")

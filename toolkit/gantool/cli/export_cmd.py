"""``gantool export``: options in, library call, paths and parity summary out."""

from __future__ import annotations

from pathlib import Path

import click

from gantool.artifacts import ARTIFACT, EXPORT_FORMATS


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.2f} MB" if num_bytes >= 100_000 else f"{num_bytes / 1e3:.1f} kB"


@click.command("export")
@click.argument("checkpoint", required=False, type=click.Path(path_type=Path))
@click.option("--onnx", "want_onnx", is_flag=True, help=f"Write {ARTIFACT['onnx'].filename} (default: all formats).")
@click.option("--torchscript", "want_torchscript", is_flag=True, help=f"Write {ARTIFACT['torchscript'].filename}.")
@click.option(
    "-o", "--out-dir", type=click.Path(path_type=Path, file_okay=False),
    help="Output folder [default: <run>/export beside the checkpoints folder].",
)  # fmt: skip
@click.option("--opset", type=int, default=None, help="ONNX opset [default: the exporter's choice].")
@click.option(
    "--fp16", is_flag=True, help=f"Also write {ARTIFACT['onnx_fp16'].filename} (fp16 body, float32 I/O, for GPUs)."
)
@click.option("--no-verify", is_flag=True, help="Skip the parity check against eager PyTorch.")
@click.option("--atol", type=float, default=1e-4, show_default=True, help="Max abs error allowed for fp32 backends.")
@click.option("--overwrite", is_flag=True, help="Replace existing files in the output folder.")
@click.option(
    "--cuda/--no-cuda", default=None,
    help="Also check ONNX Runtime's CUDA provider [default: when a GPU is found].",
)  # fmt: skip
@click.option(
    "--keep-debug-info", is_flag=True,
    help="Keep the exporters' stack traces and source paths in the files (for debugging the exporter).",
)  # fmt: skip
def export(
    checkpoint: Path | None,
    want_onnx: bool,
    want_torchscript: bool,
    out_dir: Path | None,
    opset: int | None,
    fp16: bool,
    no_verify: bool,
    atol: float,
    overwrite: bool,
    cuda: bool | None,
    keep_debug_info: bool,
) -> None:
    """Export CHECKPOINT's generator to ONNX and TorchScript and prove parity.

    CHECKPOINT defaults to the newest runs/*/checkpoints/last.pt. The parity
    sweep compares eager PyTorch, TorchScript and ONNX Runtime over batch sizes,
    image sizes and mask kinds; a failed check writes nothing and exits 1.
    The files carry no absolute path or stack trace of this machine unless
    --keep-debug-info is given.
    """
    from gantool.export import ParityError, export_generator, find_latest_checkpoint  # delayed: imports torch
    from gantool.parity import summary_lines

    if checkpoint is None:
        checkpoint = find_latest_checkpoint("runs")
        click.echo(f"Using the newest checkpoint: {checkpoint}")
    chosen = [name for name, wanted in (("onnx", want_onnx), ("torchscript", want_torchscript)) if wanted]
    try:
        result = export_generator(
            checkpoint, out_dir, formats=chosen or EXPORT_FORMATS, opset=opset, fp16=fp16,
            verify=not no_verify, atol=atol, overwrite=overwrite, cuda=cuda,
            keep_debug_info=keep_debug_info,
        )  # fmt: skip
    except ParityError as e:
        for line in summary_lines(e.report):
            click.echo(line, err=True)
        raise
    for key, path in result.paths.items():
        size = f"  ({_size(result.sizes[key])})" if key in result.sizes else ""
        click.echo(f"Wrote {path}{size}")
    if result.report is None:
        click.echo("Parity check skipped (--no-verify).")
    else:
        cases = len(result.report["cases"])
        click.echo(f"Parity against eager PyTorch over {cases} cases (atol {atol:g}):")
        for line in summary_lines(result.report):
            click.echo(f"  {line}")
    for note in result.notes:
        click.echo(f"Note: {note}")

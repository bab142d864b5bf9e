"""``gantool export``: options in, library call, paths and parity summary out."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from gantool.core.artifacts import ARTIFACT, DEFAULT_EXPORT_FORMATS
from gantool.core.constants import (
    DEFAULT_FP32_ATOL,
    DEFAULT_INT8_MIN_PSNR,
    DEFAULT_MLFLOW_EXPERIMENT,
    DEFAULT_PREFER,
    FP32_ERROR_MULTIPLE,
    PREFER_CHOICES,
)
from gantool.core.errors import GantoolError
from gantool.core.signals import STOP_SIGNALS, handlers_installed, raised_from_handlers_unprinted


class _Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so the export's cleanup runs."""


@contextlib.contextmanager
def _signals_end_the_export() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM stop the export with one line and exit 130 / 143 (as a shell reports
    them), after the library removed its staging folder; the output folder is left as it was.

    The handlers note what arrived: torch.onnx turns an interrupt raised inside its torch.export
    step into its own "Failed to export" error, which would otherwise end as exit 1, and one raised
    inside a weakref callback never gets out (the export then stops at its next check of the note)."""
    seen: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        seen.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated

    handlers = handlers_installed(dict.fromkeys(STOP_SIGNALS, on_signal))
    with handlers, raised_from_handlers_unprinted((KeyboardInterrupt, _Terminated)):
        try:
            yield seen
        except GantoolError:
            if not seen:
                raise
            _stopped(seen[0])
        except KeyboardInterrupt:
            _stopped(signal.SIGINT)
        except _Terminated:
            _stopped(signal.SIGTERM)


def _stopped(signum: int) -> NoReturn:
    if signum == signal.SIGINT:
        click.echo("Error: export interrupted (SIGINT); the output folder is as it was", err=True)
    else:
        click.echo("Error: export stopped (SIGTERM); the output folder is as it was", err=True)
    sys.exit(128 + signum)


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.2f} MB" if num_bytes >= 100_000 else f"{num_bytes / 1e3:.1f} kB"


@click.command("export")
@click.argument("checkpoint", required=False, type=click.Path(path_type=Path))
@click.option(
    "--onnx", "want_onnx", is_flag=True,
    help=f"Write {ARTIFACT['onnx'].filename} [default without a format option: --onnx --torchscript].",
)  # fmt: skip
@click.option("--pt2", "want_pt2", is_flag=True, help=f"Write {ARTIFACT['pt2'].filename} (torch.export).")
@click.option(
    "--aoti", "want_aoti", is_flag=True,
    help=f"Also compile {ARTIFACT['aoti'].filename} with AOTInductor for this machine (CUDA if torch sees a GPU, "
    "else the CPU); implies --pt2. Needs a C++ compiler; takes about a minute.",
)  # fmt: skip
@click.option(
    "--torchscript", "want_torchscript", is_flag=True,
    help=f"Write {ARTIFACT['torchscript'].filename} (legacy: TorchScript is deprecated upstream; "
    "--pt2 is its successor).",
)  # fmt: skip
@click.option(
    "-o", "--out-dir", type=click.Path(path_type=Path, file_okay=False),
    help="Output folder [default: <run>/export beside the checkpoints folder].",
)  # fmt: skip
@click.option("--opset", type=int, default=None, help="ONNX opset [default: the exporter's choice].")
@click.option(
    "--fp16", is_flag=True, help=f"Also write {ARTIFACT['onnx_fp16'].filename} (fp16 body, float32 I/O, for GPUs)."
)
@click.option(
    "--int8", is_flag=True,
    help=f"Also write {ARTIFACT['onnx_int8'].filename} (ONNX Runtime static QDQ quantization, per-channel), "
    "if it passes --int8-min-psnr.",
)  # fmt: skip
@click.option(
    "--calib", type=click.Path(path_type=Path, file_okay=False), default=None,
    help="Images to calibrate --int8 on [default: the run's validation images, else synthetic ones].",
)  # fmt: skip
@click.option(
    "--int8-min-psnr", type=float, default=DEFAULT_INT8_MIN_PSNR, show_default=True,
    help="Quality gate: worst hole PSNR (dB) of the int8 model against fp32 over the parity sweep.",
)  # fmt: skip
@click.option(
    "--prefer", type=click.Choice(PREFER_CHOICES), default=DEFAULT_PREFER, show_default=True,
    help="The precision `--precision auto` runs (recorded in every file; int8 needs --int8, bf16 a CPU with "
    "native bf16: their gates must pass here).",
)  # fmt: skip
@click.option("--no-verify", is_flag=True, help="Skip the parity check against eager PyTorch.")
@click.option(
    "--atol",
    type=float,
    default=None,
    help=f"Max abs error allowed for fp32 backends. Default: {DEFAULT_FP32_ATOL:g}, widened per case to "
    f"{FP32_ERROR_MULTIPLE:g}x eager fp32's own error against float64 where that is larger; a given --atol "
    "is used as it is.",
)
@click.option(
    "--overwrite", is_flag=True, help="Replace an earlier export in the output folder (only files gantool wrote)."
)
@click.option(
    "--cuda/--no-cuda", default=None,
    help="Also check ONNX Runtime's CUDA provider [default: when a GPU is found].",
)  # fmt: skip
@click.option(
    "--keep-debug-info", is_flag=True,
    help="Keep the exporters' stack traces and source paths in the files (for debugging the exporter).",
)  # fmt: skip
@click.option(
    "--mlflow", "mlflow_uri", is_flag=False, flag_value="", default=None, metavar="[URI]",
    help="Also log the export folder as an MLflow pyfunc model: a tracking URI, or alone the training run's "
    'store (else MLflow\'s default). pip install "gantool[mlflow]".',
)  # fmt: skip
@click.option(
    "--mlflow-experiment", default=DEFAULT_MLFLOW_EXPERIMENT, show_default=True,
    help="With --mlflow: the experiment, unless the checkpoint's run is tracked there (then the model joins its run).",
)  # fmt: skip
@click.option(
    "--register", metavar="NAME", default=None,
    help="Register the logged model as a new version of NAME in the MLflow registry (implies --mlflow).",
)  # fmt: skip
def export(
    checkpoint: Path | None,
    want_onnx: bool,
    want_pt2: bool,
    want_aoti: bool,
    want_torchscript: bool,
    out_dir: Path | None,
    opset: int | None,
    fp16: bool,
    int8: bool,
    calib: Path | None,
    int8_min_psnr: float,
    prefer: str,
    no_verify: bool,
    atol: float | None,
    overwrite: bool,
    cuda: bool | None,
    keep_debug_info: bool,
    mlflow_uri: str | None,
    mlflow_experiment: str,
    register: str | None,
) -> None:
    """Export CHECKPOINT's generator (ONNX, torch.export, AOTInductor, TorchScript) and prove parity.

    CHECKPOINT defaults to the newest runs/*/checkpoints/last.pt; an exported
    generator.safetensors (the shipped model's, say) exports too, and a folder
    stands for its checkpoint.pt (an import), checkpoints/last.pt (a run; else
    its highest step_N.pt) or generator.safetensors (an export), the first found. The parity
    sweep compares eager PyTorch with every format written over batch sizes,
    image sizes and mask kinds (fp32 within --atol; fp16, bf16 and int8 by
    PSNR); a failed check writes nothing and exits 1. The files go into the
    output folder together: a failed, interrupted (exit 130/143) or killed
    export leaves the earlier export there, whole. --overwrite replaces only
    files that gantool wrote.
    The files carry no absolute path or stack trace of this machine unless
    --keep-debug-info is given.
    """
    from gantool.export.exporter import ParityError, export_generator, find_latest_checkpoint  # delayed: imports torch
    from gantool.export.parity import summary_lines
    from gantool.training.checkpoint import weights_file

    if checkpoint is None:
        checkpoint = find_latest_checkpoint("runs")
        click.echo(f"Using the newest checkpoint: {checkpoint}")
    elif checkpoint.is_dir():
        checkpoint = weights_file(checkpoint, "export")
        click.echo(f"Using {checkpoint}")
    tracking = _mlflow_target(checkpoint, mlflow_uri, mlflow_experiment, register)  # a bad store: before the export
    wanted = (("onnx", want_onnx), ("torchscript", want_torchscript), ("pt2", want_pt2), ("aoti", want_aoti))
    chosen = [name for name, flag in wanted if flag]
    try:
        with _signals_end_the_export() as signals_seen:
            result = export_generator(
                checkpoint, out_dir, formats=chosen or DEFAULT_EXPORT_FORMATS, opset=opset, fp16=fp16,
                verify=not no_verify, atol=atol, overwrite=overwrite, cuda=cuda, int8=int8, calib=calib,
                int8_min_psnr=int8_min_psnr, prefer=prefer, keep_debug_info=keep_debug_info,
                stop_requested=lambda: bool(signals_seen),
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
        cases, bound = len(result.report["cases"]), result.report["atol"]
        widest = result.report["fp32_tolerance_max"]
        own = f"{FP32_ERROR_MULTIPLE:g}x eager fp32's own error against float64"
        widened = f"; up to {widest:.3g}: {own}" if widest > bound else ""
        click.echo(f"Parity against eager PyTorch over {cases} cases (atol {bound:g}{widened}):")
        for line in summary_lines(result.report):
            click.echo(f"  {line}")
    for note in result.notes:
        click.echo(f"Note: {note}")
    if tracking is not None:
        _log_to_mlflow(result.out_dir, mlflow_experiment, register, *tracking)


def _mlflow_target(
    checkpoint: Path, uri: str | None, experiment: str, register: str | None
) -> tuple[str, dict[str, Any] | None] | None:
    """The store to log into and the training run's MLflow record, checked before the export runs."""
    if uri is None and register is None:
        if experiment != DEFAULT_MLFLOW_EXPERIMENT:
            raise click.UsageError("--mlflow-experiment needs --mlflow")
        return None
    from gantool.core.mlflow_store import MlflowStore, resolve_tracking_uri
    from gantool.training.runfolder import run_of_checkpoint
    from gantool.training.tracking_mlflow import read_mlflow_record

    run_dir = run_of_checkpoint(checkpoint)
    record = read_mlflow_record(run_dir) if run_dir is not None else None
    if not uri:
        uri = str(record["tracking_uri"]) if record else resolve_tracking_uri(True)
    else:
        uri = resolve_tracking_uri(uri)
    MlflowStore.connect(uri, experiment)
    return uri, record


def _log_to_mlflow(
    out_dir: Path, experiment: str, register: str | None, uri: str, record: dict[str, Any] | None
) -> None:
    from gantool.inference.mlflow_model import log_export  # imports MLflow

    logged = log_export(out_dir, uri, experiment, register, record)
    linked = f", in training run {logged.run_id}" if logged.run_id else ""
    click.echo(f"MLflow: logged {out_dir} as {logged.model_uri} in {uri}{linked}")
    if logged.registered is not None:
        name, version = logged.registered
        click.echo(f"MLflow: registered {name} version {version}: --model models:/{name}/{version}")

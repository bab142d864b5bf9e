"""An export folder as an MLflow model: the pyfunc flavor over :class:`gantool.Inpainter`.

``gantool export ... --mlflow [URI] [--register NAME]`` calls :func:`log_export`: the export
folder is logged as an MLflow 3 logged model whose python_function flavor is
:class:`GantoolInpaintModel`, with a signature (``image``: N x H x W x 3 uint8, ``mask``:
N x H x W uint8, > 127 or 1 = hole; out: N x H x W x 3 uint8; params ``strategy`` and ``blend``), an
input example, and requirements that pin gantool's version. When the checkpoint came from a run
tracked in the same store, the model is linked to that MLflow run (its source run, at its step).

``mlflow.pyfunc.load_model(uri).predict({"image": ..., "mask": ...})`` returns the pixels
``gantool inpaint`` writes for the same image and mask with its default options (each image runs
alone, as a single image does in ``gantool inpaint``), and so does ``mlflow models serve``.

This module imports MLflow (the ``mlflow`` extra): it is imported only when asked for.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gantool import __version__
from gantool.core.artifacts import (
    META_EXPORT_ID,
    META_TRAIN_STEP,
    META_WEIGHTS_SHA256,
    read_model_metadata,
    resolve_model,
)
from gantool.core.constants import DEFAULT_BLEND, DEFAULT_MLFLOW_EXPERIMENT, DEFAULT_STRATEGY
from gantool.core.errors import GantoolError, InputError
from gantool.core.mlflow_store import MlflowStore, import_mlflow, mlflow_cause, quiet_mlflow

mlflow = import_mlflow("gantool's MLflow model")
from mlflow.models import ModelSignature  # noqa: E402 (after the one-line check above)
from mlflow.types import ParamSchema, ParamSpec, Schema, TensorSpec  # noqa: E402

EXPORT_ARTIFACT = "export"  # the key of the export folder in the model's artifacts
MODEL_NAME = "model"  # the logged model's name
MODEL_CODE = """# gantool's MLflow model: the export folder in artifacts/ through gantool.Inpainter.
import mlflow

from gantool.inference.mlflow_model import GantoolInpaintModel

mlflow.models.set_model(GantoolInpaintModel())
"""


class GantoolInpaintModel(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined]
    """Inpaints with the logged export folder; inputs and outputs as :func:`signature` says."""

    def load_context(self, context: Any) -> None:
        from gantool.inference.inpainter import Inpainter

        self.inpainter = Inpainter(context.artifacts[EXPORT_ARTIFACT])

    # MLflow reads predict's type hints as a schema and warns at every load about any hint but a
    # list[...] or one of the types it takes no schema from (ndarray, DataFrame), and about none at
    # all. What arrives is the signature's dict of arrays; the hint is np.ndarray so loading is quiet.
    def predict(self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None) -> np.ndarray:
        params = params or {}
        images, masks = _arrays(model_input)
        strategy = str(params.get("strategy") or DEFAULT_STRATEGY)
        blend = str(params.get("blend") or DEFAULT_BLEND)
        out = [
            np.asarray(self.inpainter.inpaint(image, mask, strategy=strategy, blend=blend).convert("RGB"))
            for image, mask in zip(images, masks)
        ]
        return np.stack(out).astype(np.uint8)


def _arrays(model_input: Any) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(model_input, dict) or "image" not in model_input or "mask" not in model_input:
        raise InputError("the model takes {'image': N x H x W x 3 uint8, 'mask': N x H x W uint8}")
    images, masks = np.asarray(model_input["image"]), np.asarray(model_input["mask"])
    if images.dtype != np.uint8 or masks.dtype != np.uint8:
        raise InputError(f"image and mask must be uint8, got {images.dtype} and {masks.dtype}")
    if images.ndim != 4 or images.shape[-1] != 3 or masks.shape != images.shape[:3]:
        raise InputError(f"expected image N x H x W x 3 and mask N x H x W, got {images.shape} and {masks.shape}")
    return images, masks


def signature() -> ModelSignature:
    inputs = Schema([TensorSpec(np.dtype(np.uint8), (-1, -1, -1, 3), "image"),
                     TensorSpec(np.dtype(np.uint8), (-1, -1, -1), "mask")])  # fmt: skip
    outputs = Schema([TensorSpec(np.dtype(np.uint8), (-1, -1, -1, 3))])
    params = ParamSchema(
        [ParamSpec("strategy", "string", DEFAULT_STRATEGY), ParamSpec("blend", "string", DEFAULT_BLEND)]
    )
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def input_example(size: int = 32) -> dict[str, np.ndarray]:
    """A small picture with a square hole in its middle (a gradient, so the fill has something to do)."""
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    image = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (size, 1)), np.tile(ramp[:, None], (1, size))], -1)
    mask = np.zeros((size, size), np.uint8)
    mask[size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = 255
    return {"image": image.astype(np.uint8)[None], "mask": mask[None]}


@dataclass
class LoggedExport:
    model_uri: str  # models:/<model id>
    model_id: str
    tracking_uri: str
    experiment_id: str
    run_id: str | None  # the training run it is linked to, if any
    registered: tuple[str, str] | None  # (name, version) with --register


def log_export(
    export_dir: str | Path,
    tracking_uri: str,
    experiment: str = DEFAULT_MLFLOW_EXPERIMENT,
    register: str | None = None,
    run: dict[str, Any] | None = None,
) -> LoggedExport:
    """Log ``export_dir`` as a pyfunc model in ``tracking_uri``; ``run``: the training run's MLflow
    record (run_folder's mlflow.json) to link it to; ``register``: a registered model name."""
    export_dir = Path(export_dir).resolve()
    model_file, _ = resolve_model(export_dir)
    meta = read_model_metadata(model_file)
    linked = run if run is not None and run.get("tracking_uri") == tracking_uri else None
    store = MlflowStore.connect(tracking_uri, experiment, "--mlflow")
    experiment_id = str(linked["experiment_id"]) if linked else store.experiment_id
    tags = {key: meta[key] for key in (META_EXPORT_ID, META_WEIGHTS_SHA256, META_TRAIN_STEP) if key in meta}
    step = int(meta.get(META_TRAIN_STEP, "0") or 0)
    try:
        with tempfile.TemporaryDirectory() as scratch, quiet_mlflow():
            # "Models from code": the model is this module's class, named in a small file MLflow keeps
            # beside it, so loading it runs no unpickling of arbitrary objects.
            code = Path(scratch) / "gantool_model.py"
            code.write_text(MODEL_CODE, encoding="utf-8")
            mlflow.set_tracking_uri(tracking_uri)
            mlflow.set_registry_uri(tracking_uri)
            mlflow.set_experiment(experiment_id=experiment_id)
            info = mlflow.models.Model.log(
                artifact_path=None,
                name=MODEL_NAME,
                flavor=mlflow.pyfunc,
                python_model=str(code),
                artifacts={EXPORT_ARTIFACT: str(export_dir)},
                signature=signature(),
                input_example=input_example(),
                pip_requirements=[f"gantool=={__version__}"],
                registered_model_name=register,
                run_id=linked["run_id"] if linked else None,
                step=step if linked else 0,
                tags=tags,
            )
    except GantoolError:
        raise
    except Exception as e:
        raise InputError(f"--mlflow {tracking_uri}: cannot log the export: {mlflow_cause(e)}") from None
    version = info.registered_model_version
    return LoggedExport(
        info.model_uri,
        info.model_id,
        tracking_uri,
        experiment_id,
        linked["run_id"] if linked else None,
        (register, str(version)) if register and version is not None else None,
    )

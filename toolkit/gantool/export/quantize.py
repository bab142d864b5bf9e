"""int8 ONNX: ONNX Runtime static quantization (QDQ, per-channel weights) behind a quality gate.

The fp32 export is pre-processed (``quant_pre_process``), calibrated on images
with holes drawn like the model's training masks (:func:`calibration_batch`) and
quantized with ``quantize_static``. Only convolutions are quantized (a ReLU after
one is fused into it: :data:`gantool.export.sensitivity.FUSED_ACTIVATIONS`): the composite
(``image * known + out * mask``) stays in float, so known pixels pass through
exactly. The result must come within ``min_psnr`` dB of the fp32 model
inside the hole over the parity sweep (:func:`gantool.export.parity.default_cases`).
If it does not, the convolutions are ranked by their own int8 error
(:mod:`gantool.export.sensitivity`) and the 1, 2, 4, ... worst are left in float,
each set tried in turn, as long as at most ``max_float_macs`` of the multiply-adds
run in float. If none passes, :class:`QuantizationError` gives every figure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.artifacts import META_CALIBRATION, META_FILE_WEIGHTS_SHA256, META_FLOAT_NODES, META_PRECISION
from gantool.core.config import ModelConfig, TrainConfig
from gantool.core.constants import DEFAULT_INT8_MIN_PSNR, INT8_MAX_FLOAT_MACS
from gantool.core.errors import InputError, ModelError, first_line
from gantool.core.processing import IMAGE_EXTENSIONS
from gantool.export.parity import BackendSpec, ParityCase, default_cases, onnxruntime_backend, parity_sweep
from gantool.export.provenance import redact_paths
from gantool.export.sensitivity import (
    FUSED_ACTIVATIONS,
    ConvInfo,
    conv_infos,
    conv_sqnr,
    feed_reader,
    float_sets,
    float_share,
)
from gantool.runtime.providers import open_session
from gantool.runtime.weights import file_weights_sha256, onnx_model_tensors
from gantool.training.data import (
    ImageFolderSource,
    InpaintingDataset,
    SyntheticSource,
    find_images,
    open_source,
    validation_batch,
)

log = logging.getLogger(__name__)

CALIBRATION_IMAGES = 8
QUANTIZED_OPS = ("Conv", "ConvTranspose")


class QuantizationError(ModelError):
    """The int8 model misses its quality gate; nothing was written."""


@dataclass
class Calibration:
    images: np.ndarray  # N x 3 x S x S float32
    masks: np.ndarray  # N x 1 x S x S float32, 1 = hole
    source: str  # what the images are, in words (reported to the user, folders as given)
    recorded: str = ""  # the same words for the model file and the report: folders by name only

    @property
    def kept(self) -> str:
        """What a shipped file records: no path of this machine, absolute or relative."""
        return self.recorded or redact_paths(self.source)


@dataclass
class Int8Result:
    hole_psnr: float  # worst hole PSNR (dB, uint8) against the fp32 model over the sweep
    float_nodes: list[str]  # convolutions left in float
    float_macs: float  # the share of the convolutions' multiply-adds they hold
    calibration: str


def check_calib_folder(calib_dir: str | Path) -> Path:
    """``--calib``, checked before any export work: a folder holding image files."""
    folder = Path(calib_dir)
    if not folder.is_dir():
        raise InputError(f"--calib must be a folder of images, got {folder}")
    if not find_images(folder):
        raise InputError(f"--calib folder {folder} holds no image files ({', '.join(IMAGE_EXTENSIONS)})")
    return folder


def calibration_batch(
    state: dict[str, Any], config: ModelConfig, calib_dir: str | Path | None, count: int = CALIBRATION_IMAGES
) -> Calibration:
    """Calibration images with training-like holes: ``calib_dir``, else the run's
    validation images (when its data folder is still there), else synthetic images."""
    train = state.get("train_config") or {}
    mask_kind = str(train.get("mask", TrainConfig.mask))
    size, local = config.size, config.local_size
    if calib_dir is not None:
        folder = check_calib_folder(calib_dir)
        source = ImageFolderSource(folder)
        dataset = InpaintingDataset(source, size, local, mask_kind, None)
        items = [dataset[(i, 1_000_003 + i)] for i in range(min(count, len(source)))]
        images, masks = (np.stack([item[k].numpy() for item in items]) for k in (0, 1))
        said = f"{len(items)} images from {{}}, with {mask_kind} holes"
        return Calibration(images, masks, said.format(folder), said.format(_by_name(folder)))
    data = str(train.get("data", ""))
    seed = int(train.get("seed", 0))
    described = recorded = ""
    chosen: ImageFolderSource | SyntheticSource | None = None
    if data and data != "synthetic" and Path(data).is_dir():
        try:
            chosen = open_source(data, seed)
            described = f"validation images of the run, from {data}"
            recorded = f"validation images of the run, from {_by_name(data)}"
        except InputError as e:
            log.info("run data unusable for calibration: %s", first_line(e))
    elif data == "synthetic":
        chosen, described = SyntheticSource(seed=seed), "validation images of the run (synthetic data)"
    if chosen is None:
        chosen = SyntheticSource(seed=seed)
        why = f"the run's data folder {data} is not there" if data else "the checkpoint names no training data"
        described = f"synthetic images ({why}; pass --calib DIR for real ones)"
    batch = validation_batch(chosen, count, size, local, mask_kind, None, seed)
    images, masks = batch[0].numpy(), batch[1].numpy()
    said = f"{len(images)} {{}}, with {mask_kind} holes"
    return Calibration(images, masks, said.format(described), said.format(recorded) if recorded else "")


def _by_name(folder: str | Path) -> str:
    """``<path>/NAME`` for a folder given any way (``../clients/acme/photos``, ``/srv/x/photos``)."""
    return f"<path>/{Path(folder).resolve().name}"


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ONNX Runtime's quantization tools log and warn freely; silence them here only, unless debugging."""
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _quantize(pre: Path, out: Path, calibration: Calibration, exclude: list[str]) -> None:
    from onnxruntime.quantization import (  # delayed: heavy import
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    quantize_static(
        str(pre), str(out), feed_reader(_feeds(calibration)), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        op_types_to_quantize=[*QUANTIZED_OPS, *FUSED_ACTIVATIONS],
        nodes_to_exclude=exclude, calibrate_method=CalibrationMethod.MinMax,
    )  # fmt: skip


def _unfused(floats: Sequence[ConvInfo]) -> list[str]:
    """The activations that must stay explicit: those writing the input of a convolution left in float.

    Fused, the activation would leave a DequantizeLinear feeding that convolution directly, and ONNX
    Runtime's graph optimizer (WeightBiasQuantization) then quantizes the float convolution's
    weights itself, undoing the fallback."""
    return [c.input_activation for c in floats if c.input_activation is not None]


def _pools_as_convolutions(path: Path) -> None:
    """The int8 file's zero-padded average pools written as the convolutions they equal, so that
    OpenVINO computes them right too (:func:`gantool.runtime.openvino.pools_as_convolutions`)."""
    import onnx  # delayed: heavy import

    from gantool.runtime.openvino import pools_as_convolutions

    model = onnx.load(str(path))
    if pools_as_convolutions(model):
        onnx.save_model(model, str(path), save_as_external_data=False)


def hole_psnr_floor(report: dict[str, Any], name: str) -> float:
    """The worst hole PSNR of backend ``name`` over a sweep (inf when no case had a hole)."""
    rows = [r for r in report["backends"][name]["cases"] if "error" not in r]
    if len(rows) != len(report["backends"][name]["cases"]):
        return 0.0
    return min((r["psnr_hole_uint8"] for r in rows), default=math.inf)


def _feeds(calibration: Calibration) -> list[dict[str, np.ndarray]]:
    return [
        {"image": calibration.images[i : i + 1], "mask": calibration.masks[i : i + 1]}
        for i in range(len(calibration.images))
    ]


def _write(candidate: Path, out_path: Path, metadata: dict[str, str], floats: list[str], calibration: str) -> None:
    import onnx  # delayed: heavy import

    model = onnx.load(str(candidate))
    props = {p.key: p.value for p in model.metadata_props}
    props.update(metadata)
    props[META_PRECISION] = "int8"
    props[META_FLOAT_NODES] = json.dumps(floats)
    props[META_CALIBRATION] = calibration  # Calibration.kept: no path of this machine
    props[META_FILE_WEIGHTS_SHA256] = file_weights_sha256(onnx_model_tensors(model))  # its own, int8, weights
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save_model(model, str(out_path), save_as_external_data=False)


def quantize_int8(
    fp32_path: Path,
    out_path: Path,
    metadata: dict[str, str],
    calibration: Calibration,
    config: ModelConfig,
    min_psnr: float = DEFAULT_INT8_MIN_PSNR,
    cases: Sequence[ParityCase] | None = None,
    max_float_macs: float = INT8_MAX_FLOAT_MACS,
) -> Int8Result:
    """Quantize ``fp32_path`` into ``out_path`` (any name) or raise QuantizationError with the figures.

    Every convolution in int8 first; if that misses ``min_psnr``, the most error-prone ones in
    float (see the module's docstring), within ``max_float_macs`` of the multiply-adds."""
    from onnxruntime.quantization import quant_pre_process  # delayed: heavy import

    cases = list(cases) if cases is not None else default_cases(config)
    reference = onnxruntime_backend(open_session(fp32_path, "cpu").session)
    with tempfile.TemporaryDirectory(prefix="gantool-int8-") as tmp:
        pre = Path(tmp) / "pre.onnx"
        try:
            with _quiet_quantizer():
                quant_pre_process(str(fp32_path), str(pre), skip_symbolic_shape=True)
        except Exception as e:  # shape inference / optimizer failures: one line
            raise ModelError(f"int8 quantization: pre-processing failed: {first_line(e)}") from None
        convs = conv_infos(pre, QUANTIZED_OPS, config.size, FUSED_ACTIVATIONS)
        tried: list[str] = []

        def attempt(floats: list[ConvInfo]) -> tuple[Path, bool, float]:
            exclude = [c.name for c in floats]
            candidate = Path(tmp) / f"int8_{len(exclude)}.onnx"
            try:
                with _quiet_quantizer():
                    _quantize(pre, candidate, calibration, [*exclude, *_unfused(floats)])
            except Exception as e:  # the quantizer raises many types
                raise ModelError(f"int8 quantization failed: {first_line(e)}") from None
            _pools_as_convolutions(candidate)
            session = open_session(candidate, "cpu").session
            spec = BackendSpec("int8", onnxruntime_backend(session), "int8", None, min_psnr)
            report = parity_sweep(reference, [spec], cases, config.local_size, min_psnr=min_psnr)
            psnr = hole_psnr_floor(report, "int8")
            share = float_share(floats, convs)
            kept = (
                f"{', '.join(exclude)} left in float ({share:.0%} of the multiply-adds)"
                if exclude
                else "all convolutions quantized"
            )
            log.info("int8 (%s): worst hole PSNR %.1f dB (gate %.1f dB)", kept, psnr, min_psnr)
            tried.append(f"{psnr:.1f} dB with {kept}")
            if report["passed"]:
                _write(candidate, out_path, metadata, exclude, calibration.kept)
            return candidate, bool(report["passed"]), psnr

        first, passed, psnr = attempt([])
        if passed:
            return Int8Result(psnr, [], 0.0, calibration.kept)
        try:
            with _quiet_quantizer():
                errors = conv_sqnr(pre, first, convs, _feeds(calibration), Path(tmp))
        except Exception as e:  # the debugging tools raise many types
            raise ModelError(f"int8 quantization: measuring each convolution's error failed: {first_line(e)}") from None
        ranked = sorted((c for c in convs if math.isfinite(errors[c.name])), key=lambda c: errors[c.name])
        log.info(
            "int8 error per convolution (SQNR dB): %s", ", ".join(f"{c.name} {errors[c.name]:.1f}" for c in ranked)
        )
        sets, blocked = float_sets(ranked, convs, max_float_macs)
        for floats in sets:
            _, passed, psnr = attempt(floats)
            if passed:
                return Int8Result(psnr, [c.name for c in floats], float_share(floats, convs), calibration.kept)
    if blocked is not None:
        limit = f"leaving {blocked.name} in float too would pass {max_float_macs:.0%} of the multiply-adds"
    else:
        limit = "no other convolution adds measurable int8 error"
    raise QuantizationError(
        f"int8 model below its quality gate: worst hole PSNR against fp32 {'; '.join(tried)} "
        f"(< {min_psnr:g} dB; --int8-min-psnr); {limit}; nothing written"
    )

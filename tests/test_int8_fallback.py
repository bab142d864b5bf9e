"""int8's accuracy-aware float fallback (gantool.export.quantize, gantool.export.sensitivity).

A tiny three-convolution net (image + mask -> composite, like the generator's contract)
whose int8 version passes the gate, and the same net with one planted outlier: a weight
tap of 1000 on an input channel that is always 0, so in float it adds nothing, but in
int8 it sets its output channel's weight step (per-channel scale 1000 / 127), which rounds
that channel's real taps to zero. Only leaving that convolution in float restores it.

And a conv -> ReLU -> BN net (GLCIC-PyTorch's block order) whose first convolution has a
channel that is never positive but spans far below zero: int8 must take the ReLU's range for
that convolution's output (the ReLU fused away), not the pre-ReLU range the BN then magnifies.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gantool.core.artifacts import META_FLOAT_NODES, read_model_metadata
from gantool.core.config import ModelConfig
from gantool.export.formats import example_inputs, export_onnx
from gantool.export.parity import ParityCase
from gantool.export.quantize import Calibration, QuantizationError, calibration_batch, quantize_int8
from gantool.export.sensitivity import conv_infos, conv_sqnr

CONFIG = ModelConfig(width=4, size=16, local_size=8)
CASES = [ParityCase(1, 16, 16, "box"), ParityCase(1, 20, 12, "box")]


class Tiny(nn.Module):
    def __init__(self, outlier: bool) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.a, self.b, self.c = (
            nn.Conv2d(4, 6, 3, padding=1),
            nn.Conv2d(6, 6, 3, padding=1),
            nn.Conv2d(6, 3, 3, padding=1),
        )
        with torch.no_grad():
            for conv in (self.a, self.b, self.c):
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * 0.15)
                conv.bias.zero_()
            self.a.weight[5].zero_()  # channel 5 of a's output: always 0 after the ReLU
            if outlier:
                self.b.weight[0, 5, 1, 1] = 1000.0  # multiplies that zero channel: no effect in float

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(torch.cat([image * (1 - mask), mask], 1)))
        out = torch.sigmoid(self.c(torch.relu(self.b(x))))
        return image * (1 - mask) + out * mask


class ReluThenBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.a, self.b = nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(6, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        with torch.no_grad():
            for conv in (self.a, self.b):
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * 0.15)
                conv.bias.zero_()
            # channel 0 is never positive (so 0 after the ReLU), but unfused it would stretch the int8
            # range of a's output to -40: a step of about 0.16, which the BN below multiplies by 10
            self.a.bias[0] = -40.0
            self.bn.running_var.fill_(0.01)
            self.bn.running_mean.fill_(0.1)

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.bn(torch.relu(self.a(torch.cat([image * (1 - mask), mask], 1))))
        return image * (1 - mask) + torch.sigmoid(self.b(x)) * mask


def _calibration() -> Calibration:
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(4, 3, 16, 16, generator=gen)
    masks = torch.zeros(4, 1, 16, 16)
    masks[:, :, 4:12, 4:12] = 1
    return Calibration(images.numpy(), masks.numpy(), "test images")


def _export(tmp_path, outlier: bool):
    path = tmp_path / f"fp32_{outlier}.onnx"
    export_onnx(Tiny(outlier).eval(), example_inputs(16), path, {})
    return path


def test_without_the_outlier_every_convolution_is_int8(tmp_path):
    fp32 = _export(tmp_path, outlier=False)
    result = quantize_int8(fp32, tmp_path / "int8.onnx", {}, _calibration(), CONFIG, cases=CASES)
    assert result.float_nodes == [] and result.hole_psnr >= 35.0


def test_the_convolution_that_int8_ruins_is_left_in_float(tmp_path):
    fp32 = _export(tmp_path, outlier=True)
    names = [c.name for c in conv_infos(fp32, ("Conv",), 16)]
    out = tmp_path / "int8.onnx"
    result = quantize_int8(fp32, out, {}, _calibration(), CONFIG, cases=CASES)
    assert result.float_nodes == [names[1]], (result.float_nodes, names)  # b, and only b
    assert result.hole_psnr >= 35.0
    assert 0 < result.float_macs < 0.5
    assert json.loads(read_model_metadata(out)[META_FLOAT_NODES]) == [names[1]]


def test_a_model_that_needs_more_than_the_cap_in_float_is_refused_with_the_figures(tmp_path):
    fp32 = _export(tmp_path, outlier=True)
    out = tmp_path / "int8.onnx"
    with pytest.raises(QuantizationError) as raised:
        quantize_int8(fp32, out, {}, _calibration(), CONFIG, cases=CASES, max_float_macs=0.1)
    message = str(raised.value)
    assert "\n" not in message and not out.exists()
    assert "dB with all convolutions quantized" in message and "would pass 10% of the multiply-adds" in message
    assert "nothing written" in message


def test_a_relu_before_a_batchnorm_is_fused_so_every_convolution_stays_int8(tmp_path):
    fp32 = tmp_path / "fp32.onnx"
    export_onnx(ReluThenBatchNorm().eval(), example_inputs(16), fp32, {})
    result = quantize_int8(fp32, tmp_path / "int8.onnx", {}, _calibration(), CONFIG, cases=CASES)
    # unfused: 32.5 dB with both convolutions int8, and a (57 % of the multiply-adds) over the float cap
    assert result.float_nodes == [] and result.hole_psnr >= 45.0, result


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("synthetic", "8 validation images of the run (synthetic data), with box holes"),
        ("/no/such/folder", "8 synthetic images (the run's data folder /no/such/folder is not there; pass --calib DIR"),
    ],
)
def test_the_calibration_says_in_words_what_it_ran_on(data, says):
    calibration = calibration_batch({"train_config": {"data": data, "mask": "box"}}, CONFIG, None)
    assert calibration.source.startswith(says), calibration.source  # was "8 the run's validation images ..."
    assert calibration.images.shape == (8, 3, 16, 16) and calibration.masks.shape == (8, 1, 16, 16)


def test_a_fused_relus_clamping_is_not_counted_as_int8_error(tmp_path):
    from onnxruntime.quantization import quant_pre_process

    from gantool.export.quantize import FUSED_ACTIVATIONS, QUANTIZED_OPS, _feeds, _quantize

    pre, qdq = tmp_path / "pre.onnx", tmp_path / "int8.onnx"
    quant_pre_process(str(_export(tmp_path, outlier=False)), str(pre), skip_symbolic_shape=True)
    calibration = _calibration()
    _quantize(pre, qdq, calibration, [])
    convs = conv_infos(pre, QUANTIZED_OPS, 16, FUSED_ACTIVATIONS)
    errors = conv_sqnr(pre, qdq, convs, _feeds(calibration), tmp_path)
    # uint8 rounding of this well-behaved net: tens of dB. With the pre-ReLU values taken as the
    # reference, the clamped negatives counted as noise: -1.6 to 2.3 dB.
    assert min(errors.values()) > 20.0, errors

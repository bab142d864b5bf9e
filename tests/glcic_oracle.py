"""An independent oracle for GLCIC-PyTorch's files, written from the documented facts only
(issue #25 and REFERENCE.md), never from gantool's networks:

- ``model_cn``: ``conv1``..``conv12``, ``deconv13``, ``conv14``, ``deconv15``, ``conv16``,
  ``conv17`` (weight and bias) and ``bn1``..``bn16``; each block is
  ``bn(relu(conv(x)))``; ``conv17`` then a sigmoid; the input is
  ``x * (1 - mask) + mpv * mask`` concatenated with the mask; the output is the raw sigmoid image.
- ``model_cd``: ``model_ld`` and ``model_gd`` (5x5 stride-2 convs with bias, ReLU then
  BN, then ``linear<n+1>`` to the FC width with a ReLU), ``linear1`` on their
  concatenation, then a sigmoid.

The state_dicts carry random weights and BatchNorm statistics measured on random
64 px images and then perturbed (so BN is far from the identity, with some negative scales).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

BN_EPS = 1e-5  # torch.nn.BatchNorm2d's default, which GLCIC-PyTorch keeps
# conv17 at 0.3 of He's scale: pre-sigmoid values of a few units, so the output spans (0, 1) without
# saturating (a saturated sigmoid hides errors) and rounding is not amplified beyond what a trained model sees.
CONV17_SCALE = 0.3


def cn_layers(w: int) -> list[tuple[str, str, int, int, int, int, int]]:
    """(name, kind, cin, cout, kernel, stride, dilation) of GLCIC's completion network at base width ``w``."""
    layers = [("conv1", "conv", 4, w, 5, 1, 1), ("conv2", "conv", w, 2 * w, 3, 2, 1)]
    layers += [("conv3", "conv", 2 * w, 2 * w, 3, 1, 1), ("conv4", "conv", 2 * w, 4 * w, 3, 2, 1)]
    layers += [(f"conv{i}", "conv", 4 * w, 4 * w, 3, 1, 1) for i in (5, 6)]
    layers += [(f"conv{i}", "conv", 4 * w, 4 * w, 3, 1, d) for i, d in zip((7, 8, 9, 10), (2, 4, 8, 16))]
    layers += [(f"conv{i}", "conv", 4 * w, 4 * w, 3, 1, 1) for i in (11, 12)]
    layers += [("deconv13", "deconv", 4 * w, 2 * w, 4, 2, 1), ("conv14", "conv", 2 * w, 2 * w, 3, 1, 1)]
    layers += [("deconv15", "deconv", 2 * w, w, 4, 2, 1), ("conv16", "conv", w, w // 2, 3, 1, 1)]
    layers += [("conv17", "conv", w // 2, 3, 3, 1, 1)]
    return layers


def fp32_tolerance(reference64: Tensor, oracle32: Tensor) -> float:
    """Max abs error allowed between an fp32 forward of gantool's and the float64 oracle.

    ``oracle32`` is this oracle run in float32 on the same inputs: how far fp32
    arithmetic itself lands from float64 on this network, these weights and this
    image size (the error grows with the reduction lengths and the activations'
    magnitude). Another correct fp32 implementation sums in another order
    (oneDNN, ONNX Runtime's GEMMs) and lands within a small multiple of it: 4,
    and never below 8 ulps of 1.0.
    """
    measured = float((oracle32.double() - reference64).abs().max())
    return max(4 * measured, 8 * torch.finfo(torch.float32).eps)


def _conv(x: Tensor, weight: Tensor, bias: Tensor, kind: str, stride: int, dilation: int) -> Tensor:
    kernel = weight.shape[-1]
    if kind == "deconv":
        return F.conv_transpose2d(x, weight, bias, stride=stride, padding=1)
    return F.conv2d(x, weight, bias, stride=stride, padding=dilation * (kernel - 1) // 2, dilation=dilation)


def _bn(x: Tensor, sd: dict[str, Tensor], name: str) -> Tensor:
    p = {k: sd[f"{name}.{k}"] for k in ("running_mean", "running_var", "weight", "bias")}
    return F.batch_norm(x, p["running_mean"], p["running_var"], p["weight"], p["bias"], training=False, eps=BN_EPS)


def cn_forward(sd: dict[str, Tensor], image: Tensor, mask: Tensor, mpv: list[float], width: int) -> Tensor:
    """GLCIC-PyTorch's CompletionNetwork output (the raw sigmoid image), in the dtype of ``sd``."""
    sd = {k: v.to(image.dtype) for k, v in sd.items()}
    fill = torch.tensor(mpv, dtype=image.dtype).view(1, 3, 1, 1)
    x = torch.cat([image * (1 - mask) + fill * mask, mask], dim=1)
    for i, (name, kind, _, _, _, stride, dilation) in enumerate(cn_layers(width)):
        x = _conv(x, sd[f"{name}.weight"], sd[f"{name}.bias"], kind, stride, dilation)
        if name == "conv17":
            return torch.sigmoid(x)
        x = _bn(F.relu(x), sd, f"bn{i + 1}")
    raise AssertionError("unreachable")


def composite(image: Tensor, mask: Tensor, output: Tensor) -> Tensor:
    """What gantool returns: the known pixels of ``image``, the network's output in the hole."""
    return image * (1 - mask) + output * mask


def _random_bn(sd: dict[str, Tensor], name: str, x: Tensor, gen: torch.Generator) -> None:
    """BN statistics near those of ``x`` (so activations stay O(1)), perturbed; ~20 % negative scales."""
    c = x.shape[1]
    mean = x.mean(dim=(0, 2, 3)) + 0.1 * torch.randn(c, generator=gen, dtype=x.dtype)
    var = x.var(dim=(0, 2, 3)) * (0.7 + 0.6 * torch.rand(c, generator=gen, dtype=x.dtype)) + 1e-3
    sign = torch.where(torch.rand(c, generator=gen) < 0.2, -1.0, 1.0).to(x.dtype)
    sd[f"{name}.running_mean"], sd[f"{name}.running_var"] = mean, var
    sd[f"{name}.weight"] = sign * (0.5 + torch.rand(c, generator=gen, dtype=x.dtype))
    sd[f"{name}.bias"] = 0.2 * torch.randn(c, generator=gen, dtype=x.dtype)
    sd[f"{name}.num_batches_tracked"] = torch.tensor(1000 + c, dtype=torch.int64)


def _weight(shape: tuple[int, ...], fan_in: int, gen: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / fan_in)


def make_model_cn(width: int = 8, seed: int = 0, prefix: str = "") -> dict[str, Tensor]:
    """A GLCIC-PyTorch-shaped ``model_cn`` state_dict (float32), with ``prefix`` (``"module."`` for DataParallel)."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, Tensor] = {}
    x = torch.rand(2, 4, 64, 64, generator=gen, dtype=torch.float64)  # calibration batch for the BN statistics
    for i, (name, kind, cin, cout, k, stride, dilation) in enumerate(cn_layers(width)):
        shape = (cout, cin, k, k) if kind == "conv" else (cin, cout, k, k)
        fan = cin * k * k if kind == "conv" else cin * (k // stride) ** 2
        sd[f"{name}.weight"] = _weight(shape, fan, gen) * (CONV17_SCALE if name == "conv17" else 1.0)
        sd[f"{name}.bias"] = 0.1 * torch.randn(cout, generator=gen, dtype=torch.float64)
        x = _conv(x, sd[f"{name}.weight"], sd[f"{name}.bias"], kind, stride, dilation)
        if name != "conv17":
            x = F.relu(x)
            _random_bn(sd, f"bn{i + 1}", x, gen)
            x = _bn(x, sd, f"bn{i + 1}")
    return {prefix + k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}


def cd_branch_widths(width: int, convs: int) -> list[int]:
    return [width * 2 ** min(i, 3) for i in range(convs)]  # 64, 128, 256, 512, 512, 512 at width 64


def make_model_cd(
    local_size: int, size: int, arc: str = "celeba", width: int = 4, fc: int = 16, seed: int = 1, prefix: str = ""
) -> dict[str, Tensor]:
    """A GLCIC-PyTorch-shaped ``model_cd`` state_dict; linear in_features as GLCIC-PyTorch computes them."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, Tensor] = {}
    for branch, side, convs in (("model_ld", local_size, 5), ("model_gd", size, 6 if arc == "places2" else 5)):
        x = torch.rand(4, 3, side, side, generator=gen, dtype=torch.float64)
        cin = 3
        for k, cout in enumerate(cd_branch_widths(width, convs), start=1):
            sd[f"{branch}.conv{k}.weight"] = _weight((cout, cin, 5, 5), cin * 25, gen)
            sd[f"{branch}.conv{k}.bias"] = 0.1 * torch.randn(cout, generator=gen, dtype=torch.float64)
            x = F.relu(F.conv2d(x, sd[f"{branch}.conv{k}.weight"], sd[f"{branch}.conv{k}.bias"], stride=2, padding=2))
            _random_bn(sd, f"{branch}.bn{k}", x, gen)
            x = _bn(x, sd, f"{branch}.bn{k}")
            cin = cout
        features = cin * (side // 2**convs) ** 2
        sd[f"{branch}.linear{convs + 1}.weight"] = _weight((fc, features), features, gen)
        sd[f"{branch}.linear{convs + 1}.bias"] = 0.1 * torch.randn(fc, generator=gen, dtype=torch.float64)
    sd["linear1.weight"] = _weight((1, 2 * fc), 2 * fc, gen)
    sd["linear1.bias"] = torch.zeros(1, dtype=torch.float64)
    return {prefix + k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}


def cd_forward(sd: dict[str, Tensor], local: Tensor, image: Tensor, arc: str = "celeba") -> Tensor:
    """GLCIC-PyTorch's ContextDiscriminator: probabilities (N x 1), sigmoid-ended."""
    sd = {k: v.to(image.dtype) for k, v in sd.items()}
    outs = []
    for branch, x, convs in (("model_ld", local, 5), ("model_gd", image, 6 if arc == "places2" else 5)):
        for k in range(1, convs + 1):
            x = F.conv2d(x, sd[f"{branch}.conv{k}.weight"], sd[f"{branch}.conv{k}.bias"], stride=2, padding=2)
            x = _bn(F.relu(x), sd, f"{branch}.bn{k}")
        lin = f"{branch}.linear{convs + 1}"
        outs.append(F.relu(F.linear(x.flatten(1), sd[f"{lin}.weight"], sd[f"{lin}.bias"])))
    return torch.sigmoid(F.linear(torch.cat(outs, dim=1), sd["linear1.weight"], sd["linear1.bias"]))


def write_glcic_files(
    folder: Path, sd: dict[str, Tensor], mpv: list[float], size: int = 64, local_size: int = 32, arc: str = "celeba"
) -> tuple[Path, Path]:
    """``model_cn`` (torch.save of the state_dict) and ``config.json`` as GLCIC-PyTorch writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(sd, folder / "model_cn")
    config = {"cn_input_size": size, "ld_input_size": local_size, "arc": arc, "mpv": mpv, "bsize": 16, "alpha": 4e-4}
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "model_cn", folder / "config.json"

"""GLCIC networks (Iizuka, Simo-Serra, Ishikawa, SIGGRAPH 2017) as pure nn.Modules.

Reads top-down: the completion network (the generator), then the global and
local discriminators joined as the context discriminator, then helpers. No I/O.

Blocks come in two orders (``ModelConfig.block_order``): gantool's own
``conv -> BN -> ReLU`` (convolutions without bias; BN folds into the conv at
export) and GLCIC-PyTorch's ``conv (with bias) -> ReLU -> BN``, so its trained
weights run here unchanged (:mod:`gantool.training.glcic_import`). Both are the
same networks, built by the same code; :func:`fold_batchnorm` does what is
exact for each order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from gantool.core.config import ModelConfig
from gantool.core.constants import BLOCK_ORDERS, HOLE_FILLS

BN_FIRST, RELU_FIRST = BLOCK_ORDERS  # "conv-bn-relu" (gantool), "conv-relu-bn" (GLCIC-PyTorch)
MEAN_PIXEL, PUSH_PULL = HOLE_FILLS
# Levels of the push-pull pyramid: a hole up to about 2**PUSH_PULL_LEVELS px across still gets
# its own surroundings' colours; a bigger one (or an image without known pixels) the mean pixel.
PUSH_PULL_LEVELS = 10


def push_pull_fill(image: Tensor, known: Tensor, default: Tensor, levels: int = PUSH_PULL_LEVELS) -> Tensor:
    """Each pixel's colour from its nearest known surroundings (push-pull, Gortler et al. 1996).

    Push: halve the known pixels (weighted by ``known``) and their weights ``levels`` times.
    Pull: from the coarsest level down, a pixel with known pixels in its cell keeps their mean;
    one without takes the bilinear upsampling of the coarser level. Where even the coarsest
    cell is empty, ``default`` (N or 1 x 3 x 1 x 1). Every op exports (Pad, AveragePool, Resize,
    LessOrEqual, Cast); padded pixels have weight 0, so they change no mean.
    """
    values, weights = [image * known], [known]
    for _ in range(levels):
        # A zero row and column first: halving an odd side keeps its last pixel (in a cell of
        # weight < 4), and a 1 px side stays 1 px (OpenVINO refuses a kernel larger than its input).
        values.append(F.avg_pool2d(F.pad(values[-1], (0, 1, 0, 1)), 2))
        weights.append(F.avg_pool2d(F.pad(weights[-1], (0, 1, 0, 1)), 2))
    fill = _known_mean_or(values[-1], weights[-1], default)
    for value, weight in zip(reversed(values[:-1]), reversed(weights[:-1])):
        coarser = F.interpolate(fill, size=value.shape[-2:], mode="bilinear", align_corners=False)
        fill = _known_mean_or(value, weight, coarser)
    # An image without any known pixel: the fill colour, chosen per image in arithmetic (OpenVINO's
    # int8 pipeline computed the pyramid's own fallback to it as 0).
    none_known = (known.sum(dim=(1, 2, 3), keepdim=True) <= 0).to(image.dtype)
    return fill * (1.0 - none_known) + default * none_known


def _known_mean_or(value: Tensor, weight: Tensor, elsewhere: Tensor) -> Tensor:
    """``value / weight`` where a cell has known pixels, else ``elsewhere``; in arithmetic, and
    exact, since a cell without known pixels has value 0."""
    empty = (weight <= 0).to(value.dtype)
    return value / (weight + empty) + empty * elsewhere


def hole_input(image: Tensor, mask: Tensor, fill: Tensor, hole_fill: str) -> tuple[Tensor, Tensor]:
    """The generator's 4-channel input (``image`` with its holes filled as ``hole_fill`` says,
    then ``mask``), and the fill written into the holes."""
    known = 1.0 - mask
    fill = fill.to(image.dtype)
    if hole_fill == PUSH_PULL:
        fill = push_pull_fill(image, known, fill)
    return torch.cat([image * known + fill * mask, mask], dim=1), fill


def hole_output(body_out: Tensor, fill: Tensor, hole_fill: str) -> Tensor:
    """What the generator paints into the holes, from its body's sigmoid output ``body_out``.

    GLCIC (mean pixel): the output itself. Push-pull: a correction of the fill,
    ``fill + 2 * body_out - 1`` (a step in (-1, 1)) clamped to [0, 1], so the network only
    learns what the surroundings' colours miss; its last convolution starts at zero, so an
    untrained network returns the fill.
    """
    if hole_fill == PUSH_PULL:
        return (fill + (2.0 * body_out - 1.0)).clamp(0.0, 1.0)  # the step first: fill + 1 would round
    return body_out


def complete(image: Tensor, mask: Tensor, fill: Tensor, hole_fill: str, body: Callable[[Tensor], Tensor]) -> Tensor:
    """The generator's forward around its ``body`` (which returns ``image``'s dtype): fill the
    holes (:func:`hole_input`), run the body, paint the holes (:func:`hole_output`), composite."""
    known = 1.0 - mask
    x, filled = hole_input(image, mask, fill, hole_fill)
    out = hole_output(body(x), filled, hole_fill)
    return image * known + out * mask


def block(conv: nn.Module, cout: int, order: str = BN_FIRST) -> nn.Sequential:
    """``conv`` followed by BatchNorm and ReLU in ``order`` (one of BLOCK_ORDERS)."""
    if order == BN_FIRST:
        return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
    if order == RELU_FIRST:
        return nn.Sequential(conv, nn.ReLU(inplace=True), nn.BatchNorm2d(cout))
    raise ValueError(f"block order {order!r}: expected one of {', '.join(BLOCK_ORDERS)}")


def conv_block(
    cin: int,
    cout: int,
    kernel: int = 3,
    stride: int = 1,
    dilation: int = 1,
    order: str = BN_FIRST,
    bias: bool = False,
) -> nn.Sequential:
    padding = dilation * (kernel - 1) // 2
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, bias=bias)
    return block(conv, cout, order)


def up_block(cin: int, cout: int, order: str = BN_FIRST, bias: bool = False) -> nn.Sequential:
    """4x4 stride-2 transposed convolution: exactly doubles H and W."""
    conv = nn.ConvTranspose2d(cin, cout, 4, stride=2, padding=1, bias=bias)
    return block(conv, cout, order)


class CompletionNetwork(nn.Module):
    """The generator: 17 convolutions, fully convolutional, stride 4.

    ``forward(image, mask)`` takes float RGB in [0, 1] (N x 3 x H x W) and a
    mask (N x 1 x H x W, 1 = hole) and returns the completed image. The hole is
    first filled (:func:`hole_input`: the data's mean pixel ``config.fill``, or
    with ``config.hole_fill = "push-pull"`` the surroundings' colours, which the network
    then corrects: :func:`hole_output`); the network's output is composited inside
    forward, so known pixels come back exactly.
    H and W must be multiples of ``config.stride`` (4).
    """

    fill: Tensor  # a registered buffer: the mean pixel written into holes

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        w = config.width
        order, bias = config.block_order, config.conv_bias

        def conv(cin: int, cout: int, **kwargs: int) -> nn.Sequential:
            return conv_block(cin, cout, order=order, bias=bias, **kwargs)

        self.body = nn.Sequential(
            conv(4, w, kernel=5),
            conv(w, 2 * w, stride=2),
            conv(2 * w, 2 * w),
            conv(2 * w, 4 * w, stride=2),
            conv(4 * w, 4 * w),
            conv(4 * w, 4 * w),
            *(conv(4 * w, 4 * w, dilation=d) for d in (2, 4, 8, 16)),
            conv(4 * w, 4 * w),
            conv(4 * w, 4 * w),
            up_block(4 * w, 2 * w, order, bias),
            conv(2 * w, 2 * w),
            up_block(2 * w, w, order, bias),
            conv(w, w // 2),
            nn.Conv2d(w // 2, 3, 3, padding=1),
            nn.Sigmoid(),
        )
        self.register_buffer("fill", torch.tensor(config.fill, dtype=torch.float32).view(1, 3, 1, 1))
        if config.hole_fill == PUSH_PULL:  # the correction of the fill starts at 0 (see hole_output)
            last: nn.Conv2d = self.body[-2]  # type: ignore[assignment]  # the Conv2d before the Sigmoid
            for tensor in (last.weight, last.bias):
                assert tensor is not None  # the last conv always has its bias
                nn.init.zeros_(tensor)

    def forward(self, image: Tensor, mask: Tensor) -> Tensor:
        return complete(image, mask, self.fill, self.config.hole_fill, lambda x: self.body(x).to(image.dtype))


def num_downsamples(size: int) -> int:
    """How many stride-2 convs a discriminator uses: halve while the map stays >= 3 px.

    This reproduces GLCIC's counts: 5 for 96 px and 160 px, 6 for 256 px.
    """
    n = 1
    while size / 2 ** (n + 1) >= 3:
        n += 1
    return n


class DiscriminatorBranch(nn.Module):
    """5x5 stride-2 conv blocks (BN and ReLU in ``order``), then a fully connected layer.

    ``convs`` = 0 takes the count from the input size (:func:`num_downsamples`).
    """

    def __init__(
        self, input_size: int, width: int, fc: int, convs: int = 0, order: str = BN_FIRST, bias: bool = False
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin, side = 3, input_size
        for i in range(convs or num_downsamples(input_size)):
            cout = width * 2 ** min(i, 3)  # 64, 128, 256, 512, 512, ...
            layers += list(block(nn.Conv2d(cin, cout, 5, stride=2, padding=2, bias=bias), cout, order))
            cin, side = cout, (side + 1) // 2
        self.input_size = input_size
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin * side * side, fc)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.fc(self.features(x).flatten(1)))


class ContextDiscriminator(nn.Module):
    """GLCIC's discriminator: a global branch on the whole image and a local
    branch on the crop around the hole, concatenated, then one logit.

    Returns logits (N,); the losses apply the sigmoid (BCE with logits).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        variant = (c.block_order, c.conv_bias)
        self.global_branch = DiscriminatorBranch(c.size, c.disc_width, c.disc_fc, c.disc_global_convs, *variant)
        self.local_branch = DiscriminatorBranch(c.local_size, c.disc_width, c.disc_fc, c.disc_local_convs, *variant)
        self.head = nn.Linear(2 * config.disc_fc, 1)

    def forward(self, local_crop: Tensor, image: Tensor) -> Tensor:
        joined = torch.cat([self.local_branch(local_crop), self.global_branch(image)], dim=1)
        return self.head(joined).squeeze(1)


def crop_local(images: Tensor, corners: Tensor, size: int) -> Tensor:
    """Crop ``size x size`` windows; ``corners`` is N x 2 (top, left) per image."""
    return torch.stack(
        [img[:, int(t) : int(t) + size, int(l) : int(l) + size] for img, (t, l) in zip(images, corners.tolist())]
    )


class ChannelAffine(nn.Module):
    """``x * sign + shift`` per channel: what stays of a BatchNorm after a ReLU once its
    scale is folded into the convolution before the ReLU (see :func:`fold_batchnorm`).

    ``sign`` is +1 or -1 per channel, so the multiply is exact; it is skipped when all are +1.
    """

    sign: Tensor
    shift: Tensor

    def __init__(self, sign: Tensor, shift: Tensor) -> None:
        super().__init__()
        self.register_buffer("sign", sign.detach().clone().view(1, -1, 1, 1))
        self.register_buffer("shift", shift.detach().clone().view(1, -1, 1, 1))
        self.signed = bool((sign < 0).any())

    def forward(self, x: Tensor) -> Tensor:
        return (x * self.sign if self.signed else x) + self.shift


def _scale_conv(conv: nn.Conv2d | nn.ConvTranspose2d, scale: Tensor) -> nn.Module:
    """A copy of ``conv`` with each output channel multiplied by ``scale`` (bias too)."""
    conv = copy.deepcopy(conv)
    out_dim = 1 if isinstance(conv, nn.ConvTranspose2d) else 0  # ConvTranspose2d weights are (in, out, kh, kw)
    shape = [1] * conv.weight.dim()
    shape[out_dim] = -1
    with torch.no_grad():
        conv.weight.mul_(scale.view(shape))
        if conv.bias is not None:
            conv.bias.mul_(scale)
    return conv


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode with each BatchNorm folded as far as is exact.

    ``conv -> BN``: the BN folds into the conv entirely. ``conv -> ReLU -> BN``
    (GLCIC-PyTorch's order): BN is ``y = a * relu(z) + b`` per channel, and
    ``a * relu(z) = sign(a) * relu(|a| * z)``, so ``|a|`` folds into the conv before
    the ReLU; ``sign(a)`` and the shift ``b`` stay as a :class:`ChannelAffine`. The
    shift cannot move into the next convolution: it zero-pads, so at the border it
    would add ``b`` where the original adds 0.
    """
    model = copy.deepcopy(model).eval()
    for module in model.modules():
        if not isinstance(module, nn.Sequential):
            continue
        for i in range(len(module) - 1):
            conv, nxt = module[i], module[i + 1]
            if not isinstance(conv, (nn.Conv2d, nn.ConvTranspose2d)):
                continue
            if isinstance(nxt, nn.BatchNorm2d):
                transpose = isinstance(conv, nn.ConvTranspose2d)
                module[i] = fuse_conv_bn_eval(conv, nxt, transpose=transpose)
                module[i + 1] = nn.Identity()
            elif isinstance(nxt, nn.ReLU) and i + 2 < len(module) and isinstance(module[i + 2], nn.BatchNorm2d):
                bn: nn.BatchNorm2d = module[i + 2]  # type: ignore[assignment]  # checked above
                mean, var = bn.running_mean, bn.running_var
                assert mean is not None and var is not None  # eval-mode BN keeps them
                gamma = bn.weight if bn.weight is not None else torch.ones_like(var)
                beta = bn.bias if bn.bias is not None else torch.zeros_like(var)
                with torch.no_grad():
                    scale = gamma / torch.sqrt(var + bn.eps)
                    shift = beta - mean * scale
                    sign = torch.where(scale < 0, -1.0, 1.0).to(scale.dtype)
                module[i] = _scale_conv(conv, scale.abs())
                module[i + 2] = ChannelAffine(sign, shift)
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

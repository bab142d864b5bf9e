"""GLCIC networks (Iizuka, Simo-Serra, Ishikawa, SIGGRAPH 2017) as pure nn.Modules.

Reads top-down: the completion network (the generator), then the global and
local discriminators joined as the context discriminator, then helpers. No I/O.

Every convolution that BatchNorm follows has no bias and sits in a
``conv -> BN -> ReLU`` block, so BN can be folded into it at export
(:func:`fold_batchnorm`).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from gantool.core.config import ModelConfig


def conv_block(cin: int, cout: int, kernel: int = 3, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    padding = dilation * (kernel - 1) // 2
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def up_block(cin: int, cout: int) -> nn.Sequential:
    """4x4 stride-2 transposed convolution: exactly doubles H and W."""
    conv = nn.ConvTranspose2d(cin, cout, 4, stride=2, padding=1, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class CompletionNetwork(nn.Module):
    """The generator: 17 convolutions, fully convolutional, stride 4.

    ``forward(image, mask)`` takes float RGB in [0, 1] (N x 3 x H x W) and a
    mask (N x 1 x H x W, 1 = hole) and returns the completed image. The hole is
    first filled with the data's mean pixel (``config.fill``); the network's
    output is composited inside forward, so known pixels come back exactly.
    H and W must be multiples of ``config.stride`` (4).
    """

    fill: Tensor  # a registered buffer: the mean pixel written into holes

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        w = config.width
        self.body = nn.Sequential(
            conv_block(4, w, kernel=5),
            conv_block(w, 2 * w, stride=2),
            conv_block(2 * w, 2 * w),
            conv_block(2 * w, 4 * w, stride=2),
            conv_block(4 * w, 4 * w),
            conv_block(4 * w, 4 * w),
            *(conv_block(4 * w, 4 * w, dilation=d) for d in (2, 4, 8, 16)),
            conv_block(4 * w, 4 * w),
            conv_block(4 * w, 4 * w),
            up_block(4 * w, 2 * w),
            conv_block(2 * w, 2 * w),
            up_block(2 * w, w),
            conv_block(w, w // 2),
            nn.Conv2d(w // 2, 3, 3, padding=1),
            nn.Sigmoid(),
        )
        self.register_buffer("fill", torch.tensor(config.fill, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, image: Tensor, mask: Tensor) -> Tensor:
        known = 1.0 - mask
        x = image * known + self.fill.to(image.dtype) * mask
        out = self.body(torch.cat([x, mask], dim=1)).to(image.dtype)
        return image * known + out * mask


def num_downsamples(size: int) -> int:
    """How many stride-2 convs a discriminator uses: halve while the map stays >= 3 px.

    This reproduces GLCIC's counts: 5 for 96 px and 160 px, 6 for 256 px.
    """
    n = 1
    while size / 2 ** (n + 1) >= 3:
        n += 1
    return n


class DiscriminatorBranch(nn.Module):
    """5x5 stride-2 conv -> BN -> ReLU blocks, then a fully connected layer."""

    def __init__(self, input_size: int, width: int, fc: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin, side = 3, input_size
        for i in range(num_downsamples(input_size)):
            cout = width * 2 ** min(i, 3)  # 64, 128, 256, 512, 512, ...
            conv = nn.Conv2d(cin, cout, 5, stride=2, padding=2, bias=False)
            layers += [conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
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
        self.global_branch = DiscriminatorBranch(config.size, config.disc_width, config.disc_fc)
        self.local_branch = DiscriminatorBranch(config.local_size, config.disc_width, config.disc_fc)
        self.head = nn.Linear(2 * config.disc_fc, 1)

    def forward(self, local_crop: Tensor, image: Tensor) -> Tensor:
        joined = torch.cat([self.local_branch(local_crop), self.global_branch(image)], dim=1)
        return self.head(joined).squeeze(1)


def crop_local(images: Tensor, corners: Tensor, size: int) -> Tensor:
    """Crop ``size x size`` windows; ``corners`` is N x 2 (top, left) per image."""
    return torch.stack(
        [img[:, int(t) : int(t) + size, int(l) : int(l) + size] for img, (t, l) in zip(images, corners.tolist())]
    )


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode with every conv -> BN pair folded into one conv."""
    model = copy.deepcopy(model).eval()
    for module in model.modules():
        if not isinstance(module, nn.Sequential):
            continue
        for i in range(len(module) - 1):
            conv, bn = module[i], module[i + 1]
            if isinstance(conv, (nn.Conv2d, nn.ConvTranspose2d)) and isinstance(bn, nn.BatchNorm2d):
                transpose = isinstance(conv, nn.ConvTranspose2d)
                module[i] = fuse_conv_bn_eval(conv, bn, transpose=transpose)
                module[i + 1] = nn.Identity()
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""The one mask rule: what counts as a hole in a mask file, a PIL image or an array.

:func:`mask_to_array` decides for ``--mask``, the Python API and ``serve`` alike;
:func:`alpha_hole_mask` reads an image's own transparent pixels as holes. Re-exported
by :mod:`gantool.core.processing`, the pixel contract.
"""

from __future__ import annotations

import logging

import numpy as np
from PIL import Image

from gantool.core.errors import InputError

log = logging.getLogger(__name__)


def _is_high_bit(img: Image.Image) -> bool:
    return img.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


def alpha_hole_mask(img: Image.Image) -> np.ndarray | None:
    """Transparent pixels as holes (float32 H x W), or None without any alpha channel."""
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode not in ("RGBA", "LA", "PA", "RGBa", "La"):
        return None
    alpha = np.asarray(img.getchannel("A"))
    return (alpha <= 127).astype(np.float32)


def _said_zero_one() -> None:
    if not _ZERO_ONE_SAID:
        _ZERO_ONE_SAID.append(True)
        log.info("a mask whose maximum is 1 is read as a 0/1 mask (1 = hole)")


_ZERO_ONE_SAID: list[bool] = []  # said once per process
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


def mask_to_array(img: Image.Image | np.ndarray) -> np.ndarray:
    """A mask (a PIL image in any mode, or an array) -> float32 H x W with 1 = hole.

    The one rule, for mask files, PIL images and arrays alike:

    - a pixel's value is its brightest colour channel (a red stroke is as much a
      hole as a white one), scaled by its full range: 255 for 8-bit, 65535 for
      16-bit and 32-bit integer images, 1 for float images; it is a hole above half
      of that range (> 127 for 8-bit);
    - with an alpha channel the value is multiplied by the opacity (a mask painted
      on a transparent layer), and when every colour channel is 0 and the alpha
      varies, the alpha alone is the mask (an alpha-only mask: opaque = hole; an
      opaque black mask has no hole);
    - an integer mask whose maximum is 1 is a 0/1 mask (1 = hole).

    Arrays: H x W (grey), H x W x 2 (grey + alpha), x 3 (RGB), x 4 (RGBA); uint8 and
    uint16 have the range of their type, bool and float arrays 0..1, other integer
    arrays the smallest of 1, 255 and 65535 that holds their values.
    """
    if isinstance(img, np.ndarray):
        arr = np.asarray(img)
        if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 2, 3, 4)):
            raise InputError(f"mask arrays must be H x W or H x W x 1|2|3|4, got shape {arr.shape}")
        if arr.dtype == bool:
            arr = arr.astype(np.uint8)
        if arr.dtype == np.uint8:
            peak = 255.0
        elif arr.dtype == np.uint16:
            peak = 65535.0
        elif np.issubdtype(arr.dtype, np.integer):
            top = int(arr.max(initial=0))
            peak = 255.0 if top <= 255 else 65535.0
        elif np.issubdtype(arr.dtype, np.floating):
            peak = 1.0
        else:
            raise InputError(f"mask arrays must be integer, bool or float, got {arr.dtype}")
        channels = arr[..., None] if arr.ndim == 2 else arr
        alpha = channels.shape[2] in (2, 4)
        return _mask_from_channels(channels, peak, alpha, integer=not np.issubdtype(arr.dtype, np.floating))
    if _is_high_bit(img):
        peak = 1.0 if img.mode == "F" else 65535.0
        return _mask_from_channels(np.asarray(img)[..., None], peak, False, integer=img.mode != "F")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode not in ("L", "RGB") + _ALPHA_MODES:
        img = img.convert("RGB")  # 1, CMYK, YCbCr, LAB, HSV: as displayed
    if img.mode in ("RGBa", "La"):  # premultiplied: undo it, so colour and alpha mean what they do elsewhere
        img = img.convert("RGBA" if img.mode == "RGBa" else "LA")
    channels = np.asarray(img)
    channels = channels[..., None] if channels.ndim == 2 else channels
    return _mask_from_channels(channels, 255.0, img.mode in _ALPHA_MODES, integer=True)


def _mask_from_channels(channels: np.ndarray, peak: float, alpha: bool, integer: bool) -> np.ndarray:
    """H x W x C (colour channels, then alpha when ``alpha``) -> the hole mask of :func:`mask_to_array`."""
    # Integer channels without alpha are compared as they are: the same results (integers up to
    # 2^24 are exact in float32) without a float copy of every channel, so a 12 MP mask is
    # thresholded in a few ms (the server counts a mask's holes before anything else).
    values = channels if integer and not alpha else channels.astype(np.float32)
    colour = values[..., :-1] if alpha else values
    if colour.size and integer and values.max() == 1 and values.min() >= 0:
        _said_zero_one()
        peak = 1.0  # a 0/1 mask: 1 is a hole (the threshold below is then 0.5)
    level = colour.max(axis=2) if colour.shape[2] else np.zeros(values.shape[:2], np.float32)
    if alpha:
        opacity = values[..., -1] / peak
        alpha_only = not colour.any() and values[..., -1].min() < values[..., -1].max()
        level = values[..., -1] if alpha_only else level * opacity
    return (level > peak / 2).astype(np.float32)

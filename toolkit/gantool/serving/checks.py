"""Cheap checks of an upload before costly work: sizes from the files' headers, before either is
decoded; the answer's format's limits, before the model runs."""

from __future__ import annotations

import warnings
from typing import BinaryIO

from PIL import Image

from gantool.core.constants import DECODE_FORMATS
from gantool.core.errors import InputError, SizeLimitError


def _header_size(file: BinaryIO) -> tuple[int, int] | None:
    """An upload's stored width and height from its header alone (None when unreadable: the
    decoder then says why). The file is left at its start."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the decoder's limit applies later
            with Image.open(file, formats=DECODE_FORMATS) as img:
                return img.size
    except Exception:
        return None
    finally:
        file.seek(0)


def check_header_sizes(image_file: BinaryIO, mask_file: BinaryIO, max_pixels: int) -> None:
    """Refuse a mask whose size cannot match the image's, from both headers, before either is
    decoded (a 16 kB 1-bit mask of 6000 x 6000 decodes for seconds). Either orientation passes
    here (EXIF may turn one); the decoded sizes are compared exactly later. An upload over
    ``max_pixels`` is left to the decoder's 413, which names that limit."""
    image, mask = _header_size(image_file), _header_size(mask_file)
    over = any(size is not None and size[0] * size[1] > max_pixels for size in (image, mask))
    if not over and image is not None and mask is not None and mask not in (image, image[::-1]):
        raise InputError(
            f"the uploaded mask is {mask[0]}x{mask[1]} but the uploaded image is {image[0]}x{image[1]} "
            "(masks must match the displayed image size; no resizing)"
        )


WEBP_MAX_SIDE = 16383  # libwebp's limit on either side


def check_output_format(image: Image.Image, fmt: str) -> None:
    """What the answer's format cannot hold, refused before the model runs (422: the request is
    well formed, the format cannot carry this image)."""
    if fmt != "webp":
        return
    if image.mode == "I;16":
        raise UnsupportedOutput("WebP cannot hold a 16-bit image: ask for format=png")
    if max(image.size) > WEBP_MAX_SIDE:
        raise UnsupportedOutput(
            f"WebP holds at most {WEBP_MAX_SIDE} pixels a side and this image is {image.width}x{image.height}: "
            "ask for format=png"
        )


class UnsupportedOutput(InputError):
    """The image is fine; the asked-for output format cannot hold it (422)."""


def check_full_strategy_from_header(image_file: BinaryIO, strategy: str, multiple: int, max_model_pixels: int) -> None:
    """``strategy=full`` sends the whole padded image through the model: over ``--max-model-pixels``
    it is refused from the header, before the image and its mask are decoded (a 16 kB 1-bit PNG of
    6000 x 6000 decodes for a second). The same words as the cost check after decoding."""
    if strategy != "full":
        return
    size = _header_size(image_file)
    if size is None:
        return
    width, height = size
    padded = (width + (-width) % multiple) * (height + (-height) % multiple)
    if padded > max_model_pixels:
        raise SizeLimitError(
            f"this request would run {padded} pixels through the model (1 windows), over --max-model-pixels "
            f"({max_model_pixels}); use strategy crop or resize, or fewer holes"
        )

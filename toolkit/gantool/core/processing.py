"""The ONE place for pre- and post-processing.

Every backend (eager PyTorch, TorchScript, ONNX Runtime) and the training data
pipeline go through these functions, so colour order, value range, mask
threshold, padding and compositing are defined once:

- images are RGB, float32, in [0, 1]; arrays are H x W x 3, batches N x 3 x H x W;
- masks are float32 {0, 1}, 1 = hole; a mask pixel counts as a hole when it is
  above half of its range (> 127 for 8-bit);
- sizes are padded (reflect) to the model's size multiple and cropped back;
- the result is composited: only hole pixels change;
- GLCIC's post-processing (:func:`poisson_blend`: a fast-marching fill of the
  hole, then Poisson blending of the network's output onto it) runs here, after
  the network and before the composite, for every backend and precision.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from gantool.core.config import NETWORK_STRIDE, ModelConfig
from gantool.core.constants import BLEND_MODES, DECODE_FORMATS
from gantool.core.errors import InputError, SizeLimitError, check_choice, first_line
from gantool.core.mask_input import _is_high_bit, alpha_hole_mask, mask_to_array
from gantool.core.png import refuse_short_png
from gantool.core.png import save_png as save_png  # re-exported: processing is the one place

__all__ = ["alpha_hole_mask", "mask_to_array"]  # the mask rule lives in mask_input; re-exported here

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
MASK_CONVENTION = (
    "1 = hole (mask pixel > half its range, 127 for 8-bit; a mask image whose maximum is 1 is 0/1); 0 = known"
)


def processing_contract(config: ModelConfig) -> dict[str, Any]:
    """What an exported model expects and returns: stored in its metadata."""
    return {
        "inputs": {
            "image": "float32 N x 3 x H x W, RGB, values in [0, 1]",
            "mask": "float32 N x 1 x H x W, 1 = hole, 0 = known",
        },
        "outputs": {"inpainted": "float32 N x 3 x H x W, RGB, values in [0, 1]"},
        "color_order": "RGB",
        "layout": "NCHW",
        "value_range": [0.0, 1.0],
        "mask_convention": MASK_CONVENTION,
        "size_multiple": config.stride,
        "pad_mode": "reflect",
        "composite": "inside the graph: output = image * (1 - mask) + network * mask",
        "train_size": config.size,
        "local_size": config.local_size,
    }


# --------------------------------------------------------------------------- reading


def keep_colour_profile(source: Image.Image, result: Image.Image) -> Image.Image:
    """``result`` carrying ``source``'s ICC profile when the profile still describes its pixels:
    an RGB or grey source written in its own family (a CMYK profile does not fit RGB output)."""
    icc = source.info.get("icc_profile")
    same_family = (source.mode in _RGB_FAMILY and result.mode == "RGB") or (
        source.mode not in _RGB_FAMILY and output_mode(source) == result.mode and source.mode != "CMYK"
    )
    if icc and same_family:
        result.info["icc_profile"] = icc
    return result


_RGB_FAMILY = ("RGB", "RGBA", "RGBa", "RGBX", "P", "PA")


def read_image(
    source: str | Path | BinaryIO,
    lossless: bool = False,
    *,
    max_pixels: int | None = None,
    name: str | None = None,
) -> Image.Image:
    """Open and fully decode an image, EXIF orientation applied. Raises InputError.

    ``source``: a path, or a binary file object (an upload; ``name`` labels it in
    messages, e.g. "the uploaded image").
    ``lossless``: refuse images whose known pixels gantool could not write back
    unchanged (see :func:`check_lossless`), for the inpainting paths.
    ``max_pixels``: a larger image raises :class:`SizeLimitError` from its
    header's size, before any pixel is decoded (decompression bombs).
    """
    if isinstance(source, (str, Path)):
        source = Path(source)
        if source.is_dir():
            raise InputError(f"expected an image file, got a folder: {source}")
        if source.exists() and not source.is_file():  # a FIFO or device would block or stream forever
            raise InputError(f"not a regular file: {source}")
    label = name or (f"image {source}" if isinstance(source, Path) else "the uploaded image")
    what = str(source) if isinstance(source, Path) else label
    if max_pixels is not None:
        allow_pixels(max_pixels)
    try:
        with warnings.catch_warnings():
            # A decompression-bomb warning is not an error here; huge images are allowed.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            # Only the allow-list: Pillow would run Ghostscript for EPS.
            with Image.open(source, formats=DECODE_FORMATS) as img:
                if max_pixels is not None and img.width * img.height > max_pixels:
                    raise SizeLimitError(
                        f"{label} is {img.width}x{img.height} = {img.width * img.height} pixels, "
                        f"over the limit of {max_pixels}"
                    )
                frames = getattr(img, "n_frames", 1)
                if frames > 1:
                    raise InputError(
                        f"{what}: an animated or multi-page image ({frames} frames); gantool reads still "
                        "images only: extract the frames first (e.g. ffmpeg -i in.gif frame%03d.png)"
                    )
                if lossless and _decodes_16bit_colour_as_8bit(img):
                    if _raw_mode(img).startswith("LA"):  # grey + alpha: Pillow decodes it as 8-bit RGBA
                        raise InputError(
                            f"{what}: a 16-bit grey image with an alpha channel, which Pillow decodes as 8-bit; "
                            "the written known pixels would lose precision (drop the alpha channel for 16-bit "
                            "grey, or convert it to 8-bit first)"
                        )
                    raise InputError(
                        f"{what}: a 16-bit colour image, which Pillow decodes as 8-bit; the written known pixels "
                        "would lose precision (convert it to 8-bit colour or 16-bit grey first)"
                    )
                if img.format == "PNG" and img.fp is not None:
                    refuse_short_png(img, label)
                img.load()
                result = ImageOps.exif_transpose(img) if _has_orientation(img) else img.copy()
    except FileNotFoundError:
        raise InputError(f"file not found: {source}") from None
    except Image.DecompressionBombError as e:  # over Pillow's own limit (2x MAX_IMAGE_PIXELS)
        if max_pixels is not None:  # the caller's limit is the one to name
            raise SizeLimitError(f"{label} is over the limit of {max_pixels} pixels") from None
        raise SizeLimitError(
            f"cannot read {label}: {first_line(e)} (Pillow's decompression-bomb limit); "
            "if you trust the file, raise the limit with --max-pixels N (max_pixels= in Python)"
        ) from None
    except UnidentifiedImageError as e:
        if isinstance(source, Path):
            raise InputError(f"cannot read {label}: {first_line(e)}") from None
        # Pillow's message names the file object's repr: say what it means instead.
        raise InputError(f"cannot read {label}: not an image, or not one of {', '.join(DECODE_FORMATS)}") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise InputError(f"cannot read {label}: {first_line(e)}") from None
    if lossless:
        check_lossless(result, what)
    return result


def allow_pixels(count: int) -> None:
    """Let Pillow decode images of up to ``count`` pixels in this process.

    Pillow refuses images over 2 x ``Image.MAX_IMAGE_PIXELS`` (about 358 M pixels) as
    possible decompression bombs. The limit is process-wide and is only ever raised here,
    so a concurrent reader never sees it lowered; gantool's own ``max_pixels`` check in
    :func:`read_image` then applies the caller's limit exactly.
    """
    current = Image.MAX_IMAGE_PIXELS
    if current is not None and count > 2 * current:
        Image.MAX_IMAGE_PIXELS = (count + 1) // 2


def _raw_mode(img: Image.Image) -> str:
    """The decoder's raw mode (``RGB;16B``, ``LA;16B``...), before load(); "" when not known."""
    tile = getattr(img, "tile", None)  # ImageFile only: what the decoder will read, before load()
    if not tile:
        return ""
    args = tile[0].args
    rawmode = args if isinstance(args, str) else (args[0] if isinstance(args, tuple) and args else "")
    return rawmode if isinstance(rawmode, str) else ""


def _decodes_16bit_colour_as_8bit(img: Image.Image) -> bool:
    """A 16-bit RGB(A) or grey+alpha file that this Pillow decodes to 8-bit RGB(A) (seen from the raw mode)."""
    return img.mode in ("RGB", "RGBA") and ";16" in _raw_mode(img)


def check_lossless(img: Image.Image, name: str = "image") -> Image.Image:
    """Refuse images whose known pixels cannot be written back exactly.

    gantool writes 8-bit colour, 8-bit grey or 16-bit grey PNGs. 32-bit float
    images (mode F) and 32-bit integer images (mode I) with values outside
    0..65535 have no such form.
    """
    if img.mode == "F":
        raise InputError(
            f"{name}: a 32-bit float image (mode F) cannot be written back losslessly as PNG; "
            "convert it to 8-bit or 16-bit first"
        )
    if img.mode == "I":
        lo, hi = img.getextrema()
        if lo < 0 or hi > 65535:  # type: ignore[operator]
            raise InputError(
                f"{name}: a 32-bit integer image with values {lo}..{hi}, outside the 16-bit range a PNG "
                "holds; rescale it to 0..65535 first"
            )
    return img


def _has_orientation(img: Image.Image) -> bool:
    try:
        return img.getexif().get(0x0112, 1) != 1
    except Exception:  # malformed EXIF must not make an image unreadable
        return False


def image_to_array(img: Image.Image) -> np.ndarray:
    """Any PIL mode -> float32 H x W x 3 RGB in [0, 1].

    Handles L, LA, P (with or without transparency), RGBA, CMYK, YCbCr and
    16-bit / 32-bit single-channel images (scaled by their full range, not clipped).
    Alpha is dropped here; see :func:`alpha_hole_mask`.
    """
    if _is_high_bit(img):
        arr = np.asarray(img, dtype=np.float32)
        peak = 1.0 if img.mode == "F" else 65535.0
        arr = np.clip(arr / peak, 0.0, 1.0)
        return np.repeat(arr[..., None], 3, axis=2)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode != "RGB":
        img = img.convert("RGB")
    return np.asarray(img, dtype=np.float32) / 255.0


# ------------------------------------------------------------------- tensors / padding


def to_batch(images: list[np.ndarray], masks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of H x W x 3 images and H x W masks (same size) -> NCHW float32 arrays."""
    image = np.ascontiguousarray(np.stack(images).transpose(0, 3, 1, 2), dtype=np.float32)
    mask = np.ascontiguousarray(np.stack(masks)[:, None], dtype=np.float32)
    return image, mask


def padding_for(height: int, width: int, multiple: int = NETWORK_STRIDE) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) padding that makes H and W multiples of ``multiple``."""
    ph, pw = (-height) % multiple, (-width) % multiple
    return ph // 2, ph - ph // 2, pw // 2, pw - pw // 2


def pad_to_multiple(
    image: np.ndarray, mask: np.ndarray, multiple: int = NETWORK_STRIDE
) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]]:
    """Reflect-pad NCHW image and mask so H and W are multiples of ``multiple``.

    Padded mask pixels are known (0): the network sees reflected context there.
    Falls back to edge padding when the image is too small to reflect.
    """
    height, width = image.shape[-2:]
    pad = top, bottom, left, right = padding_for(height, width, multiple)
    if not any(pad):
        return image, mask, pad
    mode = "reflect" if (top < height and bottom < height and left < width and right < width) else "edge"
    spec = ((0, 0), (0, 0), (top, bottom), (left, right))
    return np.pad(image, spec, mode=mode), np.pad(mask, spec, mode="constant"), pad  # type: ignore[call-overload]


def crop_padding(batch: np.ndarray, pad: tuple[int, int, int, int]) -> np.ndarray:
    top, bottom, left, right = pad
    height, width = batch.shape[-2:]
    return batch[..., top : height - bottom, left : width - right]


def composite(image: np.ndarray, result: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Known pixels from ``image``, hole pixels from ``result`` (any matching layout)."""
    return np.where(mask > 0.5, result, image)


def to_uint8(image: np.ndarray) -> np.ndarray:
    """float [0, 1] -> uint8 with rounding (the inverse of /255 for 8-bit inputs)."""
    return np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)


# ------------------------------------------------------------ inference output (gantool inpaint)
#
# The model works on float RGB; the file written keeps the input's family so
# that known pixels can be copied from the decoded input bit for bit:
# 8-bit colour (RGB, RGBA, P, CMYK, ...) -> "RGB", 8-bit grey (L, LA, 1) -> "L",
# 16-bit / 32-bit grey (I;16*, I, F) -> "I;16" (a 16-bit PNG).

_GREY_8BIT_MODES = ("L", "LA", "La", "1")
# ITU-R 601-2 luma, the weights PIL uses for RGB -> L.
LUMA_WEIGHTS = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def output_mode(img: Image.Image) -> str:
    """The PIL mode an inpainted copy of ``img`` is written in: "RGB", "L" or "I;16"."""
    if _is_high_bit(img):
        return "I;16"
    if img.mode in _GREY_8BIT_MODES:
        return "L"
    return "RGB"


def image_to_output_array(img: Image.Image) -> np.ndarray:
    """The decoded pixels in :func:`output_mode`: uint8 H x W x 3, uint8 H x W or uint16 H x W.

    These are the exact values :func:`image_to_array` scales to [0, 1], so known
    pixels can be copied into the output unchanged.
    """
    mode = output_mode(img)
    if mode == "I;16":
        arr = np.asarray(img)
        if img.mode == "F":  # float images are scaled like image_to_array does
            return float_to_output_array(np.repeat(np.asarray(arr, np.float32)[..., None], 3, axis=2), mode)
        return np.clip(arr.astype(np.int64), 0, 65535).astype(np.uint16)
    if mode == "L":
        return np.asarray(img.convert("L"), dtype=np.uint8)
    if img.mode == "RGB":  # the same values, without a float round trip of the whole image
        return np.asarray(img, dtype=np.uint8)
    return to_uint8(image_to_array(img))


def float_to_output_array(image: np.ndarray, mode: str) -> np.ndarray:
    """float H x W x 3 RGB in [0, 1] -> the integer array of ``mode`` (see :func:`output_mode`)."""
    if mode == "RGB":
        return to_uint8(image)
    grey = np.clip(image @ LUMA_WEIGHTS, 0.0, 1.0)
    if mode == "L":
        return np.rint(grey * 255.0).astype(np.uint8)
    if mode == "I;16":
        return np.rint(grey * 65535.0).astype(np.uint16)
    raise ValueError(f"unsupported output mode {mode!r}")


def paste_holes(known: np.ndarray, result: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``known`` everywhere except where ``mask`` (H x W, 1 = hole) is set: there ``result``."""
    hole = mask > 0.5
    if known.ndim == 3:
        hole = hole[..., None]
    return np.where(hole, result, known).astype(known.dtype, copy=False)


def output_array_to_image(arr: np.ndarray, mode: str) -> Image.Image:
    """The integer array from :func:`float_to_output_array` / :func:`paste_holes` as a PIL image."""
    # The dtype and shape pick the mode: uint16 H x W -> I;16, uint8 H x W -> L, H x W x 3 -> RGB.
    dtype = np.uint16 if mode == "I;16" else np.uint8
    img = Image.fromarray(np.ascontiguousarray(arr, dtype=dtype))
    if img.mode != mode:
        raise ValueError(f"array of shape {arr.shape} does not make a {mode} image")
    return img


def resize_array(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize a float H x W x C array to ``size`` = (height, width).

    Antialiased (Lanczos) when shrinking, bicubic when enlarging; float precision
    is kept (each channel is resized as a 32-bit float image) and values are clipped to [0, 1].
    """
    height, width = size
    if image.shape[:2] == (height, width):
        return image.astype(np.float32, copy=True)
    shrinking = height * width < image.shape[0] * image.shape[1]
    resample = Image.Resampling.LANCZOS if shrinking else Image.Resampling.BICUBIC
    channels = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(image[..., c], dtype=np.float32)).resize((width, height), resample)
        )
        for c in range(image.shape[2])
    ]
    return np.clip(np.stack(channels, axis=2), 0.0, 1.0).astype(np.float32)


def resize_mask(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize an H x W hole mask to ``size`` = (height, width), conservatively:
    any output pixel that covers part of a hole is a hole."""
    height, width = size
    if mask.shape == (height, width):
        return (mask > 0.5).astype(np.float32)
    area = Image.fromarray((mask > 0.5).astype(np.float32)).resize((width, height), Image.Resampling.BOX)
    return (np.asarray(area) > 1e-6).astype(np.float32)


# ------------------------------------------------------------------ GLCIC post-processing
#
# Iizuka et al. blend the completed region into its surroundings instead of
# showing the raw network output: the hole is filled by fast marching (Telea
# 2004), then the network's output is Poisson-blended onto that fill (Perez et
# al. 2003), as GLCIC-PyTorch's ``poisson_blend`` does with cv2.inpaint and
# cv2.seamlessClone. It is not part of the exported graph: export and parity
# stay about the network.

# cv2.inpaint's neighbourhood radius for the fast-marching fill: 1, as GLCIC-PyTorch.
# On the held-out images it blended better than 3 or 5 (and Telea costs 4x less than at 3).
BLEND_TELEA_RADIUS = 1
# Context around each hole that the fill and the solve see: more than Telea's
# radius plus the one-pixel dilation, and small, so the cost follows the hole, not the image.
BLEND_MARGIN = 8
# With fewer known pixels than this share of the image, the Poisson solve would be
# anchored to the fast-marching guess rather than to the image: keep the network's output.
BLEND_MIN_KNOWN_FRACTION = 0.01
# The hole is dilated by this many pixels before cloning, so the solve's boundary lies on known pixels.
BLEND_DILATION = 1
# A grey picture stored as RGB: every known pixel's channels within this of each other (JPEG's
# chroma noise of up to 2 levels, plus float rounding). Its blended holes are made grey (poisson_blend).
GREY_TOLERANCE = 2.5 / 255.0
OPENCV_MISSING = (
    "OpenCV is missing (a core dependency: gantool finds the holes, blends and scores with it): "
    "pip install opencv-python-headless"
)
_LOGGED_ONCE: set[str] = set()


def _log_once(message: str) -> None:
    """Warn once per process, not once per image of a large batch."""
    if message not in _LOGGED_ONCE:
        _LOGGED_ONCE.add(message)
        log.warning(message)


def check_blend(blend: str) -> str:
    """``blend`` if it is one of BLEND_MODES and inpainting can run here; else InputError.

    OpenCV is checked for every mode, "none" too: it also finds the holes (crop windows,
    the cost estimate), so a broken install fails before any work, not on every file."""
    check_choice("blend mode", blend, BLEND_MODES)
    import_cv2()
    return blend


def import_cv2() -> Any:
    """OpenCV, imported on first use; InputError (one line) when it is not installed."""
    try:
        import cv2  # heavy import (a large native library): only when blending or evaluating
    except ImportError:
        raise InputError(OPENCV_MISSING) from None
    return cv2


def blend_output(image: np.ndarray, filled: np.ndarray, mask: np.ndarray, blend: str) -> np.ndarray:
    """``filled`` post-processed by ``blend`` (one of BLEND_MODES): float H x W x 3."""
    if check_blend(blend) == "none":
        return filled
    return poisson_blend(image, filled, mask)


def blend_regions(hole: np.ndarray) -> tuple[np.ndarray | None, list[tuple[int, int, int, int]]]:
    """What :func:`poisson_blend` solves for the boolean H x W ``hole``: the labels of the hole's
    8-connected components after a 3 x 3 dilation, and each label's box (x, y, w, h), label 1
    first. Each is solved over its box plus BLEND_MARGIN on every side, so the blend's cost
    follows those areas (:func:`blend_pixels`). ``(None, [])``: nothing to solve (no hole, or
    fewer known pixels than BLEND_MIN_KNOWN_FRACTION: the network's output is kept)."""
    if not hole.any() or 1.0 - hole.mean() < BLEND_MIN_KNOWN_FRACTION:
        return None, []
    cv2 = import_cv2()
    side = 2 * BLEND_DILATION + 1
    dilated = cv2.dilate(hole.astype(np.uint8), np.ones((side, side), np.uint8))
    count, labels, stats, _ = cv2.connectedComponentsWithStats(dilated, connectivity=8)
    return labels, [(int(x), int(y), int(w), int(h)) for x, y, w, h, _ in stats[1:count]]


def blend_pixels(hole: np.ndarray) -> int:
    """Pixels the Poisson blend works on for the boolean H x W ``hole``: every solve's region,
    (h + 2 BLEND_MARGIN) x (w + 2 BLEND_MARGIN) as :func:`poisson_blend` pads it. One huge hole
    counts its whole box; many tiny holes count at least (2 BLEND_MARGIN + 1)^2 each."""
    _, boxes = blend_regions(hole)
    return sum((w + 2 * BLEND_MARGIN) * (h + 2 * BLEND_MARGIN) for _, _, w, h in boxes)


def poisson_blend(image: np.ndarray, filled: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """GLCIC's post-processing of one image: float H x W x 3 RGB in [0, 1].

    ``image``: the input (its hole pixels are ignored); ``filled``: the network's
    output, same shape; ``mask``: H x W, 1 (or > 127 for 8-bit) = hole.

    Each connected hole (8-connected, after a 3 x 3 dilation, so holes two pixels
    apart are one) is blended on its own, inside its bounding box plus
    BLEND_MARGIN: the hole is filled with cv2.inpaint (Telea), then the network's
    output is cloned onto it with cv2.seamlessClone (NORMAL_CLONE) through the
    dilated hole, so the solve's boundary lies on known pixels. One solve per hole
    keeps each solve local: a single mask would solve over the box spanning all
    holes. Where the region meets the image border it is reflect-padded, blended
    and cropped back (seamlessClone cannot take a mask that touches the border).
    OpenCV works in 8 bits, so the blend's correction (blended - output) is
    added to the float output, which keeps 16-bit holes smooth.

    Returns ``image`` outside the hole, unchanged, and the blended fill inside.
    With (almost) no known pixels (< BLEND_MIN_KNOWN_FRACTION) there is nothing
    to blend onto: the hole gets the network's output, and a warning is logged once.
    A grey picture stored as RGB (every known pixel grey) gets grey holes: the
    luma of the blend in all three channels, so no hue is invented where the picture has none.
    """
    if image.shape != filled.shape or image.ndim != 3 or image.shape[2] != 3 or image.shape[:2] != mask.shape[:2]:
        raise InputError(
            f"blend needs H x W x 3 image and output and an H x W mask, got {image.shape}, {filled.shape}, {mask.shape}"
        )
    hole = mask_to_array(mask) > 0.5
    result = np.array(image, dtype=np.float32, copy=True)
    if not hole.any():
        return result
    labels, boxes = blend_regions(hole)
    if labels is None:
        _log_once(
            f"blend: the hole covers more than {1 - BLEND_MIN_KNOWN_FRACTION:.0%} of the image, so there is "
            "nothing to blend onto; such holes get the network's output unblended"
        )
        result[hole] = filled[hole]
        return _grey_holes(image, hole, result)
    cv2 = import_cv2()
    height, width = hole.shape
    hole_u8 = hole.astype(np.uint8)
    m = BLEND_MARGIN
    for label, (x, y, w, h) in enumerate(boxes, start=1):
        top, left, bottom, right = max(0, y - m), max(0, x - m), min(height, y + h + m), min(width, x + w + m)
        rows, cols = slice(top, bottom), slice(left, right)
        # Pad only where the region was clipped by the border: every region is then
        # (h + 2m) x (w + 2m) and the hole sits m pixels inside it.
        pad = (m - (y - top), m - (bottom - y - h), m - (x - left), m - (right - x - w))

        def padded(array: np.ndarray) -> np.ndarray:
            return cv2.copyMakeBorder(array, *pad, cv2.BORDER_REFLECT)

        source = filled[rows, cols].astype(np.float32)
        source_u8 = padded(to_uint8(source))
        # All holes of the region are filled, not only this one: another hole's pixels
        # carry no image, and the fill is the solve's boundary and guidance there.
        base = cv2.inpaint(
            padded(to_uint8(image[rows, cols])),
            padded(hole_u8[rows, cols]) * 255,
            BLEND_TELEA_RADIUS,
            cv2.INPAINT_TELEA,
        )
        own = labels[rows, cols] == label
        clone = padded(own.astype(np.uint8)) * 255
        # seamlessClone ignores the mask's outer ring; without it here too, the centre below
        # would not put the clone back where it came from.
        clone[0, :] = clone[-1, :] = clone[:, 0] = clone[:, -1] = 0
        bx, by, bw, bh = cv2.boundingRect(clone)
        # seamlessClone places the source's box at (cx - bw // 2, cy - bh // 2): this centre,
        # ((xmin + xmax + 1) // 2, (ymin + ymax + 1) // 2), maps it onto itself (no shift).
        centre = (bx + bw // 2, by + bh // 2)
        blended = cv2.seamlessClone(source_u8, base, clone, centre, cv2.NORMAL_CLONE)
        crop = (slice(pad[0], pad[0] + bottom - top), slice(pad[2], pad[2] + right - left))
        correction = (blended[crop].astype(np.float32) - source_u8[crop].astype(np.float32)) / 255.0
        region = result[rows, cols]
        own &= hole[rows, cols]
        region[own] = np.clip(source + correction, 0.0, 1.0)[own]
    return _grey_holes(image, hole, result)


def _grey_holes(image: np.ndarray, hole: np.ndarray, result: np.ndarray) -> np.ndarray:
    """``result`` with its holes made grey (luma) when every known pixel is (GREY_TOLERANCE)."""
    known = image[~hole]
    if known.size and float(np.ptp(known, axis=1).max()) <= GREY_TOLERANCE:
        result[hole] = np.clip(result[hole] @ LUMA_WEIGHTS, 0.0, 1.0)[:, None]
    return result

"""Inpaint one image with a gantool generator.onnx using only onnxruntime, numpy and Pillow.

Usage: python examples/onnxruntime_only.py generator.onnx image.png mask.png out.png [--blend]
(mask: white / > 127 = hole). The model composites inside its graph, so known pixels come back unchanged.
--blend adds GLCIC's post-processing (needs opencv-python-headless): a fast-marching (Telea) fill of the
hole, then Poisson blending of the network's output onto it, as `gantool inpaint --blend poisson` does
(gantool blends each hole separately; this sketch does all holes in one solve).
"""

import sys

import numpy as np
import onnxruntime as ort
from PIL import Image

model_path, image_path, mask_path, out_path = sys.argv[1:5]
image = np.asarray(Image.open(image_path).convert("RGB"), np.float32).transpose(2, 0, 1)[None] / 255.0
mask = (np.asarray(Image.open(mask_path).convert("L")) > 127).astype(np.float32)[None, None]
height, width = image.shape[-2:]
pad_h, pad_w = -height % 4, -width % 4  # H and W must be multiples of 4: reflect-pad, crop back later
spec = ((0, 0), (0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2))
session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
out = session.run(["inpainted"], {"image": np.pad(image, spec, "reflect"), "mask": np.pad(mask, spec)})[0]
out = out[0, :, pad_h // 2 : pad_h // 2 + height, pad_w // 2 : pad_w // 2 + width]
result = np.clip(np.rint(out.transpose(1, 2, 0) * 255), 0, 255).astype(np.uint8)
if "--blend" in sys.argv[5:]:
    import cv2

    m, hole = 8, mask[0, 0] > 0.5  # reflect-pad by m: seamlessClone fails on a mask that touches the border
    pad = lambda a: np.pad(a, ((m, m), (m, m), (0, 0))[: a.ndim], "symmetric")
    holes = pad(hole.astype(np.uint8))
    known = pad(np.rint(image[0].transpose(1, 2, 0) * 255).astype(np.uint8))
    base = cv2.inpaint(known, holes * 255, 1, cv2.INPAINT_TELEA)  # fast marching (Telea) fills the hole
    clone = cv2.dilate(holes, np.ones((3, 3), np.uint8)) * 255  # the solve's boundary on known pixels
    clone[[0, -1], :], clone[:, [0, -1]] = 0, 0  # seamlessClone ignores the outer ring: so must the centre
    x, y, w, h = cv2.boundingRect(clone)  # centre x + w // 2 puts the clone back where it came from
    blended = cv2.seamlessClone(pad(result), base, clone, (x + w // 2, y + h // 2), cv2.NORMAL_CLONE)
    result = np.where(hole[..., None], blended[m:-m, m:-m], result)  # known pixels stay exact
Image.fromarray(result).save(out_path)

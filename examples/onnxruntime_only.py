"""Inpaint one image with a gantool generator.onnx using only onnxruntime, numpy and Pillow.

Usage: python examples/onnxruntime_only.py generator.onnx image.png mask.png out.png
(mask: white / > 127 = hole). The model composites inside its graph, so known pixels come back unchanged.
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
Image.fromarray(np.clip(np.rint(out.transpose(1, 2, 0) * 255), 0, 255).astype(np.uint8)).save(out_path)

"""Enumerations and inference defaults, defined once.

The library validates against these tuples and the command line builds its
``click.Choice`` lists and defaults from them, so adding a value is one edit.
Training defaults live on :class:`gantool.core.config.TrainConfig` (the dataclass
fields), model defaults on :class:`gantool.core.config.ModelConfig`.
"""

from __future__ import annotations

# Where a model runs: ONNX Runtime execution providers, or the torch device.
PROVIDERS = ("auto", "cuda", "tensorrt", "cpu")
# How a model file is run ("auto" picks from the file; see gantool.core.artifacts). In a folder, "auto"
# takes the first with a file, in this order: aoti comes last because its packages are tied to the
# device and torch version they were compiled for (an export folder always holds the eager weights,
# so "auto" takes aoti only for a package given by path). "openvino" runs the same ONNX files as
# "onnx" on OpenVINO's CPU plugin; "auto" takes it instead of ONNX Runtime on the CPU when it is
# installed (ONNX Runtime stays the GPU runtime and the CPU fallback; see gantool.runtime.openvino).
BACKENDS = ("onnx", "openvino", "pt2", "torchscript", "eager", "aoti")
BACKEND_CHOICES = ("auto", *BACKENDS)
# Numerics of the model that runs. "auto": the precision the model's publisher prefers
# (`gantool export --prefer`, default fp32) where this machine and backend can run it, else fp32
# (one line says why); on a GPU, the exported fp16 ONNX model when there is one. fp16 and int8
# are exported ONNX files; bf16 runs the torch backends (eager, pt2) under bf16 autocast with
# channels_last, or OpenVINO with its bf16 hint.
PRECISIONS = ("auto", "fp32", "fp16", "bf16", "int8")
# Backends that can run each explicit non-fp32 precision (a folder with "auto" takes the first with a file).
PRECISION_BACKENDS = {"fp16": ("onnx",), "int8": ("openvino", "onnx"), "bf16": ("openvino", "pt2", "eager")}
# What `gantool export --prefer` may record for `--precision auto` (gantool.core.artifacts.META_PREFER).
PREFER_CHOICES = ("fp32", "bf16", "int8")
DEFAULT_PREFER = "fp32"
# The precisions at which `--backend auto` runs ONNX files on OpenVINO on the CPU (gantool.runtime.choice.
# auto_openvino); at the others, ONNX Runtime. int8 and bf16: OpenVINO was the faster runtime on both development
# CPUs (int8: 1.9x ONNX Runtime int8 on the AVX2-only AMD EPYC, 128 px, under load, 2026-12-01; 2.4-2.6x on the
# Intel Xeon with AMX at 256 and 512 px; bf16: 1.26-1.50x torch bf16 autocast there, 2026-12-04; docs/benchmarks.md).
# Not fp32: 1.00-1.04x ONNX Runtime on the EPYC, 0.96x (256 px) to 1.25x (512 px) on the Xeon.
AUTO_OPENVINO_PRECISIONS = ("int8", "bf16")
# `gantool bench inpaint`'s default paths: a backend, or backend:precision (see gantool.tools.bench_inpaint).
BENCH_INPAINT_PATHS = (
    "eager",
    "eager:bf16",
    "torchscript",
    "pt2",
    "pt2:bf16",
    "aoti",
    "onnx",
    "onnx:int8",
    "openvino",
    "openvino:bf16",
    "openvino:int8",
)
# `gantool export`'s fp32 parity bound (max abs error against eager PyTorch) when --atol is not given;
# widened per case to FP32_ERROR_MULTIPLE times eager fp32's own error against float64 where that is
# larger (export/parity.py): how far another correct fp32 evaluation (oneDNN's or ONNX Runtime's
# summation order) may land. A well-conditioned model stays far below 1e-4; one that amplifies
# rounding (random weights through 17 re-normalising BatchNorms) gets a bound in proportion.
DEFAULT_FP32_ATOL = 1e-4
FP32_ERROR_MULTIPLE = 4.0
# `gantool export --int8`'s quality gate: worst hole PSNR (dB) against the fp32 model over the parity sweep.
DEFAULT_INT8_MIN_PSNR = 35.0
# When int8 misses that gate, at most this share of the convolutions' multiply-adds is left in float
# (the most error-prone convolutions first); beyond it int8 buys little and the export refuses.
INT8_MAX_FLOAT_MACS = 0.5
# Where the model runs on an image (see gantool.inference.inpainter).
STRATEGIES = ("auto", "full", "crop", "resize")
# How a network block orders its BatchNorm and ReLU after each convolution (ModelConfig.block_order):
# gantool's own "conv-bn-relu" (the BN folds into the conv), or GLCIC-PyTorch's "conv-relu-bn".
BLOCK_ORDERS = ("conv-bn-relu", "conv-relu-bn")
# What the generator writes into the holes of its input (ModelConfig.hole_fill, in the graph):
# GLCIC's constant mean pixel, or a push-pull pyramid fill from each hole's surroundings
# (gantool.nn.networks.push_pull_fill).
HOLE_FILLS = ("mean-pixel", "push-pull")
# Training / evaluation hole shapes (see gantool.nn.masks).
MASK_KINDS = ("box", "free", "mixed")
# Post-processing of the network's output (see gantool.core.processing.poisson_blend):
# "poisson" = GLCIC's fast-marching fill of the hole, then Poisson blending of the
# network's output onto it; "none" = the raw network output.
BLEND_MODES = ("poisson", "none")
# Training devices.
DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")

# Inference defaults, shared by the CLI, the Python API and the benchmarks.
DEFAULT_PROVIDER = "auto"
DEFAULT_BACKEND = "auto"
DEFAULT_PRECISION = "auto"
DEFAULT_STRATEGY = "auto"
DEFAULT_INPAINT_BATCH = 4
DEFAULT_BLEND = "poisson"
# ``auto`` switches from ``full`` to ``crop`` when max(H, W) > AUTO_CROP_FACTOR * train size.
AUTO_CROP_FACTOR = 2
# ``crop`` context around each hole, as a fraction of the train size.
CROP_MARGIN_FRACTION = 0.25

# Image formats gantool decodes (Pillow format names), for files and uploads alike: never EPS/PS/PDF
# or anything else that makes Pillow run an external program (EPS runs Ghostscript from PATH).
DECODE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF")

# `gantool serve` defaults (see gantool.serving).
DEFAULT_SERVE_HOST = "127.0.0.1"
DEFAULT_SERVE_PORT = 8000
# Requests that arrive within BATCH_WAIT_MS of the first one run together, up to MAX_BATCH.
# 8: at 8 concurrent clients of 512 px images on a 2-core CPU, batches of up to 8 gave
# 15.2-17.3 images/s against 13.4-15.4 for 4 and 12.1-13.0 for 1 (bench serve).
DEFAULT_SERVE_MAX_BATCH = 8
DEFAULT_SERVE_BATCH_WAIT_MS = 10.0
# Inpaint requests inside the server at once (read, queued or running); more get 503.
DEFAULT_SERVE_MAX_QUEUE = 16
DEFAULT_SERVE_MAX_UPLOAD_MB = 50.0
# 40 MP: a 4000 x 3000 photo (12 MP) fits with room; decoded size is checked before decoding.
DEFAULT_SERVE_MAX_PIXELS = 40_000_000
SERVE_OUTPUT_FORMATS = ("png", "webp")
# Header and body reads: a request must arrive within READ_TIMEOUT s, plus 1 s per
# MIN_UPLOAD_RATE KB of body; slower or silent clients are dropped (408) without holding a slot.
DEFAULT_SERVE_READ_TIMEOUT = 30.0
DEFAULT_SERVE_MIN_UPLOAD_RATE_KB = 32.0
# The request line and headers together (431 above).
DEFAULT_SERVE_MAX_HEADER_KB = 64
# First SIGINT/SIGTERM: in-flight requests get this long to finish; a second signal exits at once.
DEFAULT_SERVE_SHUTDOWN_TIMEOUT = 5.0
# Per request, checked from the hole mask before the model runs (gantool.inference.cost): pixels
# through the model (all windows), hole components (each is one window and one blend), and
# pixels the Poisson blend solves over (each hole's box plus its margin: its time follows that
# area, about 5-10 us per pixel on a loaded 2-core machine, docs/serving.md).
DEFAULT_SERVE_MAX_MODEL_PIXELS = 4_000_000
DEFAULT_SERVE_MAX_HOLES = 500
DEFAULT_MAX_BLEND_PIXELS = 4_000_000  # serve's --max-blend-pixels (413) and inpaint's (a warning there)
# After a model run over at least this many pixels (N x H x W), the server hands the memory it
# needed back to the system (ONNX Runtime's CPU arena shrunk, glibc's heap trimmed); smaller runs
# keep it for reuse. Releasing made runs of the tiny test model about 10% slower (7-13%, 128-2000 px,
# docs/serving.md), so it is kept for runs whose memory is worth giving back. 0: never.
DEFAULT_SERVE_RELEASE_MEMORY_PIXELS = 1_000_000
# ``gantool inpaint --ray``: the run's JSON-lines record, in the output folder unless --manifest says.
RAY_MANIFEST_NAME = "gantool-manifest.jsonl"
# --ray-address: seconds to reach and join the cluster before failing in one line.
DEFAULT_RAY_TIMEOUT_S = 30.0

# `gantool eval`'s comparison grid, written beside the command (never inside --data).
DEFAULT_EVAL_GRID = "eval_grid.png"

# The run folder `gantool train` writes (claimed by gantool.training.runfolder, read by gantool.training.runs).
RUN_FILE = "gantool-run.json"  # created exclusively: marks the folder as one run's
RUN_CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"  # what the training process last said (gantool.training.tracking)
CHECKPOINTS_DIR = "checkpoints"
LAST_CHECKPOINT = "last.pt"
# `gantool import`'s folder: the checkpoint it writes (beside generator.safetensors and the report).
IMPORT_CHECKPOINT = "checkpoint.pt"
IMPORT_REPORT = "import_report.json"
# What `gantool import` reads (see gantool.training.glcic_import).
IMPORT_FORMATS = ("glcic-pytorch",)
IMPORTED_PHASE = "imported"  # an imported checkpoint's phase: it was not trained by gantool
SAMPLES_DIR = "samples"
TENSORBOARD_DIR = "tensorboard"
MLFLOW_RUN_FILE = "mlflow.json"  # the MLflow run a tracked run logs to (gantool.training.tracking_mlflow)
DEFAULT_MLFLOW_EXPERIMENT = "gantool"
RUN_EXPORT_DIR = "export"  # where `gantool export` writes by default

# Multi-process training (gantool.training.distributed): how long a process waits in a collective
# (DDP's gradient all-reduce, the per-step consensus) for the others before the run ends, naming the
# one that stopped answering. Rank 0 checkpoints and validates alone while the others wait in the next
# step's all-reduce, so this must exceed the longest of those pauses (and, with --compile, the
# difference between the ranks' first-step compile times). torch's own default is 30 minutes for gloo.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
MAX_COLLECTIVE_TIMEOUT_S = 86_400.0
# Joining the process group and the set-up before the first step wait at least this long: the
# processes start (import torch, read the data) at different speeds on a loaded machine.
SETUP_COLLECTIVE_TIMEOUT_S = 600.0

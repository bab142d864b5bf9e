"""Model and training configuration: one dataclass each, TOML in and out.

The model config travels inside every checkpoint and exported model, so any
command can rebuild the network (and its pre/post-processing) from one file.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

import tomli_w

from gantool.core.constants import (
    BLOCK_ORDERS,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_MLFLOW_EXPERIMENT,
    HOLE_FILLS,
    MASK_KINDS,
    MAX_COLLECTIVE_TIMEOUT_S,
)
from gantool.core.errors import InputError, first_line

# Two stride-2 convolutions down, two stride-2 transposed convolutions up.
NETWORK_STRIDE = 4


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild the networks and their processing contract."""

    width: int = 64  # generator base width (GLCIC: 64)
    disc_width: int = 64  # discriminator base width (GLCIC: 64)
    disc_fc: int = 1024  # width of each discriminator's fully connected output (GLCIC: 1024)
    size: int = 160  # training image size (global discriminator input)
    local_size: int = 96  # local discriminator crop
    fill: tuple[float, float, float] = (0.5, 0.5, 0.5)  # mean pixel written into holes
    # "mean-pixel": holes get ``fill`` (GLCIC); "push-pull": each hole gets its surroundings'
    # colours, ``fill`` only where an image has no known pixel at all.
    hole_fill: str = HOLE_FILLS[0]
    # The architecture variant. gantool trains conv -> BN -> ReLU without conv biases;
    # GLCIC-PyTorch's models (gantool import) are conv (with bias) -> ReLU -> BN.
    block_order: str = BLOCK_ORDERS[0]
    conv_bias: bool = False
    # Stride-2 convolutions in each discriminator branch; 0: from the input size (num_downsamples).
    # GLCIC-PyTorch fixes them: local 5, global 5 (arc celeba) or 6 (arc places2).
    disc_local_convs: int = 0
    disc_global_convs: int = 0

    @property
    def stride(self) -> int:
        return NETWORK_STRIDE

    def validate(self) -> ModelConfig:
        if self.width < 2 or self.disc_width < 1 or self.disc_fc < 1:
            raise InputError("width, disc_width and disc_fc must be positive (width >= 2)")
        if self.size % NETWORK_STRIDE:
            raise InputError(f"--size must be a multiple of {NETWORK_STRIDE}, got {self.size}")
        if self.local_size < 8:
            raise InputError(f"--local-size must be at least 8, got {self.local_size}")
        if self.size <= self.local_size:
            raise InputError(f"--size ({self.size}) must be larger than --local-size ({self.local_size})")
        if len(self.fill) != 3 or not all(0.0 <= v <= 1.0 for v in self.fill):
            raise InputError("fill must be three values in [0, 1]")
        if self.block_order not in BLOCK_ORDERS:
            raise InputError(f"block_order = {self.block_order!r}: expected one of {', '.join(BLOCK_ORDERS)}")
        if self.hole_fill not in HOLE_FILLS:
            raise InputError(f"hole_fill = {self.hole_fill!r}: expected one of {', '.join(HOLE_FILLS)}")
        for name in ("disc_local_convs", "disc_global_convs"):
            if not 0 <= getattr(self, name) <= 12:
                raise InputError(f"{name} must be 0 (from the size) to 12, got {getattr(self, name)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fill"] = [float(v) for v in self.fill]
        return d

    def architecture(self, imported: bool) -> dict[str, Any]:
        """The architecture variant and processing facts ``gantool info`` shows (``imported``:
        the weights came from ``gantool import``, not from gantool's training)."""
        return {
            "width": self.width,
            "block_order": self.block_order,
            "conv_bias": self.conv_bias,
            "fill": [float(v) for v in self.fill],
            "hole_fill": self.hole_fill,
            "train_size": self.size,
            "local_size": self.local_size,
            "imported": imported,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "fill" in kwargs:
            kwargs["fill"] = tuple(float(v) for v in kwargs["fill"])
        return cls(**kwargs)


@dataclass
class TrainConfig:
    """The resolved training configuration (written to the run's config.toml)."""

    data: str = "synthetic"
    out: str | None = None
    size: int = 160
    local_size: int = 96
    batch_size: int = 16
    width: int = 64
    disc_width: int = 64
    disc_fc: int = 1024
    # GLCIC schedule: reconstruction only, discriminator only, then joint.
    steps_g: int = 90_000
    steps_d: int = 10_000
    steps_joint: int = 400_000
    lr: float = 2e-4
    lr_d: float | None = None  # defaults to lr
    betas: tuple[float, float] = (0.5, 0.999)
    alpha: float = 4e-4
    recon_weight: float = 1.0
    mask: str = "box"
    hole_min: int | None = None  # box side range in pixels; default local_size/2 .. local_size
    hole_max: int | None = None
    # Crop windows of size x [scale_min, scale_max] pixels (log-uniform, capped by the image's
    # shorter side), resized to size; both unset: the crop's shorter side is drawn between size
    # and the image's own (the behaviour before these keys existed, so older runs resume bitwise).
    scale_min: float | None = None
    scale_max: float | None = None
    # Shuffle each training crop's RGB channels at random (and make one in GREY_SHARE grey): a folder
    # of mostly green photographs otherwise teaches the network a green prior, which it paints into
    # the holes of grey or red pictures (a colour cast). Off: the crops as they are (older runs).
    channel_shuffle: bool = False
    # What the generator writes into its input's holes (ModelConfig.hole_fill; one of HOLE_FILLS).
    hole_fill: str = HOLE_FILLS[0]
    seed: int = 0
    device: str = "auto"
    # None ("auto"): bf16 autocast on CUDA and on CPUs with native bf16 (AVX512-BF16, AMX, Arm BF16),
    # off elsewhere; the run's config.toml records what was chosen.
    amp: bool | None = None
    channels_last: bool | None = None  # None: on for CUDA and wherever amp is on
    compile: bool = False
    sync_bn: bool = False
    # Seconds a process waits in a collective for the others (DDP only; see DEFAULT_COLLECTIVE_TIMEOUT_S).
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    workers: int = 2
    log_every: int = 10
    sample_every: int = 500
    checkpoint_every: int = 1000
    keep_checkpoints: bool = True  # also write checkpoints/step_<N>.pt
    val_images: int = 8
    fill: tuple[float, float, float] | None = None  # None: mean pixel of the data
    tensorboard: bool = False  # event files under <run>/tensorboard/ (needs the tensorboard extra)
    # An MLflow tracking URI (True or "": MLflow's own default), None: no MLflow. Resolved to an
    # absolute URI before the run starts (gantool.training.tracking_mlflow), so a resume finds the store.
    mlflow: str | bool | None = None
    mlflow_experiment: str = DEFAULT_MLFLOW_EXPERIMENT
    mlflow_checkpoints: bool = False  # also upload every checkpoint to the MLflow run
    # A new run starting from these weights (a gantool checkpoint, or a `gantool import` folder);
    # the model (architecture, widths, sizes, fill) is the checkpoint's. See gantool.training.init_from.
    init_from: str | None = None

    @property
    def total_steps(self) -> int:
        return self.steps_g + self.steps_d + self.steps_joint

    def model_config(self, fill: tuple[float, float, float] | None = None) -> ModelConfig:
        red, green, blue = (float(v) for v in fill or self.fill or (0.5, 0.5, 0.5))
        return ModelConfig(
            width=self.width,
            disc_width=self.disc_width,
            disc_fc=self.disc_fc,
            size=self.size,
            local_size=self.local_size,
            fill=(red, green, blue),
            hole_fill=self.hole_fill,
        ).validate()

    def validate(self) -> TrainConfig:
        """Check every field's type and range (one-line InputError naming the key)."""
        for f in fields(self):
            check_value(f.name, getattr(self, f.name))
        self.model_config()
        if self.total_steps == 0:
            raise InputError("nothing to train: --steps-g, --steps-d and --steps-joint are all 0")
        if self.mlflow is None and (self.mlflow_checkpoints or self.mlflow_experiment != DEFAULT_MLFLOW_EXPERIMENT):
            given = "mlflow_checkpoints" if self.mlflow_checkpoints else "mlflow_experiment"
            raise InputError(f"{given} (--{given.replace('_', '-')}) needs mlflow (--mlflow [URI])")
        if self.mask not in MASK_KINDS:
            raise InputError(f"mask = {self.mask!r}: expected one of {', '.join(MASK_KINDS)}")
        device = self.device.split(":", 1)
        if device[0] not in ("auto", "cpu", "cuda") or (
            len(device) == 2 and not (device[0] == "cuda" and device[1].isdigit())
        ):
            raise InputError(f"device = {self.device!r}: expected auto, cpu, cuda or cuda:N")
        lo, hi = self.hole_range()
        if not 1 <= lo <= hi <= self.local_size:
            raise InputError(f"hole sizes must satisfy 1 <= hole_min <= hole_max <= local_size, got {lo}..{hi}")
        scales = self.scale_range()
        if scales is not None and scales[0] > scales[1]:
            raise InputError(f"crop scales must satisfy scale_min <= scale_max, got {scales[0]:g}..{scales[1]:g}")
        return self

    def hole_range(self) -> tuple[int, int]:
        lo = self.hole_min if self.hole_min is not None else max(1, self.local_size // 2)
        hi = self.hole_max if self.hole_max is not None else self.local_size
        return lo, hi

    def scale_range(self) -> tuple[float, float] | None:
        """The crop windows' side range as multiples of ``size``; None: the older draw."""
        if self.scale_min is None and self.scale_max is None:
            return None
        lo = self.scale_min if self.scale_min is not None else 1.0
        hi = self.scale_max if self.scale_max is not None else MAX_CROP_SCALE
        return lo, hi

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # TOML has no null: leave unset optionals out.
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from TOML-like values; unknown keys and wrong types are one-line errors."""
        return cls(**check_options(data))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------ checking option values

MAX_CROP_SCALE = 64.0  # a crop 64x the training size is already a whole large photo
MAX_STEPS = 10**9  # any step count or cadence above this is a typo, not a plan
# What each TrainConfig key accepts: kind, then the inclusive range (None: unbounded),
# or for "float>" an exclusive lower bound. Sizes are capped where one image or batch
# would not fit in any accelerator's memory.
FIELD_RULES: dict[str, tuple[str, float | None, float | None]] = {
    "data": ("str", None, None),
    "out": ("str?", None, None),
    "size": ("int", 8, 8192),
    "local_size": ("int", 8, 8192),
    "batch_size": ("int", 1, 65536),
    "width": ("int", 2, 4096),
    "disc_width": ("int", 1, 4096),
    "disc_fc": ("int", 1, 65536),
    "steps_g": ("int", 0, MAX_STEPS),
    "steps_d": ("int", 0, MAX_STEPS),
    "steps_joint": ("int", 0, MAX_STEPS),
    "lr": ("float>", 0, 10),
    "lr_d": ("float>?", 0, 10),
    "betas": ("pair", 0, 1),
    "alpha": ("float", 0, 1e6),
    "recon_weight": ("float", 0, 1e6),
    "mask": ("str", None, None),
    "hole_min": ("int?", 1, 8192),
    "hole_max": ("int?", 1, 8192),
    "scale_min": ("float?", 1, MAX_CROP_SCALE),
    "scale_max": ("float?", 1, MAX_CROP_SCALE),
    "channel_shuffle": ("bool", None, None),
    "hole_fill": ("str", None, None),
    "seed": ("int", 0, 2**32 - 1),
    "device": ("str", None, None),
    "amp": ("bool?", None, None),
    "channels_last": ("bool?", None, None),
    "compile": ("bool", None, None),
    "sync_bn": ("bool", None, None),
    "collective_timeout": ("float>", 0, MAX_COLLECTIVE_TIMEOUT_S),
    "workers": ("int", 0, 256),
    "log_every": ("int", 1, MAX_STEPS),
    "sample_every": ("int", 1, MAX_STEPS),
    "checkpoint_every": ("int", 1, MAX_STEPS),
    "keep_checkpoints": ("bool", None, None),
    "tensorboard": ("bool", None, None),
    "mlflow": ("uri?", None, None),
    "mlflow_experiment": ("name", None, None),
    "mlflow_checkpoints": ("bool", None, None),
    "val_images": ("int", 1, 1024),
    "fill": ("rgb?", 0, 1),
    "init_from": ("str?", None, None),
}
EXPECTED = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "float>": "a number",
    "bool": "true or false",
    "pair": "two numbers",
    "rgb": "three numbers",
    "uri": "a tracking URI with a scheme (sqlite:///runs.db, http://host:5000, file:/folder) or true (MLflow's default)",
    "name": "a non-empty string",
}


def check_options(data: dict[str, Any]) -> dict[str, Any]:
    """Check the names and values of chosen options (TOML keys or CLI values).

    Returns them normalised (ints as floats where numbers belong, lists as
    tuples). Raises a one-line InputError naming the key, the value and what is
    expected; an unknown key is named with the closest valid one.
    """
    checked = {}
    for key, value in data.items():
        if key not in FIELD_RULES:
            close = difflib.get_close_matches(str(key), list(FIELD_RULES), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (valid keys: {', '.join(FIELD_RULES)})"
            raise InputError(f"unknown config key {key!r}{hint}")
        checked[key] = check_value(key, value)
    return checked


def _describe(kind: str, low: float | None, high: float | None) -> str:
    base = kind.rstrip("?")
    text = EXPECTED[base]
    if base == "float>":
        text += f" > {low:g} and <= {high:g}"
    elif base in ("pair", "rgb"):
        text += f" in [{low:g}, {high:g}" + (")" if base == "pair" else "]")
    elif low is not None and high is not None:
        text += f" in {int(low)}..{int(high)}" if base == "int" else f" in [{low:g}, {high:g}]"
    return text + (" (or left out)" if kind.endswith("?") else "")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_tracking_uri(text: str) -> bool:
    """An empty string (the default store) or a URI with a scheme (``sqlite:///x.db``, ``http://...``,
    ``file:/abs``, ``databricks``): a bare word or number is a typo, never silently a folder store."""
    return text == "" or text == "databricks" or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:\S", text) is not None


def check_value(key: str, value: Any) -> Any:
    """One option's value, checked for type and range (see FIELD_RULES)."""
    kind, low, high = FIELD_RULES[key]
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    if value is None and optional:
        return None

    def bad() -> InputError:
        shown = value if not isinstance(value, str) else repr(value)
        return InputError(f"{key} = {shown}: expected {_describe(kind, low, high)}")

    if base == "str":
        if not isinstance(value, str):
            raise bad()
        return value
    if base == "bool":
        if not isinstance(value, bool):
            raise bad()
        return value
    if base == "uri":  # false: off; true or "": the tracking library's default
        if not isinstance(value, (str, bool)) or (isinstance(value, str) and not _is_tracking_uri(value)):
            raise bad()
        return None if value is False else value
    if base == "name":
        if not isinstance(value, str) or not value.strip():
            raise bad()
        return value
    if base == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad()
        if not low <= value <= high:  # type: ignore[operator]
            raise bad()
        return value
    if base in ("float", "float>"):
        if not _is_number(value) or not math.isfinite(value):
            raise bad()
        above_low = value > low if base == "float>" else value >= low
        if not (above_low and value <= high):
            raise bad()
        return float(value)
    # pair (Adam betas, each in [0, 1)) and rgb (a fill colour, each in [0, 1])
    count = 2 if base == "pair" else 3
    if not isinstance(value, (list, tuple)) or len(value) != count or not all(_is_number(v) for v in value):
        raise bad()
    numbers = tuple(float(v) for v in value)
    upper_ok = (lambda v: v < high) if base == "pair" else (lambda v: v <= high)
    if not all(math.isfinite(v) and v >= low and upper_ok(v) for v in numbers):  # type: ignore[operator]
        raise bad()
    return numbers


# `gantool bench train`'s batch: smaller than TrainConfig's so a full-width step stays seconds on a CPU.
BENCH_TRAIN_BATCH = 8


def read_toml(path: str | Path) -> dict[str, Any]:
    """The options in a TOML file: a flat file, or one with a ``[train]`` table."""
    path = Path(path)
    try:
        # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the TOML.
        data = tomllib.loads(path.read_bytes().decode("utf-8-sig"))
    except FileNotFoundError:
        raise InputError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"config file is a folder: {path}") from None
    except UnicodeDecodeError as e:
        raise InputError(f"config file {path} is not UTF-8 text (byte {e.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"config file {path} is not valid TOML: {first_line(e)}") from None
    except OSError as e:
        raise InputError(f"cannot read config file {path}: {e.strerror or e}") from None
    if "train" in data:
        if not isinstance(data["train"], dict):
            raise InputError(f"config file {path}: 'train' must be a table ([train]), got {data['train']!r}")
        others = sorted(set(data) - {"train"})
        if others:
            raise InputError(f"config file {path}: key(s) {', '.join(others)} outside the [train] table")
        data = data["train"]
    return dict(data)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """``gantool train --config``: :func:`read_toml` with every key checked as it is in the file,
    whatever the command line then overrides (a broken file fails the day it is written, not the
    day it is used alone). The values are returned as written; the merged options are checked again."""
    data = read_toml(path)
    try:
        check_options(data)
    except InputError as e:
        raise InputError(f"config file {path}: {e}") from None
    return data


def toml_text(data: dict[str, Any]) -> str:
    return tomli_w.dumps(data)

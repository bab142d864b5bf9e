"""Model and training configuration: one dataclass each, TOML in and out.

The model config travels inside every checkpoint and exported model, so any
command can rebuild the network (and its pre/post-processing) from one file.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

import tomli_w

from gantool.errors import InputError

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

    @property
    def stride(self) -> int:
        return NETWORK_STRIDE

    def validate(self) -> "ModelConfig":
        if self.width < 2 or self.disc_width < 1 or self.disc_fc < 1:
            raise InputError("width, disc_width and disc_fc must be positive (width >= 2)")
        if self.size % NETWORK_STRIDE:
            raise InputError(f"--size must be a multiple of {NETWORK_STRIDE}, got {self.size}")
        if self.local_size < 8:
            raise InputError(f"--local-size must be at least 8, got {self.local_size}")
        if self.size <= self.local_size:
            raise InputError(
                f"--size ({self.size}) must be larger than --local-size ({self.local_size})"
            )
        if len(self.fill) != 3 or not all(0.0 <= v <= 1.0 for v in self.fill):
            raise InputError("fill must be three values in [0, 1]")
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fill"] = [float(v) for v in self.fill]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
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
    seed: int = 0
    device: str = "auto"
    amp: bool | None = None  # None: bf16 autocast on CUDA, off on the CPU
    channels_last: bool | None = None  # None: on for CUDA
    compile: bool = False
    sync_bn: bool = False
    workers: int = 2
    log_every: int = 10
    sample_every: int = 500
    checkpoint_every: int = 1000
    keep_checkpoints: bool = True  # also write checkpoints/step_<N>.pt
    val_images: int = 8
    fill: tuple[float, float, float] | None = None  # None: mean pixel of the data
    tensorboard: bool = False  # event files under <run>/tensorboard/ (needs the tensorboard extra)

    @property
    def total_steps(self) -> int:
        return self.steps_g + self.steps_d + self.steps_joint

    def model_config(self, fill: tuple[float, float, float] | None = None) -> ModelConfig:
        return ModelConfig(
            width=self.width,
            disc_width=self.disc_width,
            disc_fc=self.disc_fc,
            size=self.size,
            local_size=self.local_size,
            fill=tuple(fill or self.fill or (0.5, 0.5, 0.5)),
        ).validate()

    def validate(self) -> "TrainConfig":
        self.model_config()
        for name in ("steps_g", "steps_d", "steps_joint"):
            if getattr(self, name) < 0:
                raise InputError(f"--{name.replace('_', '-')} must be >= 0")
        if self.total_steps == 0:
            raise InputError("nothing to train: --steps-g, --steps-d and --steps-joint are all 0")
        if self.batch_size < 1:
            raise InputError("--batch-size must be at least 1")
        if self.mask not in ("box", "free", "mixed"):
            raise InputError(f"--mask must be box, free or mixed, got {self.mask!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise InputError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        lo, hi = self.hole_range()
        if not 1 <= lo <= hi <= self.local_size:
            raise InputError(
                f"hole sizes must satisfy 1 <= hole_min <= hole_max <= local_size, got {lo}..{hi}"
            )
        for name in ("log_every", "sample_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1")
        if not (self.lr > 0 and (self.lr_d is None or self.lr_d > 0)):
            raise InputError("learning rates must be positive")
        return self

    def hole_range(self) -> tuple[int, int]:
        lo = self.hole_min if self.hole_min is not None else max(1, self.local_size // 2)
        hi = self.hole_max if self.hole_max is not None else self.local_size
        return lo, hi

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # TOML has no null: leave unset optionals out.
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InputError(f"unknown config key(s): {', '.join(unknown)}")
        kwargs = dict(data)
        for key in ("betas", "fill"):
            if key in kwargs and kwargs[key] is not None:
                kwargs[key] = tuple(float(v) for v in kwargs[key])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise InputError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"config file {path} is not valid TOML: {e}") from None
    # Accept either a flat file or one with a [train] table.
    return dict(data.get("train", data))

def toml_text(data: dict[str, Any]) -> str:
    return tomli_w.dumps(data)

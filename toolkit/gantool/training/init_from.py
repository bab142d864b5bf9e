"""``gantool train --init-from``: a NEW run that starts from existing weights.

The weights come from a gantool checkpoint (a run's, or one ``gantool import``
wrote), a folder holding one, or exported ``generator.safetensors`` (generator
only). The run takes the checkpoint's model: architecture variant, widths,
sizes and fill; an explicitly chosen option that disagrees is a one-line error.
Optimizers, step and RNG start fresh (that is what makes it a new run, unlike
``--resume``); the discriminator starts from the checkpoint's when it has one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from gantool.core.config import ModelConfig, TrainConfig
from gantool.core.errors import CheckpointError, InputError, first_line
from gantool.training.checkpoint import load_weights_state, refuse_non_finite_networks, weights_file

# TrainConfig fields that are the model's: taken from the init checkpoint unless chosen (then they must agree).
ADOPTED_KEYS = ("size", "local_size", "width", "disc_width", "disc_fc", "fill", "hole_fill")
# ModelConfig fields TrainConfig does not have: the architecture variant, always the checkpoint's.
VARIANT_KEYS = ("block_order", "conv_bias", "disc_local_convs", "disc_global_convs")


@dataclass
class InitWeights:
    path: Path
    model_config: ModelConfig
    generator: dict[str, Tensor]
    discriminator: dict[str, Tensor] | None

    def load_into(self, generator: nn.Module, discriminator: nn.Module) -> None:
        """Copy the weights into the run's networks (in place: DDP and compiled wrappers see them)."""
        parts = [("generator", generator, self.generator), ("discriminator", discriminator, self.discriminator)]
        for name, module, weights in parts:
            if weights is None:
                continue
            try:
                module.load_state_dict(weights)
            except RuntimeError as e:
                raise CheckpointError(f"--init-from {self.path}: its {name} does not fit ({first_line(e)})") from None


def load_init(path: str | Path) -> InitWeights:
    """Read the weights ``--init-from`` names (one-line errors)."""
    file = weights_file(path, "--init-from")
    state = load_weights_state(file)
    refuse_non_finite_networks(state, f"--init-from {file}")
    discriminator = state.get("discriminator")
    return InitWeights(file, ModelConfig.from_dict(state["model_config"]), state["generator"], discriminator)


def adopt_init_model(cfg: TrainConfig, chosen: dict[str, Any] | None, resuming: bool) -> TrainConfig:
    """``cfg`` with the model options of ``cfg.init_from``'s checkpoint.

    ``chosen``: the options given explicitly (None: all of ``cfg`` counts as chosen).
    """
    if resuming:
        if chosen and chosen.get("init_from"):
            raise InputError("--init-from starts a new run; --resume continues one: use one of them")
        return cfg
    if not cfg.init_from:
        return cfg
    init = load_init(cfg.init_from)
    model = init.model_config
    adopted = {key: getattr(model, key) for key in ADOPTED_KEYS}
    given = chosen if chosen is not None else {key: getattr(cfg, key) for key in ADOPTED_KEYS}
    clashes = [k for k in ADOPTED_KEYS if k in given and given[k] is not None and _differs(given[k], adopted[k])]
    if clashes:
        shown = ", ".join(f"{k} (checkpoint: {_show(adopted[k])})" for k in clashes)
        raise InputError(f"--init-from {cfg.init_from}: {shown} differ from the options given; leave them out")
    # Recorded as the file it read, absolute: a relative folder says nothing from elsewhere, and a
    # run folder's newest checkpoint changes as it trains on.
    return cfg.replace(**adopted, init_from=str(Path(init.path).resolve()))


def _differs(a: Any, b: Any) -> bool:
    if isinstance(b, tuple):
        return tuple(float(v) for v in a) != tuple(float(v) for v in b)
    return bool(a != b)


def _show(value: Any) -> str:
    return ", ".join(f"{v:g}" for v in value) if isinstance(value, tuple) else str(value)


def run_model(
    cfg: TrainConfig, fill: tuple[float, ...], state: dict[str, Any] | None
) -> tuple[ModelConfig, InitWeights | None]:
    """The run's model config, and the weights it starts from (a new ``--init-from`` run only).

    The architecture variant is the resumed checkpoint's (``state``) or the init
    checkpoint's; everything else comes from ``cfg`` (which adopted it).
    """
    model = cfg.model_config(fill)  # type: ignore[arg-type]  # three floats
    init = load_init(cfg.init_from) if state is None and cfg.init_from else None
    source = init.model_config.to_dict() if init is not None else (state or {}).get("model_config")
    if source:
        variant = ModelConfig.from_dict(source)
        model = dataclasses.replace(model, **{k: getattr(variant, k) for k in VARIANT_KEYS}).validate()
    return model, init

"""``gantool import glcic-pytorch``: bring otenim/GLCIC-PyTorch's trained models into gantool.

GLCIC-PyTorch saves ``model_cn`` (and ``model_cd``) as ``torch.save(model.state_dict())``
and its training options, with the mean pixel ``mpv``, as ``config.json``. Its blocks
are conv (with bias) -> ReLU -> BatchNorm, so the import builds gantool's networks
with ``block_order = "conv-relu-bn"`` and ``conv_bias = true``
(:mod:`gantool.nn.networks`) and renames the keys; no weight changes value.

What changes: gantool's generator composites the known pixels inside its forward
(GLCIC-PyTorch returns the raw sigmoid image), and gantool's discriminator returns
the logit where GLCIC-PyTorch's ends in a sigmoid (``sigmoid(gantool) = GLCIC``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gantool import __version__
from gantool.core.artifacts import (
    ARTIFACT,
    META_MODEL_CONFIG,
    META_PRECISION,
    META_PROCESSING,
    META_SOURCE,
    META_TORCH_VERSION,
    META_TRAIN_PHASE,
    META_TRAIN_STEP,
    META_VERSION,
    META_WEIGHTS_SHA256,
)
from gantool.core.config import ModelConfig
from gantool.core.constants import BLOCK_ORDERS, IMPORT_CHECKPOINT, IMPORT_FORMATS, IMPORT_REPORT, IMPORTED_PHASE
from gantool.core.errors import InputError, check_choice, first_line
from gantool.core.fileio import atomic_write_text, ensure_writable_dir
from gantool.core.processing import processing_contract
from gantool.nn.networks import CompletionNetwork, ContextDiscriminator
from gantool.training.checkpoint import load_error_cause, save_checkpoint, save_generator_weights, weights_sha256

GLCIC_ORDER = BLOCK_ORDERS[1]  # conv -> ReLU -> BN
# GLCIC-PyTorch's train.py defaults, used when config.json leaves a size out.
GLCIC_DEFAULT_SIZES = {"cn_input_size": 160, "ld_input_size": 96}
GLCIC_GLOBAL_CONVS = {"celeba": 5, "places2": 6}  # its --arc
BN_PARAMS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
# Without it a BatchNorm still evaluates the same (it only counts training steps); torch < 0.4.1 never wrote it.
OPTIONAL_PARAMS = ("num_batches_tracked",)
DATA_PARALLEL_PREFIX = "module."


@dataclass
class ImportResult:
    out_dir: Path
    files: dict[str, Path]
    model_config: ModelConfig
    discriminator: bool
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------- key maps


def generator_key_map() -> dict[str, str]:
    """GLCIC-PyTorch CompletionNetwork module names -> gantool ``CompletionNetwork`` ones.

    Blocks 1..16 are ``body.<i>`` = (conv, ReLU, BN); ``conv17`` is ``body.16``.
    """
    names = {}
    for i in range(16):
        conv = f"{'deconv' if i + 1 in (13, 15) else 'conv'}{i + 1}"
        names[conv], names[f"bn{i + 1}"] = f"body.{i}.0", f"body.{i}.2"
    names["conv17"] = "body.16"
    return names


def branch_key_map(prefix: str, ours: str, convs: int) -> dict[str, str]:
    """One discriminator branch: ``convK``/``bnK`` then ``linear<convs+1>`` -> gantool's branch."""
    names = {}
    for k in range(convs):
        names[f"{prefix}.conv{k + 1}"] = f"{ours}.features.{3 * k}"
        names[f"{prefix}.bn{k + 1}"] = f"{ours}.features.{3 * k + 2}"
    names[f"{prefix}.linear{convs + 1}"] = f"{ours}.fc"
    return names


def discriminator_key_map(local_convs: int, global_convs: int) -> dict[str, str]:
    return {
        **branch_key_map("model_ld", "local_branch", local_convs),
        **branch_key_map("model_gd", "global_branch", global_convs),
        "linear1": "head",
    }


def expand(modules: dict[str, str], ours: dict[str, Tensor]) -> dict[str, str]:
    """Module map -> parameter map (GLCIC key -> gantool key), in network order."""
    keys = {}
    for theirs, mine in modules.items():
        for key in ours:
            if key.startswith(mine + "."):
                keys[f"{theirs}.{key[len(mine) + 1 :]}"] = key
    return keys


# ------------------------------------------------------------------------- reading


def read_state_dict(path: str | Path, what: str) -> dict[str, Tensor]:
    """A ``torch.save``d state_dict, loaded weights-only, with a ``module.`` prefix stripped."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} not found: {path}")
    if not path.is_file():
        raise InputError(f"{what} is not a file: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many types on foreign bytes
        raise InputError(f"{what} {path} is not a readable torch file ({load_error_cause(e)})") from None
    if isinstance(state, dict) and state.get("format") == "gantool-checkpoint":
        raise InputError(f"{what} {path} is a gantool checkpoint already, not a GLCIC-PyTorch state_dict")
    if not isinstance(state, dict) or not state:
        kind = "an empty dict" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise InputError(f"{what} {path} is not a state_dict (it holds {kind}, not names -> tensors)")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            shown = type(value).__name__
            raise InputError(f"{what} {path} is not a state_dict (key {key!r} holds a {shown}, not a tensor)")
    prefixed = [k.startswith(DATA_PARALLEL_PREFIX) for k in state]
    if any(prefixed):
        if not all(prefixed):
            first = next(k for k, p in zip(state, prefixed) if not p)
            raise InputError(f"{what} {path}: some keys have the '{DATA_PARALLEL_PREFIX}' prefix and {first!r} not")
        state = {k[len(DATA_PARALLEL_PREFIX) :]: v for k, v in state.items()}
    return state


def read_glcic_config(path: str | Path) -> dict[str, Any]:
    """GLCIC-PyTorch's ``config.json``: needs ``mpv`` (three numbers in [0, 1])."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"config.json not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read config.json {path}: {first_line(e)}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({first_line(e)})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a GLCIC-PyTorch config.json (it holds a {type(data).__name__})")
    mpv = data.get("mpv")
    if (
        not isinstance(mpv, list)
        or len(mpv) != 3
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in mpv)
    ):
        raise InputError(f"{path}: 'mpv' must be the mean pixel, three numbers in [0, 1]; got {mpv!r}")
    for key in GLCIC_DEFAULT_SIZES:
        value = data.get(key, GLCIC_DEFAULT_SIZES[key])
        if not isinstance(value, int) or isinstance(value, bool) or value < 8:
            raise InputError(f"{path}: {key!r} must be an image size in pixels, got {value!r}")
    return data


def _shape(t: Tensor | torch.Size) -> str:
    return "(" + ", ".join(str(n) for n in t) + ")" if len(t) else "()"


def map_weights(
    theirs: dict[str, Tensor], ours: dict[str, Tensor], names: dict[str, str], what: str, expected: str
) -> dict[str, Tensor]:
    """Rename ``theirs`` to ``ours``'s keys, checking every key and shape; one line names the first bad key."""
    mapped: dict[str, Tensor] = {}
    for key, mine in names.items():
        if key not in theirs:
            if key.rsplit(".", 1)[-1] in OPTIONAL_PARAMS:
                mapped[mine] = ours[mine].clone()
                continue
            raise InputError(f"{what}: missing key {key!r} ({expected})")
        value, target = theirs[key], ours[mine]
        if value.shape != target.shape:
            raise InputError(
                f"{what}: {key} has shape {_shape(value.shape)}, expected {_shape(target.shape)} ({expected})"
            )
        if target.is_floating_point():
            if not value.is_floating_point():
                raise InputError(f"{what}: {key} holds {value.dtype}, expected floating-point weights")
            if not bool(torch.isfinite(value).all()):
                raise InputError(f"{what}: {key} has non-finite values (NaN or inf)")
        mapped[mine] = value.to(target.dtype).contiguous()
    extra = [k for k in theirs if k not in names]
    if extra:
        raise InputError(f"{what}: unexpected key {extra[0]!r} ({expected})")
    return mapped


# ------------------------------------------------------------------------- the import


def infer_width(state: dict[str, Tensor], key: str, what: str) -> int:
    if key not in state or state[key].dim() < 1:
        first = next(iter(state))
        raise InputError(f"{what}: missing key {key!r} (first key is {first!r}; is this a GLCIC-PyTorch model?)")
    return int(state[key].shape[0])


def count_convs(state: dict[str, Tensor], prefix: str) -> int:
    n = 0
    while f"{prefix}conv{n + 1}.weight" in state:
        n += 1
    return n


def build_model_config(cn: dict[str, Tensor], config: dict[str, Any], cd: dict[str, Tensor] | None) -> ModelConfig:
    """The gantool ModelConfig of a GLCIC-PyTorch model: its widths, sizes, fill and block order."""
    red, green, blue = (float(v) for v in config["mpv"])
    values: dict[str, Any] = dict(
        width=infer_width(cn, "conv1.weight", "model_cn"),
        size=int(config.get("cn_input_size", GLCIC_DEFAULT_SIZES["cn_input_size"])),
        local_size=int(config.get("ld_input_size", GLCIC_DEFAULT_SIZES["ld_input_size"])),
        fill=(red, green, blue),
        block_order=GLCIC_ORDER,
        conv_bias=True,
    )
    arc = config.get("arc")
    if cd is not None:
        values["disc_width"] = infer_width(cd, "model_ld.conv1.weight", "model_cd")
        local_convs = count_convs(cd, "model_ld.")
        values["disc_fc"] = infer_width(cd, f"model_ld.linear{local_convs + 1}.weight", "model_cd")
        global_convs = count_convs(cd, "model_gd.")
        if isinstance(arc, str) and arc in GLCIC_GLOBAL_CONVS and GLCIC_GLOBAL_CONVS[arc] != global_convs:
            raise InputError(
                f"model_cd has {global_convs} global convolutions, but config.json says arc = {arc!r} "
                f"({GLCIC_GLOBAL_CONVS[arc]}); are the two from the same run?"
            )
        values["disc_local_convs"], values["disc_global_convs"] = local_convs, global_convs
    else:
        values["disc_local_convs"] = 5
        values["disc_global_convs"] = GLCIC_GLOBAL_CONVS.get(arc, 5) if isinstance(arc, str) else 5
    try:
        return ModelConfig(**values).validate()
    except InputError as e:
        raise InputError(f"config.json does not describe a model gantool can build: {e}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert_generator(cn: dict[str, Tensor], model_config: ModelConfig) -> CompletionNetwork:
    generator = CompletionNetwork(model_config)
    ours = generator.state_dict()
    expected = f"a GLCIC-PyTorch CompletionNetwork of width {model_config.width}, from its conv1"
    weights = map_weights(cn, ours, expand(generator_key_map(), ours), "model_cn", expected)
    weights["fill"] = ours["fill"]  # the buffer gantool keeps the fill in: config.json's mpv
    generator.load_state_dict(weights)
    return generator.eval()


def convert_discriminator(cd: dict[str, Tensor], model_config: ModelConfig) -> ContextDiscriminator:
    discriminator = ContextDiscriminator(model_config)
    ours = discriminator.state_dict()
    names = expand(discriminator_key_map(model_config.disc_local_convs, model_config.disc_global_convs), ours)
    expected = (
        f"a GLCIC-PyTorch ContextDiscriminator for {model_config.local_size} px crops and "
        f"{model_config.size} px images (config.json ld_input_size, cn_input_size)"
    )
    discriminator.load_state_dict(map_weights(cd, ours, names, "model_cd", expected))
    return discriminator.eval()


def import_glcic_pytorch(
    model_cn: str | Path,
    config_json: str | Path,
    out_dir: str | Path,
    discriminator: str | Path | None = None,
    overwrite: bool = False,
) -> ImportResult:
    """Convert GLCIC-PyTorch's ``model_cn`` (+ ``config.json``, optionally ``model_cd``) into
    ``out_dir``: a gantool checkpoint, ``generator.safetensors`` and an import report.

    Everything is read and checked before anything is written; an existing file
    in ``out_dir`` is replaced only with ``overwrite``.
    """
    model_cn, config_json = Path(model_cn), Path(config_json)
    cn = read_state_dict(model_cn, "model_cn")
    config = read_glcic_config(config_json)
    cd = read_state_dict(discriminator, "model_cd") if discriminator is not None else None
    model_config = build_model_config(cn, config, cd)
    generator = convert_generator(cn, model_config)
    disc = convert_discriminator(cd, model_config) if cd is not None else None

    out_dir = Path(out_dir)
    targets = {
        "checkpoint": out_dir / IMPORT_CHECKPOINT,
        "safetensors": out_dir / ARTIFACT["safetensors"].filename,
        "report": out_dir / IMPORT_REPORT,
    }
    existing = [str(p) for p in targets.values() if p.exists()]
    if existing and not overwrite:
        raise InputError(f"refusing to overwrite {', '.join(existing)} (use --overwrite)")
    ensure_writable_dir(out_dir)

    sources = {"model_cn": model_cn, "config_json": config_json}
    if discriminator is not None:
        sources["model_cd"] = Path(discriminator)
    imported_from = {
        "format": IMPORT_FORMATS[0],
        "files": {k: {"file": p.name, "sha256": _sha256(p)} for k, p in sources.items()},
        "config_json": {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool, list))},
    }
    generator_state = generator.state_dict()
    state: dict[str, Any] = {
        "model_config": model_config.to_dict(),
        "generator": generator_state,
        "step": 0,
        "phase": IMPORTED_PHASE,
        "imported_from": imported_from,
    }
    if disc is not None:
        state["discriminator"] = disc.state_dict()
    metadata = {
        META_VERSION: __version__,
        META_MODEL_CONFIG: json.dumps(model_config.to_dict()),
        META_PROCESSING: json.dumps(processing_contract(model_config)),
        META_TRAIN_STEP: "0",
        META_TRAIN_PHASE: IMPORTED_PHASE,
        META_WEIGHTS_SHA256: weights_sha256(generator_state),
        META_PRECISION: "fp32",
        META_SOURCE: model_cn.name,
        META_TORCH_VERSION: torch.__version__,
    }
    notes = import_notes(model_config, disc is not None)
    save_checkpoint(targets["checkpoint"], state)
    save_generator_weights(targets["safetensors"], generator, metadata)
    report = {
        "imported_from": imported_from,
        "model_config": model_config.to_dict(),
        "parameters": {
            "generator": sum(p.numel() for p in generator.parameters()),
            **({"discriminator": sum(p.numel() for p in disc.parameters())} if disc is not None else {}),
        },
        "weights_sha256": metadata[META_WEIGHTS_SHA256],
        "notes": notes,
    }
    atomic_write_text(targets["report"], json.dumps(report, indent=2, allow_nan=False) + "\n")
    return ImportResult(out_dir, targets, model_config, disc is not None, notes)


def import_notes(model_config: ModelConfig, with_discriminator: bool) -> list[str]:
    """What the import kept and what gantool does differently (shown by the CLI, kept in the report)."""
    fill = ", ".join(f"{v:.4f}" for v in model_config.fill)
    notes = [
        f"kept: every weight and BatchNorm statistic unchanged; block order {model_config.block_order} with "
        f"conv biases; width {model_config.width}; fill (mpv) {fill}; training size {model_config.size} px, "
        f"local crop {model_config.local_size} px",
        "changed: gantool composites the known pixels onto the network's output "
        "(GLCIC-PyTorch returns the raw sigmoid image); gantool inpaint blends with its own "
        "--blend poisson (Telea fill, then seamlessClone) or --blend none",
    ]
    if with_discriminator:
        notes.append(
            "discriminator: gantool's returns the logit (its losses use BCE with logits); "
            "GLCIC-PyTorch's sigmoid output is sigmoid(gantool's)"
        )
    if model_config.width != 64:
        notes.append(f"width {model_config.width}: not GLCIC-PyTorch's fixed 64 (a model of another width)")
    return notes


def check_import_format(name: str) -> str:
    return check_choice("import format", name, IMPORT_FORMATS)

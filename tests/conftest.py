"""Shared test fixtures: tiny model configs, generators and checkpoints, and a
subprocess environment that can import gantool from the source tree.

Everything is CPU-sized (width 4, 32 px images) so tests stay quick on 2 cores.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

# The suite and its subprocesses run as from a terminal, with SIGINT at its default, before gantool
# is imported: started in the background (`nohup pytest &`, `cmd &` in a script) the suite would
# pass SIGINT on ignored, and gantool, Ray's CLI and Python itself leave an ignored SIGINT ignored,
# so the tests' own Ctrl-C would reach nothing.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from gantool.core.config import ModelConfig
from gantool.nn.networks import CompletionNetwork
from gantool.training.checkpoint import save_checkpoint
from tiny import TINY_CONFIG

REPO_ROOT = Path(__file__).resolve().parents[1]
TOOLKIT = REPO_ROOT / "toolkit"



def random_generator(config: ModelConfig = TINY_CONFIG, seed: int = 0) -> CompletionNetwork:
    """Fresh random weights; BatchNorm statistics still at their defaults."""
    torch.manual_seed(seed)
    return CompletionNetwork(config).eval()


def briefly_trained_generator(config: ModelConfig = TINY_CONFIG, seed: int = 0, steps: int = 4) -> CompletionNetwork:
    """A few optimizer steps and train-mode passes on random data, so weights and
    BatchNorm running statistics are far from their initial values."""
    generator = random_generator(config, seed)
    optimizer = torch.optim.Adam(generator.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    size = config.size
    generator.train()
    for _ in range(steps):
        image = torch.rand(4, 3, size, size, generator=gen) * 0.6 + 0.3
        mask = torch.zeros(4, 1, size, size)
        mask[..., size // 4 : size // 2 + 4, size // 3 : size // 2 + 6] = 1.0
        loss = ((generator(image, mask) - image) ** 2 * mask).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return generator.eval()


def write_checkpoint(path: Path, generator: CompletionNetwork, step: int = 0, phase: str = "g", **extra) -> Path:
    state = {"model_config": generator.config.to_dict(), "generator": generator.state_dict(), "step": step, "phase": phase}
    state.update(extra)
    return save_checkpoint(path, state)


@pytest.fixture
def tiny_config() -> ModelConfig:
    return TINY_CONFIG


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``checkpoint_factory(kind="random"|"trained", seed=0, **extra) -> Path``,
    a checkpoint of a tiny generator in a fresh runs/<name>/checkpoints/ folder."""

    def make(kind: str = "random", seed: int = 0, **extra) -> Path:
        build = {"random": random_generator, "trained": briefly_trained_generator}[kind]
        run = tmp_path_factory.mktemp(f"run_{kind}")
        return write_checkpoint(run / "checkpoints" / "last.pt", build(TINY_CONFIG, seed), **extra)

    return make


def rehashed(meta: dict[str, str], tensors: dict) -> dict[str, str]:
    """``meta`` recording the hash of ``tensors`` (numpy or torch), as an export of those weights would:
    a planted file that is consistent, so the check under test (not the hash check) speaks."""
    import numpy as np

    from gantool.training.checkpoint import weights_sha256

    as_torch = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}
    return {**meta, "gantool.weights_sha256": weights_sha256(as_torch)}


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_up() -> Iterator[None]:
    """A module that leaves Ray up in the test process fails here, and Ray is shut down: a Ray left up
    is what a later in-process command joins (``start_ray`` keeps a process's own cluster), which
    once kept CI serving until its time limit."""
    before = {k: v for k, v in os.environ.items() if _set_by_ray(k)}
    yield
    # ray.init sets RAY_AUTH_MODE=token (and more) in this process's environment and leaves it there:
    # a later module's in-process cluster then wanted tokens its subprocesses did not send.
    for key in [k for k in os.environ if _set_by_ray(k) and k not in before]:
        del os.environ[key]
    os.environ.update(before)
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        ray.shutdown()
        pytest.fail("this module left Ray initialized in the test process", pytrace=False)


def _set_by_ray(key: str) -> bool:
    return key.startswith("RAY_") or key == "PYTHONBREAKPOINT"


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for ``[sys.executable, "-m", "gantool", ...]`` from the source tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TOOLKIT), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="session")
def modern_export(checkpoint_factory: Callable[..., Path]):
    """One verified export of a tiny trained generator to the formats of today but AOTInductor
    (ONNX fp32 + int8, generator.pt2), made once per test session."""
    from gantool.export.exporter import export_generator  # delayed: the session may not need it

    checkpoint = checkpoint_factory("trained", seed=11, step=5, phase="joint")
    return export_generator(checkpoint, checkpoint.parent.parent / "export", formats=["onnx", "pt2"], int8=True)


@pytest.fixture(scope="session")
def aoti_export(checkpoint_factory: Callable[..., Path]):
    """The same checkpoint verified in every format of today, generator.aoti.pt2 compiled for the CPU
    among them, made once per session. Only slow tests use it: the AOTInductor compile alone takes
    about a minute on 2 cores (the fast tier checks what it can on a stand-in package)."""
    from gantool.export.exporter import export_generator  # delayed: the session may not need it

    checkpoint = checkpoint_factory("trained", seed=11, step=5, phase="joint")
    return export_generator(
        checkpoint, checkpoint.parent.parent / "export", formats=["onnx", "aoti"], int8=True, aoti_device="cpu"
    )

"""Mixed precision (``--amp``: bf16 autocast) and ``--compile`` (torch.compile).

bf16 autocast runs on this CPU (it has AVX512-BF16), so the training run and the
GAN loop's isolation properties are checked under autocast here; the CUDA
versions skip without a GPU. torch.compile is checked on the CPU when dynamo and
a C++ compiler (inductor's CPU backend) are there.
"""

from __future__ import annotations

import copy
import math
import platform
import shutil
from pathlib import Path

import pytest
import torch

from gantool.core.cpu import onednn_bf16_capped
from gantool.nn.losses import discriminator_loss
from gantool.nn.networks import crop_local
from gantool.training.checkpoint import load_checkpoint
from gantool.training.loop import amp_supported, autocast_for, cpu_has_native_bf16, generator_step, train, train_step
from tiny import build_optimizers, params, same, tiny_batch, tiny_networks, tiny_train_config

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")


def cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return {word for line in text.splitlines() if line.startswith("flags") for word in line.split(":", 1)[1].split()}


def compile_unusable_reason() -> str | None:
    if not torch._dynamo.is_dynamo_supported():
        return "torch._dynamo is not supported on this Python/platform"
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "no C++ compiler: inductor's CPU backend needs one"
    return None


def train_losses(history: list[dict]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k.startswith("loss_")} for r in history if "images_per_s" in r]


# ------------------------------------------------------------------- bf16 detection


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or cpu_flags() is None,
                    reason="reads x86 CPU flags from /proc/cpuinfo")
def test_cpu_bf16_detection_matches_the_cpu_flags():
    flags = cpu_flags()
    native = bool(flags & {"avx512_bf16", "amx_bf16"}) and not onednn_bf16_capped()  # CI's AVX2 rerun caps it
    assert amp_supported(CPU) == native
    assert cpu_has_native_bf16() == native


def test_onednn_capped_below_bf16_is_an_older_cpu(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 (CI's rerun on the kernels of an older CPU) on a CPU with AMX: OpenVINO
    still lists BF16 but cannot compile a bf16 model ("could not create a primitive descriptor for the
    deconvolution"), and torch's bf16 convolutions run emulated. Neither may count as native then."""
    from gantool.runtime import openvino

    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    hardware = cpu_has_native_bf16(), openvino.openvino_available() and openvino.bf16_native()
    for name, value in (("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ONEDNN_MAX_CPU_ISA", "avx512_core_vnni"),
                        ("DNNL_MAX_CPU_ISA", "AVX2")):  # fmt: skip
        monkeypatch.setenv(name, value)
        assert onednn_bf16_capped() and not cpu_has_native_bf16() and not amp_supported(CPU), (name, value)
        assert not (openvino.openvino_available() and openvino.bf16_native())
        monkeypatch.delenv(name)
    for value in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", ""):  # at or above bf16: the hardware decides
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", value)
        assert not onednn_bf16_capped(), value
        assert (cpu_has_native_bf16(), openvino.openvino_available() and openvino.bf16_native()) == hardware
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert not onednn_bf16_capped()  # oneDNN reads ONEDNN_ first


def test_avx512_without_bf16_is_not_native_bf16(monkeypatch, tmp_path):
    """torch's get_cpu_capability() says "AVX512" on such CPUs too; that must not count."""
    fake_cpuinfo = tmp_path / "cpuinfo"
    fake_cpuinfo.write_text("flags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni\n")
    import gantool.training.build as build_module  # where the CPU probe lives since the loop's split

    monkeypatch.setattr(build_module, "CPUINFO", fake_cpuinfo)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # CI's AVX2 rerun caps oneDNN below bf16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert not cpu_has_native_bf16()
    fake_cpuinfo.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert cpu_has_native_bf16()
    fake_cpuinfo.unlink()
    assert not cpu_has_native_bf16()  # unreadable: not claimed
    assert not amp_supported(torch.device("meta"))


# ------------------------------------------------------------ bf16 autocast on the CPU


def test_autocast_really_runs_both_networks_in_bf16():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    seen: dict[str, torch.dtype] = {}
    nets.generator.body[0][0].register_forward_hook(lambda m, i, o: seen.__setitem__("generator", o.dtype))
    nets.discriminator.global_branch.features[0].register_forward_hook(
        lambda m, i, o: seen.__setitem__("discriminator", o.dtype))
    opt_g, opt_d = build_optimizers(nets, cfg)
    losses = train_step("joint", nets, opt_g, opt_d, tiny_batch(cfg), cfg, autocast_for(CPU, True))
    assert seen == {"generator": torch.bfloat16, "discriminator": torch.bfloat16}
    assert all(v.dtype == torch.float32 and math.isfinite(float(v)) for v in losses.values())  # losses in fp32
    assert all(p.dtype == torch.float32 for p in nets.generator.parameters())  # fp32 master weights


def test_discriminator_step_under_autocast_leaves_the_generator_alone():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    g_before, d_before = params(nets.generator), params(nets.discriminator)
    train_step("d", nets, opt_g, opt_d, tiny_batch(cfg), cfg, autocast_for(CPU, True))
    assert same(params(nets.generator), g_before)
    assert not same(params(nets.discriminator), d_before)
    assert all(p.grad is None for p in nets.generator.parameters())


def test_generator_step_under_autocast_leaves_the_discriminator_alone():
    cfg = tiny_train_config(recon_weight=0.0, alpha=1.0)  # the adversarial loss alone must reach G
    nets = tiny_networks(cfg=cfg)
    opt_g, _ = build_optimizers(nets, cfg)
    real, mask, corners = tiny_batch(cfg)
    g_before, d_before = params(nets.generator), params(nets.discriminator)
    autocast = autocast_for(CPU, True)
    with autocast:
        fake = nets.generator(real, mask)
    generator_step(nets, opt_g, real, fake, mask, corners, cfg, autocast, adversarial=True)
    assert same(params(nets.discriminator), d_before)
    assert all(p.grad is None for p in nets.discriminator.parameters()), "G's loss leaked into D's grads"
    assert all(p.requires_grad for p in nets.discriminator.parameters())
    assert sum(float(p.grad.abs().sum()) for p in nets.generator.parameters()) > 0
    assert not same(params(nets.generator), g_before)


def test_joint_step_under_autocast_updates_d_from_its_own_loss_only():
    cfg = tiny_train_config(alpha=1.0)
    nets = tiny_networks(cfg=cfg)
    opt_g, opt_d = build_optimizers(nets, cfg)
    autocast = autocast_for(CPU, True)
    train_step("joint", nets, opt_g, opt_d, tiny_batch(cfg), cfg, autocast)  # non-trivial Adam state
    reference_d = copy.deepcopy(nets.discriminator)
    reference_opt = torch.optim.Adam(reference_d.parameters(), lr=cfg.lr, betas=cfg.betas)
    reference_opt.load_state_dict(copy.deepcopy(opt_d.state_dict()))
    generator_before = copy.deepcopy(nets.generator)

    batch = tiny_batch(cfg, step=1)
    train_step("joint", nets, opt_g, opt_d, batch, cfg, autocast)

    real, mask, corners = batch
    with torch.no_grad(), autocast:
        fake = generator_before(real, mask).float()
    reference_opt.zero_grad()
    with autocast:
        real_logits = reference_d(crop_local(real, corners, cfg.local_size), real)
        fake_logits = reference_d(crop_local(fake, corners, cfg.local_size), fake)
    discriminator_loss(real_logits.float(), fake_logits.float(), cfg.alpha).backward()
    reference_opt.step()
    for ours, ref in zip(nets.discriminator.parameters(), reference_d.parameters()):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_amp_training_run_on_the_cpu_has_finite_losses(tmp_path):
    cfg = tiny_train_config(out=str(tmp_path / "run"), amp=True, steps_g=1, steps_d=1, steps_joint=2,
                            sample_every=100, checkpoint_every=100)
    result = train(cfg, progress=False)
    losses = train_losses(result.history)
    assert [sorted(r) for r in losses] == [["loss_rec"], ["loss_d"], ["loss_adv", "loss_d", "loss_rec"],
                                           ["loss_adv", "loss_d", "loss_rec"]]
    assert all(math.isfinite(v) for r in losses for v in r.values())
    state = load_checkpoint(result.last_checkpoint)
    assert state["train_config"]["amp"] is True
    assert all(t.dtype != torch.bfloat16 for t in state["generator"].values())  # saved in fp32


# --------------------------------------------------------------------- torch.compile


@pytest.mark.slow  # inductor compiles the tiny networks in ~60 s on 2 shared cores (~15 s with a warm cache)
@pytest.mark.skipif(compile_unusable_reason() is not None, reason=str(compile_unusable_reason()))
@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")  # raised inside torch while compiling
def test_compiled_training_matches_eager_on_the_cpu(tmp_path):
    """Two joint steps (compiled G forward+backward, compiled D pair) vs eager.

    Inductor fuses and reorders float32 arithmetic, so the results agree to
    rounding (seen: losses within 1e-5 relative), not bit for bit.
    """
    # amp off: in float32 on every CPU (amp's default is bf16 where the CPU has it natively)
    common = dict(steps_g=0, steps_d=0, steps_joint=2, sample_every=100, checkpoint_every=100, amp=False)
    eager = train(tiny_train_config(out=str(tmp_path / "eager"), **common), progress=False)
    compiled = train(tiny_train_config(out=str(tmp_path / "compiled"), compile=True, **common), progress=False)
    for ours, ref in zip(train_losses(compiled.history), train_losses(eager.history), strict=True):
        assert ours.keys() == ref.keys()
        for key in ours:
            assert ours[key] == pytest.approx(ref[key], rel=1e-3), key  # losses are far from 0: relative only
    ours, ref = load_checkpoint(compiled.last_checkpoint), load_checkpoint(eager.last_checkpoint)
    assert ours["generator"].keys() == ref["generator"].keys()  # the raw module's names, no "_orig_mod."
    for name in ("generator", "discriminator"):
        for key, tensor in ref[name].items():
            torch.testing.assert_close(ours[name][key], tensor, rtol=1e-3, atol=1e-5)


# ------------------------------------------------------------------------------ CUDA


@pytest.mark.cuda
@needs_cuda
def test_cuda_bf16_autocast_trains_both_networks(tmp_path):
    cfg = tiny_train_config(out=str(tmp_path / "run"), device="cuda", steps_g=1, steps_d=1, steps_joint=2,
                            sample_every=4, checkpoint_every=4)
    result = train(cfg, progress=False)  # amp and channels_last default to on for CUDA
    losses = train_losses(result.history)
    assert len(losses) == 4 and all(math.isfinite(v) for r in losses for v in r.values())
    assert amp_supported(torch.device("cuda"))
    state = load_checkpoint(result.last_checkpoint)
    assert all(t.device.type == "cpu" for t in state["generator"].values())


@pytest.mark.cuda
@needs_cuda
def test_cuda_autocast_runs_in_bf16_and_keeps_isolation():
    cfg = tiny_train_config()
    nets = tiny_networks(cfg=cfg)
    nets.generator.cuda()
    nets.discriminator.cuda()
    seen: dict[str, torch.dtype] = {}
    nets.generator.body[0][0].register_forward_hook(lambda m, i, o: seen.__setitem__("generator", o.dtype))
    opt_g, opt_d = build_optimizers(nets, cfg)
    batch = tuple(t.cuda() for t in tiny_batch(cfg))
    g_before = params(nets.generator)
    train_step("d", nets, opt_g, opt_d, batch, cfg, autocast_for(torch.device("cuda"), True))
    assert seen["generator"] == torch.bfloat16
    assert same(params(nets.generator), g_before)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(compile_unusable_reason() is not None, reason=str(compile_unusable_reason()))
@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_cuda_compiled_training_matches_eager(tmp_path):
    common = dict(device="cuda", amp=False, steps_g=0, steps_d=0, steps_joint=2, sample_every=100, checkpoint_every=100)
    eager = train(tiny_train_config(out=str(tmp_path / "eager"), **common), progress=False)
    compiled = train(tiny_train_config(out=str(tmp_path / "compiled"), compile=True, **common), progress=False)
    for ours, ref in zip(train_losses(compiled.history), train_losses(eager.history), strict=True):
        for key in ours:
            assert ours[key] == pytest.approx(ref[key], rel=1e-3, abs=1e-6), key


# ------------------------------------------------------------------------------ --amp auto


def test_amp_auto_follows_native_bf16_and_the_run_config_records_the_choice(tmp_path):
    from gantool.core.config import read_toml
    from gantool.training.loop import use_amp, use_channels_last

    native = amp_supported(CPU)
    auto = tiny_train_config()
    assert auto.amp is None and auto.channels_last is None  # the default is "auto"
    assert use_amp(auto, CPU) is native and use_channels_last(auto, CPU) is native
    forced = tiny_train_config(amp=True)
    assert use_amp(forced, CPU) and use_channels_last(forced, CPU)  # bf16 autocast comes with channels_last
    assert not use_amp(tiny_train_config(amp=False), CPU)
    assert not use_channels_last(tiny_train_config(amp=True, channels_last=False), CPU)  # explicit wins
    result = train(tiny_train_config(out=str(tmp_path / "run"), steps_g=1, steps_d=0, steps_joint=0,
                                     sample_every=100, checkpoint_every=100), progress=False)  # fmt: skip
    recorded = read_toml(result.run_dir / "config.toml")
    assert recorded["amp"] is native and recorded["channels_last"] is native  # what auto chose, not "auto"

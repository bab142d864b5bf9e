"""Training under torchrun: 2 CPU processes (gloo) running the real ``gantool train``.

How gradient averaging is proven: each rank normalizes with its own batch's
BatchNorm statistics (SyncBatchNorm refuses CPU tensors in torch 2.13, see
``test_sync_bn_guard_agrees_with_torch``), so a 2 x 2 run is not the 1 x 4 run.
The reference is therefore the same global batch processed in ONE process as the
same two per-rank halves: each half gets its own forward pass (its own BN
statistics) and backs half of its loss, so the accumulated gradient is the mean
of the per-half gradients, which is what DDP must produce. The 2-process
checkpoint must match that reference in the weights AND in Adam's moments
(``exp_avg`` / ``exp_avg_sq``): Adam's update is invariant to the gradient's
scale, so only the moments would reveal a sum where a mean belongs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gantool.core.config import ModelConfig, TrainConfig
from gantool.core.errors import InputError
from gantool.nn.losses import discriminator_loss, generator_adversarial_loss, hole_mse
from gantool.nn.networks import crop_local
from gantool.training.checkpoint import generator_from_checkpoint, load_checkpoint
from gantool.training.data import InpaintingDataset, StepBatchSampler, SyntheticSource
from gantool.training.distributed import (
    DistributedContext,
    rank_seed,
    seed_rank,
    setup_distributed,
    sync_batchnorm_supported,
)
from gantool.training.loop import build_networks, build_optimizers, phase_at, set_requires_grad, train
from tiny import TINY_MODEL, TINY_MODEL_ARGS, tiny_train_config

WORLD = 2
GLOBAL_BATCH = 4
TINY_ARGS = [*TINY_MODEL_ARGS, "--batch-size", str(GLOBAL_BATCH), "--workers", "0", "--log-every", "1",
             "--quiet", "--no-amp"]  # float32: the references below are; amp's default is bf16 on CPUs that have it
# float32 sums in a different order (gloo's all-reduce of pre-divided gradients
# vs autograd accumulating two half losses; the workers run 1 OpenMP thread,
# this process more) differ in the last bits. Seen after 4 and 6 steps:
# parameters within 2e-7, Adam moments within 4e-5 of each tensor's largest
# value. Unaveraged gradients (the control) are off by 1e-3 and by 3x-9x; a sum
# instead of a mean would put the moments off by 1x (exp_avg) and 3x (exp_avg_sq).
PARAM_ATOL = 1e-5
MOMENT_RTOL = 1e-3  # of the tensor's largest magnitude (element-wise is meaningless near 0)
TIMEOUT_S = 240


def launch(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """``python -m torch.distributed.run --standalone --nproc-per-node 2 -m gantool train ...``.

    --standalone rendezvouses on a free local port, so parallel runs never clash.
    """
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
               "-m", "gantool", "train", *args]
    return subprocess.Popen(command, cwd=cwd, env=dict(env, OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> str:
    """Wait for torchrun; on a timeout (a hang) kill it AND its workers, which
    torchrun starts in their own sessions, so none outlives the test."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        for rank in range(WORLD):
            if (pid := worker_pid(proc.pid, rank)) is not None:
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        output = proc.communicate()[0]
        pytest.fail(f"torchrun did not finish within {timeout} s:\n{output[-3000:]}")


def run_to_end(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = launch(args, cwd, env)
    output = finish(proc)
    assert proc.returncode == 0, output[-3000:]
    return output


def worker_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of torchrun's worker with ``RANK=rank`` (Linux /proc), if running."""
    try:
        children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(child)
    return None


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> SimpleNamespace:
    """A 2-process run of 4 steps (default run folder), then a 2-process resume to 6."""
    cwd = tmp_path_factory.mktemp("ddp_cwd")
    first = run_to_end([*TINY_ARGS, "--steps-g", "2", "--steps-d", "1", "--steps-joint", "1",
                        "--sample-every", "4", "--checkpoint-every", "2"], cwd, subprocess_env)
    runs = list((cwd / "runs").iterdir())
    assert len(runs) == 1, f"one run folder expected (rank 0's timestamp on every rank), got {runs}"
    run_dir = runs[0]
    metrics_after_first = read_metrics(run_dir / "metrics.jsonl")
    second = run_to_end(["--resume", str(run_dir / "checkpoints" / "last.pt"), "--steps-joint", "3", "--quiet"],
                        cwd, subprocess_env)
    return SimpleNamespace(cwd=cwd, run_dir=run_dir, first=first, second=second,
                           metrics_after_first=metrics_after_first)


# ------------------------------------------------------------------ the reference


def reference_training(
    checkpoint: dict, steps: int, ranks: tuple[int, ...] = (0, 1), source=None, items: int | None = None
) -> SimpleNamespace:
    """Train ``steps`` steps in this process on the shares of ``ranks`` of each
    global batch, each share with its own forward pass, averaging the gradients.
    ``source``: the run's data (default: its synthetic images), of which ``items`` are trained on."""
    cfg = TrainConfig.from_dict(checkpoint["train_config"])
    model_cfg = ModelConfig.from_dict(checkpoint["model_config"])
    nets = build_networks(model_cfg, cfg, torch.device("cpu"), DistributedContext())
    opt_g, opt_d = build_optimizers(nets, cfg)
    G, D = nets.generator.train(), nets.discriminator.train()
    source = source if source is not None else SyntheticSource(seed=cfg.seed)
    dataset = InpaintingDataset(source, cfg.size, cfg.local_size, cfg.mask, cfg.hole_range())
    items = items if items is not None else len(dataset)
    samplers = [StepBatchSampler(items, cfg.batch_size, cfg.seed, 0, steps, r, WORLD) for r in ranks]
    weight = 1.0 / len(ranks)

    def d_loss(real: torch.Tensor, fake: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
        return discriminator_loss(D(crop_local(real, corners, cfg.local_size), real),
                                  D(crop_local(fake, corners, cfg.local_size), fake), cfg.alpha)

    for step in range(steps):
        phase = phase_at(step, cfg)
        shares = []
        for sampler in samplers:
            images, masks, corners = zip(*(dataset[k] for k in sampler.batch_keys(step)))
            shares.append((torch.stack(images), torch.stack(masks), torch.stack(corners)))
        with torch.set_grad_enabled(phase != "d"):
            fakes = [G(real, mask) for real, mask, _ in shares]
        if phase in ("d", "joint"):
            opt_d.zero_grad(set_to_none=True)
            for (real, _, corners), fake in zip(shares, fakes):
                (d_loss(real, fake.detach(), corners) * weight).backward()
            opt_d.step()
        if phase in ("g", "joint"):
            opt_g.zero_grad(set_to_none=True)
            set_requires_grad(D, False)
            for (real, mask, corners), fake in zip(shares, fakes):
                loss = cfg.recon_weight * hole_mse(fake, real, mask)
                if phase == "joint":
                    loss = loss + generator_adversarial_loss(D(crop_local(fake, corners, cfg.local_size), fake), cfg.alpha)
                (loss * weight).backward()
            set_requires_grad(D, True)
            opt_g.step()
    return SimpleNamespace(generator=G, discriminator=D, opt_g=opt_g, opt_d=opt_d)


def parameter_gap(module: torch.nn.Module, saved: dict[str, torch.Tensor]) -> float:
    return max(float((p.detach() - saved[name]).abs().max()) for name, p in module.named_parameters())


def assert_moments_match(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    state = optimizer.state_dict()["state"]
    assert state.keys() == saved["state"].keys()
    for index, moments in state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            ours, theirs = moments[key], saved["state"][index][key]
            gap = float((ours - theirs).abs().max())
            assert gap <= MOMENT_RTOL * float(theirs.abs().max()), f"Adam {key} of parameter {index}: off by {gap:.3g}"


# ------------------------------------------------------------------------ the tests


@pytest.mark.slow  # torchrun: two training processes (the module's ddp_run)
def test_two_process_run_matches_the_per_half_reference(ddp_run: SimpleNamespace) -> None:
    for name, steps in (("step_4.pt", 4), ("last.pt", 6)):  # g, g, d, joint | then resumed: joint, joint
        saved = load_checkpoint(ddp_run.run_dir / "checkpoints" / name)
        assert saved["step"] == steps
        ref = reference_training(saved, steps)
        assert parameter_gap(ref.generator, saved["generator"]) < PARAM_ATOL
        assert parameter_gap(ref.discriminator, saved["discriminator"]) < PARAM_ATOL
        assert_moments_match(ref.opt_g, saved["opt_g"])
        assert_moments_match(ref.opt_d, saved["opt_d"])


@pytest.mark.slow  # torchrun: two training processes (the module's ddp_run)
def test_the_reference_tells_averaged_from_unaveraged_gradients(ddp_run: SimpleNamespace) -> None:
    """Control: had rank 0 kept its own half's gradients, the comparison above fails."""
    saved = load_checkpoint(ddp_run.run_dir / "checkpoints" / "step_4.pt")
    alone = reference_training(saved, 4, ranks=(0,))
    assert parameter_gap(alone.generator, saved["generator"]) > 100 * PARAM_ATOL
    with pytest.raises(AssertionError):
        assert_moments_match(alone.opt_d, saved["opt_d"])


@pytest.mark.slow  # torchrun: two training processes (the module's ddp_run)
def test_checkpoint_of_a_two_process_run_loads_and_inpaints(ddp_run: SimpleNamespace) -> None:
    state = load_checkpoint(ddp_run.run_dir / "checkpoints" / "last.pt")
    assert not any(k.startswith("module.") for k in state["generator"])  # the raw module's names, not DDP's
    generator = generator_from_checkpoint(state).eval()
    image, mask = torch.rand(1, 3, 32, 32), torch.zeros(1, 1, 32, 32)
    mask[..., 8:20, 8:20] = 1
    out = generator(image, mask)
    assert torch.isfinite(out).all() and torch.equal(out * (1 - mask), image * (1 - mask))


@pytest.mark.slow  # torchrun: two training processes (the module's ddp_run)
def test_only_rank_zero_writes(ddp_run: SimpleNamespace) -> None:
    run = ddp_run.run_dir
    files = sorted(str(p.relative_to(ddp_run.cwd)) for p in ddp_run.cwd.rglob("*") if p.is_file())
    expected = ["checkpoints/last.pt", "checkpoints/step_2.pt", "checkpoints/step_4.pt", "checkpoints/step_6.pt",
                "config.toml", "gantool-run.json", "metrics.jsonl", "samples/step_4.png", "samples/step_6.png",
                "status.json"]
    # no temp files, no lock left behind, no second run folder
    assert files == [str((run / f).relative_to(ddp_run.cwd)) for f in expected]
    records = read_metrics(run / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "images_per_s" in r]
    assert train_steps == [1, 2, 3, 4, 5, 6]  # one line per step: rank 1 appended nothing
    assert [r["step"] for r in records if "val_psnr" in r] == [4, 6]


@pytest.mark.slow  # torchrun: two training processes (the module's ddp_run)
def test_resume_under_two_processes_continues_from_the_checkpoint_step(ddp_run: SimpleNamespace) -> None:
    assert [r["step"] for r in ddp_run.metrics_after_first if "images_per_s" in r] == [1, 2, 3, 4]
    assert load_checkpoint(ddp_run.run_dir / "checkpoints" / "step_4.pt")["step"] == 4
    last = load_checkpoint(ddp_run.run_dir / "checkpoints" / "last.pt")
    assert (last["step"], last["phase"]) == (6, "joint")
    assert last["train_config"]["steps_joint"] == 3
    records = read_metrics(ddp_run.run_dir / "metrics.jsonl")[len(ddp_run.metrics_after_first):]
    assert [r["step"] for r in records if "images_per_s" in r] == [5, 6]


@pytest.mark.slow  # torchrun: two training processes (the module's ddp_run)
def test_logged_losses_are_the_mean_over_ranks(ddp_run: SimpleNamespace) -> None:
    """metrics.jsonl holds the all-reduced mean, not rank 0's own loss."""
    saved = load_checkpoint(ddp_run.run_dir / "checkpoints" / "step_2.pt")
    cfg = TrainConfig.from_dict(saved["train_config"])
    nets = build_networks(ModelConfig.from_dict(saved["model_config"]), cfg, torch.device("cpu"), DistributedContext())
    dataset = InpaintingDataset(SyntheticSource(seed=cfg.seed), cfg.size, cfg.local_size, cfg.mask, cfg.hole_range())
    per_rank = []
    for rank in range(WORLD):  # step 1 (index 0) with the initial weights
        images, masks, _ = zip(*(dataset[k] for k in StepBatchSampler(len(dataset), cfg.batch_size, cfg.seed, 0, 1,
                                                                      rank, WORLD).batch_keys(0)))
        real, mask = torch.stack(images), torch.stack(masks)
        with torch.no_grad():
            per_rank.append(float(hole_mse(nets.generator.train()(real, mask), real, mask)))
    logged = read_metrics(ddp_run.run_dir / "metrics.jsonl")[0]
    assert logged["step"] == 1
    assert logged["loss_rec"] == pytest.approx(sum(per_rank) / WORLD, rel=1e-5)
    assert abs(per_rank[0] - per_rank[1]) > 1e-3 * per_rank[0]  # the halves differ, so the mean is a real check


@pytest.mark.slow  # torchrun: two training processes
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers through Linux /proc")
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """SIGTERM (a scheduler's; torchrun forwards it, and Ctrl-C's SIGINT) reaches
    rank 1 alone here: without the per-step consensus rank 0 would wait in the
    next all-reduce and die there, with no checkpoint."""
    out = tmp_path / "run"
    proc = launch([*TINY_ARGS, "--out", str(out), "--steps-g", "100000", "--steps-d", "0", "--steps-joint", "0",
                   "--sample-every", "100000", "--checkpoint-every", "100000"], tmp_path, subprocess_env)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + TIMEOUT_S
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the run never logged 3 steps:\n" + finish(proc, 10)[-3000:])
        time.sleep(0.1)
    rank1 = worker_pid(proc.pid, 1)
    assert rank1 is not None, "rank 1's worker process not found"
    os.kill(rank1, signal.SIGTERM)
    output = finish(proc, timeout=90)  # seconds once stopping works; a hang is killed and fails
    assert "Unable to shutdown process" not in output  # nobody hung until torchrun's SIGKILL
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    logged = [r["step"] for r in read_metrics(metrics)]
    assert logged == list(range(1, len(logged) + 1))
    assert state["step"] == logged[-1] >= 3
    stopped_at = {int(m) for m in re.findall(r"interrupted at step (\d+)", output)}
    assert stopped_at == {state["step"]}, output[-3000:]


# --------------------------------------------------------------- unit-level pieces


def test_sync_bn_guard_agrees_with_torch() -> None:
    """Our guard says what torch's SyncBatchNorm really does with CPU tensors."""
    import torch.distributed as torch_dist

    assert not torch_dist.is_initialized()
    torch_dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    try:
        layer = torch.nn.SyncBatchNorm(3).train()
        try:
            layer(torch.rand(2, 3, 4, 4))
            torch_accepts_cpu = True
        except ValueError as e:
            assert "SyncBatchNorm expected input tensor to be on GPU" in str(e)
            torch_accepts_cpu = False
    finally:
        torch_dist.destroy_process_group()
    assert sync_batchnorm_supported(torch.device("cpu")) == torch_accepts_cpu
    assert sync_batchnorm_supported(torch.device("cuda", 0))


def test_sync_bn_on_cpu_processes_is_a_clear_error_before_any_collective() -> None:
    cfg = tiny_train_config(sync_bn=True)
    fake_world = DistributedContext(rank=0, world_size=2, device=torch.device("cpu"))
    with pytest.raises(InputError, match="--sync-bn needs GPUs"):
        build_networks(cfg.model_config(), cfg, torch.device("cpu"), fake_world)


def test_sync_bn_in_one_process_warns_and_trains(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = tiny_train_config(out=str(tmp_path / "run"), sync_bn=True, steps_g=1, steps_d=0, steps_joint=0)
    result = train(cfg, progress=False)
    assert result.step == 1
    assert "--sync-bn has no effect in a single process" in caplog.text


def test_setup_without_torchrun_is_a_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    context = setup_distributed("cpu")
    assert (context.enabled, context.is_main, context.world_size) == (False, True, 1)
    assert context.wrap(module := torch.nn.Linear(2, 2)) is module
    assert context.broadcast_object("x") == "x"
    losses = {"loss_rec": torch.tensor(0.25)}
    assert context.step_consensus(losses, stop=True) == ({"loss_rec": 0.25}, True)


@pytest.mark.parametrize("env, fragment", [
    ({"WORLD_SIZE": "2"}, "RANK is not"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, "not an integer"),
    ({"WORLD_SIZE": "2", "RANK": "5"}, "outside 0..1"),
])
def test_broken_torchrun_environment_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, env: dict, fragment: str) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InputError, match=fragment):
        setup_distributed("cpu")


def test_rank_seeds_differ_between_ranks_and_repeat() -> None:
    assert rank_seed(0, 0) != rank_seed(0, 1) != rank_seed(0, 1, step=7)
    draws = []
    for rank in (1, 2, 1):
        seed_rank(5, rank, step=3)
        draws.append(torch.rand(4))
    assert torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[1])


def test_step_batch_sampler_caches_its_permutation_without_changing_keys_and_splits_the_batch() -> None:
    """The cached epoch permutation changes nothing (steps visited out of order give
    the keys a fresh sampler gives), and the ranks' shares of a step concatenate
    to the 1-process global batch."""
    items, batch = 10, 4  # 10 items: steps cross epoch boundaries
    single = list(StepBatchSampler(items, batch, 3, 0, 7))
    jumping = StepBatchSampler(items, batch, 3, 0, 7)
    for step in (6, 0, 3, 6, 1):
        assert jumping.batch_keys(step) == StepBatchSampler(items, batch, 3, 0, 7).batch_keys(step) == single[step]
    shares = [list(StepBatchSampler(items, batch, 3, 0, 7, rank=r, world_size=WORLD)) for r in range(WORLD)]
    assert [a + b for a, b in zip(*shares)] == single
    assert list(StepBatchSampler(items, batch, 3, 5, 7, rank=1, world_size=WORLD)) == shares[1][5:]
    with pytest.raises(InputError, match="divisible"):
        StepBatchSampler(items, 3, 3, 0, 7, rank=0, world_size=WORLD)


def test_tiny_args_match_the_shared_tiny_model() -> None:
    args = dict(zip(TINY_ARGS[0::2], TINY_ARGS[1::2]))
    assert {k: int(args["--" + k.replace("_", "-")]) for k in TINY_MODEL} == TINY_MODEL


# ------------------------------------------------------------------ a dead process


PEER = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False)
dist.init_process_group("gloo", store=store, rank=1, world_size=2)
dist.barrier()
time.sleep(600)
"""


@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs torch's gloo backend")
def test_a_dead_peer_fails_the_collective_at_once_and_is_recognised(subprocess_env: dict[str, str]) -> None:
    """A real gloo group of this process and a peer process, which is then killed -9: the next
    all-reduce fails (it does not wait for gloo's 30 min timeout), with what torch 2.13 raises, a plain
    RuntimeError that :func:`is_collective_failure` must recognise; the survivor's report is one line."""
    import datetime

    import torch.distributed as torch_dist

    from gantool.training.distributed import is_collective_failure, process_lost

    store = torch_dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(store.port)], env=subprocess_env)
    try:
        torch_dist.init_process_group("gloo", store=store, rank=0, world_size=2,
                                      timeout=datetime.timedelta(seconds=TIMEOUT_S))
        try:
            torch_dist.barrier()  # both are in
            peer.kill()
            peer.wait(timeout=30)
            started = time.monotonic()
            with pytest.raises(RuntimeError) as failed:
                torch_dist.all_reduce(torch.ones(3))
            assert time.monotonic() - started < 30
        finally:
            torch_dist.destroy_process_group()
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait()
    assert is_collective_failure(failed.value), failed.value
    line = str(process_lost(DistributedContext(rank=0, world_size=2), failed.value, "at step 3", "kept: x.pt"))
    assert "\n" not in line and "gloo/transport" not in line and "GLHF" not in line, line
    assert line.startswith("process 0 of 2 lost contact with another process at step 3 (") and "peer" in line, line
    assert line.endswith("it stopped without saving; kept: x.pt"), line
    # a failure of this process's own is not a lost peer: it keeps its traceback
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x2 and 3x2)"))
    assert not is_collective_failure(ValueError("gloo"))


def test_the_dead_rank_is_named_when_the_survivor_fails_in_the_same_second() -> None:
    """torch's failure timestamps are whole seconds and ``get_first_failure`` breaks ties by the lower
    rank: rank 0, which only lost contact (or got the agent's SIGTERM), was named for a killed rank 1."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from gantool.core.errors import ProcessLostError
    from gantool.training.launch import first_failure

    for survivor_code in (ProcessLostError.exit_code, -signal.SIGTERM, 143):
        failures = {0: ProcessFailure(0, 100, survivor_code, "<N/A>"), 1: ProcessFailure(1, 101, -9, "<N/A>")}
        failures[0].timestamp = failures[1].timestamp  # seen in the same second
        assert ChildFailedError("gantool", failures).get_first_failure()[0] == 0  # torch's own choice
        rank, failure = first_failure(failures)
        assert (rank, failure.pid, failure.signal_name()) == (1, 101, "SIGKILL")
    # a failure seen a second earlier is the first, whatever it was
    failures = {0: ProcessFailure(0, 100, -9, "<N/A>"), 1: ProcessFailure(1, 101, 1, "<N/A>")}
    failures[1].timestamp = failures[0].timestamp + 1
    assert first_failure(failures)[0] == 0
    failures[0].timestamp, failures[1].timestamp = failures[0].timestamp + 2, failures[0].timestamp
    assert first_failure(failures)[0] == 1
    # A rank the launcher found stopped (SIGSTOP) when the first ended, resumed and ended in the same
    # second as the one that waited for it (lost contact, or the agent's SIGTERM), is never the first.
    for stopped_code in (ProcessLostError.exit_code, 143, -signal.SIGTERM):
        failures = {0: ProcessFailure(0, 100, stopped_code, "<N/A>"),
                    1: ProcessFailure(1, 101, ProcessLostError.exit_code, "<N/A>")}
        failures[0].timestamp = failures[1].timestamp
        assert first_failure(failures)[0] == 0  # by the failures alone: the lower rank
        assert first_failure(failures, stopped={0: 100})[0] == 1


def test_the_dead_rank_line_names_the_last_checkpoint_and_finds_a_default_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the launcher reads after a failure: the checkpoint's own step (last.pt, loaded with
    weights_only), and for a new runs/<timestamp> the folder whose status.json rank 0 wrote."""
    import socket

    from gantool.training.checkpoint import save_checkpoint
    from gantool.training.launch import _run_of_pids, last_checkpoint_line

    monkeypatch.chdir(tmp_path)
    host = socket.gethostname()
    for name, pid, on in (("20261201-100000", 111, host), ("20261201-100001", 222, host),
                          ("20261201-100002", 222, "elsewhere"), ("broken", 222, host)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "status.json").write_text(json.dumps({"pid": pid, "host": on}))
    (tmp_path / "runs" / "broken" / "status.json").write_text("{not json")
    run = _run_of_pids({222, 333})
    assert run == (tmp_path / "runs" / "20261201-100001").resolve()
    assert _run_of_pids({444}) is None
    assert last_checkpoint_line(run, 2) == "No checkpoint was written."
    assert last_checkpoint_line(None, 2) == "No checkpoint was written."
    last = save_checkpoint(run / "checkpoints" / "last.pt", {"step": 12, "generator": {"w": torch.ones(2)}})
    assert last_checkpoint_line(run, 4) == (
        f"Last complete checkpoint: {last} (step 12); resume with: gantool train --resume {last} --nproc-per-node 4"
    )
    # A path with a space: the resume command pastes as one argument.
    spaced = save_checkpoint(tmp_path / "my run" / "checkpoints" / "last.pt", {"step": 2, "generator": {}})
    command = last_checkpoint_line(tmp_path / "my run", 2).split("resume with: ")[1]
    assert shlex.split(command) == ["gantool", "train", "--resume", str(spaced), "--nproc-per-node", "2"]
    # A run resumed from its step_N.pt after last.pt was deleted: that file (the line said none was written).
    kept = last.rename(last.with_name("step_12.pt"))
    assert last_checkpoint_line(run, 4) == (
        f"Last complete checkpoint: {kept} (step 12); resume with: gantool train --resume {kept} --nproc-per-node 4"
    )


def test_a_workers_report_is_what_torchs_agent_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's one line reaches the launcher through torch's own reader of the error file (its
    ProcessFailure); a file that cannot be written leaves nothing half-written (torch's reader raises on
    one) and the worker prints its line itself."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from gantool.training.launch import ERROR_FILE_ENV, LAUNCHER_ENV, report_worker_failure, worker_report

    path = tmp_path / "error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    assert report_worker_failure("cannot write x: No space left on device", "error") is False  # plain torchrun
    monkeypatch.setenv(LAUNCHER_ENV, "1")
    assert report_worker_failure("non-finite loss_rec at step 3", "non-finite") is True
    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=1, error_file=str(path))
    assert failure.message == "non-finite loss_rec at step 3" and abs(failure.timestamp - time.time()) < 60
    assert worker_report(failure) == ("non-finite loss_rec at step 3", "non-finite")
    # torch's own record (a traceback; no reason of gantool's) and no file at all: not a worker's report.
    path.write_text(json.dumps({"message": {"message": "X", "extraInfo": {"timestamp": "1"}}}))
    assert worker_report(ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(path))) == (None, None)
    assert worker_report(ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(tmp_path / "none"))) == (
        None, None)
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv(ERROR_FILE_ENV, str(tmp_path / "a file" / "error.json"))  # cannot be written
    assert report_worker_failure("line", "error") is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file", "error.json"]  # no temp file left


# ------------------------------------------------------------------ a silent process

SILENT_PEER = """
import os, sys, time
import torch.distributed as dist
time.sleep(float(sys.argv[1]))  # joins later than the steps' timeout: the set-up must wait longer
dist.init_process_group("gloo", rank=1, world_size=2)
dist.barrier()
time.sleep(600)  # alive, never in the next collective: it stopped answering
"""


@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs torch's gloo backend")
def test_a_silent_peer_ends_the_next_collective_within_the_collective_timeout(
    monkeypatch: pytest.MonkeyPatch, subprocess_env: dict[str, str]
) -> None:
    """A real gloo pair set up by :func:`setup_distributed` (env://, as torchrun describes it): joining
    waits for a peer that comes later than ``collective_timeout`` (the set-up's timeout is longer), then
    from :meth:`start_steps` on, a collective the peer never joins fails after that timeout (torch's
    default: 30 minutes), and the survivor's one line says which timeout it was."""
    import socket

    import torch.distributed as torch_dist

    from gantool.training.distributed import is_collective_failure, process_lost

    with socket.socket() as s:  # a free port for rank 0's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    timeout = 0.25
    peer = subprocess.Popen([sys.executable, "-c", SILENT_PEER, str(2 * timeout)],
                            env={**subprocess_env, **env, "RANK": "1", "LOCAL_RANK": "1"})
    try:
        context = setup_distributed("cpu", collective_timeout=timeout)  # waits for the late peer
        try:
            assert context.enabled and context.owns_group and context.collective_timeout == timeout
            context.barrier()  # still the set-up's timeout: both are in
            context.start_steps()
            started = time.monotonic()
            with pytest.raises(RuntimeError) as failed:
                context.step_consensus({"loss_rec": torch.tensor(1.0)}, stop=False)
            waited = time.monotonic() - started
        finally:
            context.shutdown()
    finally:
        peer.kill()
        peer.wait()
    assert not torch_dist.is_initialized()
    assert timeout <= waited < 10 * timeout + 2, f"waited {waited:.2f} s"
    assert is_collective_failure(failed.value), failed.value
    line = str(process_lost(context, failed.value, "at step 3", "kept: x.pt"))
    assert "\n" not in line and "gloo/transport" not in line, line
    assert line.startswith("process 0 of 2 lost contact with another process at step 3 (Timed out waiting 250ms"), line
    assert ": no answer within --collective-timeout 0.25 s); it stopped without saving; kept: x.pt" in line, line
    # The timeout closes every pair of the group: another pending operation of the same process (DDP's
    # buffer broadcast in forward, seen in CI) fails with gloo's second message, which is the same loss.
    closure = RuntimeError("[../gloo/transport/tcp/pair.cc:599] Application timeout caused pair closure")
    assert is_collective_failure(closure)
    line = str(process_lost(context, closure, "at step 3"))
    assert line == ("process 0 of 2 lost contact with another process at step 3 (Application timeout caused pair "
                    "closure: no answer within --collective-timeout 0.25 s); it stopped without saving"), line


@pytest.mark.slow  # torchrun: two training processes
def test_a_two_process_run_on_webdataset_shards_matches_the_per_half_reference(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Each rank reads its own share of each step's samples from the shards (by member offset):
    the 2-process run equals one process training on the same samples, share by share."""
    import io

    import numpy as np
    import webdataset as wds
    from PIL import Image

    from gantool.training.shards import ShardSource

    shards = tmp_path / "shards"
    shards.mkdir()
    with wds.ShardWriter(str(shards / "train-%06d.tar"), maxcount=5, verbose=0) as writer:
        for i in range(15):
            out = io.BytesIO()
            Image.fromarray(np.random.default_rng(i).integers(0, 256, (36, 44, 3), dtype=np.uint8)).save(out, "PNG")
            writer.write({"__key__": f"{i:06d}", "png": out.getvalue(), "cls": str(i % 3).encode()})
    pattern = str(shards / "train-{000000..000002}.tar")
    run_to_end([*TINY_ARGS, "--data", pattern, "--out", str(tmp_path / "run"), "--steps-g", "2", "--steps-d", "1",
                "--steps-joint", "1", "--val-images", "3", "--sample-every", "4", "--checkpoint-every", "4"],
               tmp_path, subprocess_env)  # fmt: skip
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert saved["step"] == 4 and saved["data"]["kind"] == "shards" and saved["data"]["files"] == 15
    ref = reference_training(saved, 4, source=ShardSource(pattern), items=15 - 3)
    assert parameter_gap(ref.generator, saved["generator"]) < PARAM_ATOL
    assert parameter_gap(ref.discriminator, saved["discriminator"]) < PARAM_ATOL
    assert_moments_match(ref.opt_g, saved["opt_g"])

"""Mutation check: plant small semantic bugs in a copy of gantool and check that the tests catch each.

Not collected by pytest (the name does not start with ``test_``). Run from anywhere:

    python tests/mutants.py --list            # the mutants and the tests that must catch each
    python tests/mutants.py                   # every mutant
    python tests/mutants.py --only NAME ...   # some of them
    python tests/mutants.py --ci              # the bounded CI selection; exit 1 if one survives

Each mutant is one exact source edit (file, old snippet, new snippet). The script
copies toolkit/ and tests/ to a temporary folder, first runs every selected test
on the unmodified copy (they must pass, or a "caught" would mean nothing), then for
each mutant applies its edit, runs its tests (``pytest -x`` with PYTHONPATH at the
copy) and restores the file. A mutant whose old snippet is not found exactly once
stops the script before anything runs: code moved, so the mutant must be updated.

Exit status: 0 all caught; 1 a mutant survived (or the baseline failed); 2 the list
needs updating (snippet not found, unknown name, a selection that collects nothing).

When you fix a bug, add a mutant that re-plants it, with the test that failed
before your fix, and run ``python tests/mutants.py --only NAME``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "toolkit/gantool"
TIMEOUT_S = 600  # per pytest run; a mutant that hangs its tests counts as caught (timeout)


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to toolkit/gantool
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids relative to tests/
    ci: bool = True  # part of the bounded --ci selection
    why: str = ""


ORACLES = "test_oracles.py"
BOUNDS = "test_boundaries.py"
LOOP = "test_training_loop.py"
ATOMIC = "test_atomicity.py"
PARITY = "test_parity.py"
STALE = "test_nothing_stale.py"

MUTANTS: list[Mutant] = [
    # ---------------------------------------------------------------- loss targets and weights
    Mutant(
        "g_adversarial_target_flipped",
        "nn/losses.py",
        "return alpha * F.binary_cross_entropy_with_logits(fake_logits, torch.ones_like(fake_logits))",
        "return alpha * F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))",
        (
            f"{ORACLES}::test_generator_adversarial_loss_targets_real",
            f"{ORACLES}::test_one_adversarial_generator_step_raises_d_on_the_fake",
        ),
        why="G trained to be called fake: a GAN that fools nobody",
    ),
    Mutant(
        "d_real_target_flipped",
        "nn/losses.py",
        "real = F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))",
        "real = F.binary_cross_entropy_with_logits(real_logits, torch.zeros_like(real_logits))",
        (
            f"{ORACLES}::test_discriminator_loss_is_alpha_times_half_the_bce_sum",
            f"{ORACLES}::test_one_discriminator_step_raises_real_and_lowers_fake",
        ),
    ),
    Mutant(
        "g_alpha_ignored",
        "nn/losses.py",
        "return alpha * F.binary_cross_entropy_with_logits(fake_logits,",
        "return F.binary_cross_entropy_with_logits(fake_logits,",
        (f"{ORACLES}::test_generator_adversarial_loss_targets_real",),
    ),
    Mutant(
        "d_alpha_ignored",
        "nn/losses.py",
        "return alpha * (real + fake) / 2",
        "return (real + fake) / 2",
        (f"{ORACLES}::test_discriminator_loss_is_alpha_times_half_the_bce_sum",),
    ),
    Mutant(
        "recon_weight_ignored",
        "training/steps.py",
        "loss_g = cfg.recon_weight * loss_rec + loss_adv",
        "loss_g = loss_rec + loss_adv",
        (f"{ORACLES}::test_generator_step_gradient_is_recon_weight_times_hole_mse_plus_alpha_times_bce_real",),
    ),
    Mutant(
        "hole_mask_dropped_from_reconstruction",
        "nn/losses.py",
        "return ((output - target) ** 2 * mask).sum() / mask.sum().clamp_min(1.0)",
        "return ((output - target) ** 2).mean()",
        (f"{ORACLES}::test_hole_mse_is_the_mean_over_hole_pixels_and_channels",),
    ),
    Mutant(
        "joint_phase_without_adversarial_loss",
        "training/steps.py",
        'adversarial=phase == "joint")',
        "adversarial=False)",
        (f"{LOOP}::test_twin_gantool_generator_gradient_comes_from_a_fresh_pass_through_the_updated_d",),
    ),
    # --------------------------------------------------------------------- detach and freeze
    Mutant(
        "detach_removed_in_d_step",
        "training/steps.py",
        "discriminator_step(nets, opt_d, real, fake.detach().float(), corners, cfg, autocast)",
        "discriminator_step(nets, opt_d, real, fake.float(), corners, cfg, autocast)",
        (f"{LOOP}::test_twin_gantool_joint_steps_run_and_move_both_networks",),
    ),
    Mutant(
        "d_not_frozen_in_g_step",
        "training/steps.py",
        "set_requires_grad(nets.discriminator, False)  # G's loss",
        "set_requires_grad(nets.discriminator, True)  # G's loss",
        (f"{LOOP}::test_twin_gantool_joint_step_leaves_only_d_loss_gradients_in_d",),
    ),
    # ------------------------------------------------------------------------ mask contract
    Mutant(
        "mask_threshold_ge_127",
        "core/processing.py",
        "return zero_one if zero_one is not None else (grey > 127).astype(np.float32)",
        "return zero_one if zero_one is not None else (grey >= 127).astype(np.float32)",
        (
            f"{BOUNDS}::test_mask_file_127_is_kept_and_128_is_a_hole",
            f"{BOUNDS}::test_mask_folder_127_is_kept_and_128_is_a_hole",
        ),
    ),
    Mutant(
        "array_mask_threshold_ge_127",
        "core/processing.py",
        "        return (arr > peak / 2).astype(np.float32)\n    if _is_high_bit(img):",
        "        return (arr >= (peak - 1) / 2).astype(np.float32)\n    if _is_high_bit(img):",
        (f"{BOUNDS}::test_inpainter_mask_127_is_kept_and_128_is_a_hole",),
    ),
    Mutant(
        "alpha_threshold_lt_127",
        "core/processing.py",
        "return (alpha <= 127).astype(np.float32)",
        "return (alpha < 127).astype(np.float32)",
        (f"{BOUNDS}::test_alpha_channel_128_is_kept_and_127_is_a_hole_inpainter",),
    ),
    Mutant(
        "box_one_pixel_too_tall",
        "inference/inpainter.py",
        "mask[max(0, y) : y + h, max(0, x) : x + w] = 1.0",
        "mask[max(0, y) : y + h + 1, max(0, x) : x + w] = 1.0",
        (f"{BOUNDS}::test_box_covers_exactly_its_pixels",),
    ),
    # ------------------------------------------------------------- composite and padding
    Mutant(
        "composite_inverted",
        "core/processing.py",
        "return np.where(hole, result, known).astype(known.dtype, copy=False)",
        "return np.where(hole, known, result).astype(known.dtype, copy=False)",
        (f"{BOUNDS}::test_inpainter_mask_127_is_kept_and_128_is_a_hole",),
    ),
    Mutant(
        "generator_composite_inverted",
        "nn/networks.py",
        "return image * known + out * mask",
        "return image * mask + out * known",
        (f"{BOUNDS}::test_run_any_size_keeps_known_pixels_exactly",),
    ),
    Mutant(
        "padding_crop_back_off_by_one",
        "core/processing.py",
        "return batch[..., top : height - bottom, left : width - right]",
        "return batch[..., bottom : height - top, left : width - right]",
        (
            f"{BOUNDS}::test_run_any_size_keeps_known_pixels_exactly",
            f"{BOUNDS}::test_full_strategy_fills_the_hole_with_the_model_output_at_the_right_place",
        ),
        why="only odd padding (4k-1, 4k+1) shows it",
    ),
    # -------------------------------------------------------------------------- export
    Mutant(
        "bn_folding_keeps_the_bn",
        "nn/networks.py",
        "module[i + 1] = nn.Identity()",
        "pass  # BN left in place after folding it into the conv",
        (f"{ORACLES}::test_folded_generator_computes_what_the_eager_one_does",),
    ),
    Mutant(
        "parity_verdict_any_backend",
        "export/parity.py",
        '"passed": all(s["passed"] for s in summary.values()),',
        '"passed": any(s["passed"] for s in summary.values()),',
        (f"{PARITY}::test_sweep_verdict_with_one_passing_and_one_failing_backend",),
    ),
    Mutant(
        "parity_case_verdict_always_true",
        "export/parity.py",
        'if "error" in result or not result["known_exact"]:\n        return False',
        "if True:\n        return True",
        (
            f"{PARITY}::test_sweep_fails_an_error_above_atol_in_the_hole",
            f"{PARITY}::test_sweep_verdict_with_one_passing_and_one_failing_backend",
        ),
    ),
    # ------------------------------------------------------------------- files and resume
    Mutant(
        "atomic_write_not_atomic",
        "core/fileio.py",
        '        yield tmp\n        with open(tmp, "rb+") as f:  # make the bytes durable before the rename\n'
        "            os.fsync(f.fileno())\n        os.replace(tmp, path)",
        "        yield path\n        tmp.unlink(missing_ok=True)",
        (
            f"{ATOMIC}::test_checkpoint_write_failing_half_way_keeps_the_previous_file",
            f"{ATOMIC}::test_checkpoint_writer_killed_at_random_points_leaves_loadable_checkpoints",
        ),
        why="writes straight onto the target",
    ),
    Mutant(
        "resume_rng_restore_dropped",
        "training/loop.py",
        'restore_rng_state(state["rng"])  # rank 0',
        "pass  # rank 0",
        (f"{LOOP}::test_resume_restores_the_rng_streams",),
    ),
    Mutant(
        "resume_optimizer_state_dropped",
        "training/checkpoint.py",
        '("opt_g", opt_g),\n        ("opt_d", opt_d),\n    )\n    for key, target in parts:',
        '("opt_d", opt_d),\n    )\n    for key, target in parts:',
        ("test_train.py::test_resume_is_bitwise_exact",),
        ci=False,
    ),
    # ------------------------------------------------------------------------- metrics
    Mutant(
        "psnr_20_log10",
        "nn/losses.py",
        "return 10 * torch.log10(1.0 / mse)",
        "return 20 * torch.log10(1.0 / mse)",
        (f"{ORACLES}::test_psnr_and_l1_inside_and_outside_the_hole_match_numpy",),
    ),
    Mutant(
        "ssim_constants_not_squared",
        "nn/losses.py",
        "c1, c2 = 0.01**2, 0.03**2",
        "c1, c2 = 0.01, 0.03",
        (f"{ORACLES}::test_ssim_matches_numpy_and_the_closed_form_for_flat_images",),
    ),
    Mutant(
        "l1_hole_ignores_the_mask",
        "nn/losses.py",
        "return (err * m).flatten(1).sum(1) / m.flatten(1).sum(1).clamp_min(1.0)",
        "return err.flatten(1).mean(1)",
        (f"{ORACLES}::test_psnr_and_l1_inside_and_outside_the_hole_match_numpy",),
    ),
    # ---------------------------------------------------------------- nothing stale (issue #10)
    Mutant(
        "non_finite_output_written",
        "runtime/backends.py",
        "        if not finite.all():  # never write holes filled with NaN/Inf garbage",
        "        if False:  # never write holes filled with NaN/Inf garbage",
        (f"{STALE}::test_a_model_that_produces_nan_fails_the_image_and_writes_nothing",),
    ),
    Mutant(
        "mixed_export_folder_accepted",
        "core/artifacts.py",
        "    if len(set(hashes.values())) > 1:",
        "    if False:",
        (f"{STALE}::test_a_folder_that_mixes_exports_is_refused_naming_the_files",),
    ),
    Mutant(
        "stale_export_files_kept",
        "export/exporter.py",
        "        if key not in targets:\n            stale.unlink(missing_ok=True)",
        "        if False:\n            stale.unlink(missing_ok=True)",
        (f"{STALE}::test_re_export_removes_the_older_exports_files",),
    ),
    Mutant(
        "zero_one_mask_png_ignored",
        "core/processing.py",
        "    if arr.size and arr.max() == 1 and arr.min() >= 0:",
        "    if False:",
        (f"{BOUNDS}::test_zero_one_mask_png_is_read_as_a_zero_one_mask_inpainter",),
    ),
    Mutant(
        "run_folder_not_claimed_exclusively",
        "training/runfolder.py",
        "        fd = os.open(folder / RUN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)",
        "        fd = os.open(folder / RUN_FILE, os.O_WRONLY | os.O_CREAT, 0o666)",
        ("test_train.py::test_two_claims_of_one_out_folder_racing_past_the_check_let_only_one_win",),
    ),
    Mutant(
        "second_signal_still_checkpoints",
        "training/loop.py",
        "if result.interrupted and whole_step and dist.is_main",
        "if result.interrupted and dist.is_main",
        ("test_train_faults.py::test_a_second_signal_mid_step_saves_nothing_and_the_last_checkpoint_resumes_exactly",),
        why="the old loop wrote half of the next step under the last step's number",
    ),
    Mutant(
        "checkpoint_write_cause_hidden",
        "training/checkpoint.py",
        "                if recorder.error is not None:",
        "                if False:",
        ("test_train_faults.py::test_the_checkpoint_writer_keeps_the_cause_torch_would_hide",),
    ),
    Mutant(
        "relative_data_kept_relative",
        "training/loop.py",
        "cfg = cfg.replace(data=str(Path(cfg.data).absolute()))",
        "pass",
        ("test_train_faults.py::test_relative_data_is_recorded_absolute_and_resume_elsewhere_trains_on_it",),
    ),
    Mutant(
        "data_change_not_refused",
        "training/data.py",
        "    if not differs:\n        return\n    what",
        "    if True:\n        return\n    what",
        ("test_train_faults.py::test_resume_on_changed_or_other_data_is_refused_unless_allowed",),
    ),
    Mutant(
        "run_inside_run_allowed",
        "training/runfolder.py",
        "    outer = enclosing_run(target)",
        "    outer = None",
        ("test_train_faults.py::test_a_run_is_never_made_inside_another_run",),
    ),
    Mutant(
        "untrained_folder_left_behind",
        "training/loop.py",
        "        if made and result.run_dir is not None and remove_untrained_run(",
        "        if False and remove_untrained_run(",
        ("test_train_faults.py::test_a_refusal_after_the_folder_was_made_removes_it_again",),
    ),
    Mutant(
        "toml_bom_refused",
        "core/config.py",
        'path.read_bytes().decode("utf-8-sig")',
        'path.read_bytes().decode("utf-8")',
        ("test_train_faults.py::test_a_toml_file_with_a_utf8_bom_is_read",),
    ),
    Mutant(
        "bad_image_warned_every_time",
        "training/data.py",
        "            if self.bad[i]:\n                continue",
        "            if False:\n                continue",
        ("test_train_faults.py::test_a_truncated_jpeg_is_warned_about_once_and_a_held_out_one_is_not_replaced",),
    ),

]


class ListError(Exception):
    """The mutant list is out of date (exit status 2)."""


def select(names: list[str] | None, ci: bool) -> list[Mutant]:
    by_name = {m.name: m for m in MUTANTS}
    if len(by_name) != len(MUTANTS):
        raise ListError("two mutants share a name - fix tests/mutants.py")
    if names:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ListError(f"unknown mutant(s): {', '.join(unknown)} (see --list)")
        chosen = [by_name[n] for n in names]
    else:
        chosen = list(MUTANTS)
    return [m for m in chosen if m.ci] if ci else chosen


def check_snippets(root: Path, mutants: list[Mutant]) -> None:
    """Every old snippet must occur exactly once in its file, or the list needs updating."""
    for m in mutants:
        path = root / PACKAGE / m.file
        if not path.is_file():
            raise ListError(f"mutant {m.name}: file {PACKAGE}/{m.file} not found - update tests/mutants.py")
        count = path.read_text(encoding="utf-8").count(m.old)
        if count == 0:
            raise ListError(f"mutant {m.name}: snippet not found in {PACKAGE}/{m.file} - update tests/mutants.py")
        if count > 1:
            raise ListError(
                f"mutant {m.name}: snippet found {count} times in {PACKAGE}/{m.file} "
                "(must be unique) - update tests/mutants.py"
            )


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")
    for part in ("toolkit", "tests"):
        shutil.copytree(REPO / part, dest / part, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)


def run_pytest(root: Path, tests: tuple[str, ...] | list[str]) -> tuple[int, str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "toolkit"), str(root / "tests")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # edited and restored files must never meet a stale .pyc
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               *(f"tests/{t}" for t in tests)]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return -1, "timeout", time.perf_counter() - start
    lines = [line for line in done.stdout.strip().splitlines() if line.strip()]
    return done.returncode, (lines[-1] if lines else done.stderr.strip()[-200:]), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--ci", action="store_true", help="the bounded CI selection")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run on the unmodified copy")
    args = parser.parse_args(argv)
    try:
        mutants = select(args.only, args.ci)
        check_snippets(REPO, mutants)
    except ListError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(
                f"{m.name}{'' if m.ci else '  (not in --ci)'}: {PACKAGE}/{m.file}" + (f"  - {m.why}" if m.why else "")
            )
            for t in m.tests:
                print(f"    {t}")
        return 0

    with tempfile.TemporaryDirectory(prefix="gantool-mutants-") as tmp:
        root = Path(tmp)
        copy_tree(root)
        if not args.no_baseline:
            every = list(dict.fromkeys(t for m in mutants for t in m.tests))
            code, summary, seconds = run_pytest(root, every)
            print(f"baseline (unmodified copy, {len(every)} selections): {summary} [{seconds:.0f} s]", flush=True)
            if code != 0:
                print("error: the selected tests fail without any mutant; fix them first", file=sys.stderr)
                return 2 if code in (4, 5) else 1
        rows, survivors = [], []
        for m in mutants:
            path = root / PACKAGE / m.file
            original = path.read_text(encoding="utf-8")
            path.write_text(original.replace(m.old, m.new, 1), encoding="utf-8")
            try:
                code, summary, seconds = run_pytest(root, m.tests)
            finally:
                path.write_text(original, encoding="utf-8")
            if code in (4, 5):  # usage error / nothing collected: the selection is wrong, not the mutant
                print(
                    f"error: mutant {m.name}: its tests could not run ({summary}) - update tests/mutants.py",
                    file=sys.stderr,
                )
                return 2
            verdict = "survived" if code == 0 else "caught (timeout)" if code == -1 else "caught"
            if code == 0:
                survivors.append(m.name)
            rows.append((m.name, f"{len(m.tests)} selected; {summary}", verdict, seconds))
            print(f"  {m.name}: {verdict} [{seconds:.0f} s]", flush=True)

    width = max(len(r[0]) for r in rows)
    tests_width = min(60, max(len(r[1]) for r in rows))
    print()
    print(f"{'mutant':<{width}}  {'tests run':<{tests_width}}  {'result':<16}  seconds")
    for name, tests, verdict, seconds in rows:
        print(f"{name:<{width}}  {tests[:tests_width]:<{tests_width}}  {verdict:<16}  {seconds:7.1f}")
    print()
    if survivors:
        print(f"{len(survivors)} of {len(rows)} mutants SURVIVED: {', '.join(survivors)}")
        return 1
    print(f"all {len(rows)} mutants caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())

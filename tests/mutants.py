"""Mutation check: plant small semantic bugs in a copy of gantool and check that the tests catch each.

Not collected by pytest (the name does not start with ``test_``). Run from anywhere:

    python tests/mutants.py --list            # the mutants and the tests that must catch each
    python tests/mutants.py                   # every mutant
    python tests/mutants.py --only NAME ...   # some of them
    python tests/mutants.py --ci              # the bounded CI selection; exit 1 if one survives
    python tests/mutants.py --ci --jobs 2     # two mutants at a time, each in its own copy

Each mutant is one exact source edit (file, old snippet, new snippet). The script
copies toolkit/ and tests/ to a temporary folder, first runs every selected test
on the unmodified copy (they must pass, or a "caught" would mean nothing), then for
each mutant applies its edit, runs its tests (``pytest -x`` with PYTHONPATH at the
copy) and restores the file; with ``--jobs N``, N copies take mutants from one queue. A mutant whose old snippet is not found exactly once
stops the script before anything runs: code moved, so the mutant must be updated.

Exit status: 0 all caught; 1 a mutant survived (or the baseline failed); 2 the list
needs updating (snippet not found, unknown name, a selection that collects nothing).

When you fix a bug, add a mutant that re-plants it, with the test that failed
before your fix, and run ``python tests/mutants.py --only NAME``.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
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
FINITE = "test_non_finite.py"
INPUTS = "test_inpaint_inputs.py"
RAYS = "test_ray_inpaint.py"
INT8_FALLBACK = "test_int8_fallback.py"
HOSTILE = "test_serve_hostile.py"
MEMORY = "test_serve_memory.py"

MUTANTS: list[Mutant] = [
    # ---------------------------------------------------------------- training data
    Mutant(
        "channel_shuffle_not_passed_to_the_data",
        "training/loop.py",
        "cfg.hole_range(), cfg.channel_shuffle)",
        "cfg.hole_range(), False)",
        ("test_train.py::test_multi_scale_crops_of_a_photo_folder_are_recorded_and_resume_bitwise",),
        why="--channel-shuffle recorded and its grey fill used, but the crops keep their colours",
    ),
    Mutant(
        "channel_shuffle_never_grey",
        "training/data.py",
        "if rng.random() < 1.0 / GREY_SHARE:",
        "if rng.random() < 0.0:",
        ("test_networks_masks_data.py::test_channel_shuffle_permutes_or_greys_each_crop_and_keeps_the_holes",),
    ),
    Mutant(
        "push_pull_fill_not_used",
        "nn/networks.py",
        "    if hole_fill == PUSH_PULL:\n        fill = push_pull_fill(",
        "    if hole_fill == MEAN_PIXEL:\n        fill = push_pull_fill(",
        ("test_networks_masks_data.py::test_a_push_pull_generator_sees_the_surroundings_and_keeps_known_pixels",),
        why="--hole-fill push-pull recorded, but the network's holes hold the mean pixel",
    ),
    Mutant(
        "push_pull_fill_leaves_empty_cells_black",
        "nn/networks.py",
        "return value / (weight + empty) + empty * elsewhere",
        "return value / (weight + empty)",
        ("test_networks_masks_data.py::test_push_pull_fill_takes_each_holes_own_surroundings",),
    ),
    Mutant(
        "blend_keeps_a_hue_in_grey_pictures",
        "core/processing.py",
        "    if known.size and float(np.ptp(known, axis=1).max()) <= GREY_TOLERANCE:\n",
        "    if False:\n",
        ("test_blend.py::test_a_grey_picture_stored_as_rgb_gets_grey_holes",),
        why="a grey photograph stored as RGB gets the tint the training data taught",
    ),
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
        "core/mask_input.py",
        "    return (level > peak / 2).astype(np.float32)",
        "    return (level >= (peak - 1) / 2).astype(np.float32)",
        (
            f"{BOUNDS}::test_mask_file_127_is_kept_and_128_is_a_hole",
            f"{BOUNDS}::test_mask_folder_127_is_kept_and_128_is_a_hole",
            f"{BOUNDS}::test_inpainter_mask_127_is_kept_and_128_is_a_hole",
        ),
    ),
    Mutant(
        "alpha_threshold_lt_127",
        "core/mask_input.py",
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
        "runtime/backend.py",
        '        refuse_non_finite_output(out, f"{self.path.name}, {self.name} on {self.provider}")',
        "        pass",
        (
            f"{STALE}::test_a_model_that_produces_nan_fails_the_image_and_writes_nothing",
            f"{FINITE}::test_finite_weights_that_make_nan_are_refused_when_the_model_runs[pt2]",
        ),
    ),
    Mutant(
        "mixed_export_folder_accepted",
        "core/artifacts.py",
        "        if len(set(found.values())) > 1:",
        "        if False:",
        (f"{STALE}::test_a_folder_that_mixes_exports_is_refused_naming_the_files",),
    ),
    Mutant(
        "stale_export_files_kept",
        "export/exporter.py",
        "commit_staged_folder(stage, out_dir, remove=[p.name for p in replaced])",
        "commit_staged_folder(stage, out_dir, remove=[])",
        (f"{STALE}::test_re_export_removes_the_older_exports_files",),
    ),
    # ------------------------------------------------- one model per folder, faults (issue #23)
    Mutant(
        "foreign_model_file_accepted",
        "core/artifacts.py",
        "        if meta is None:\n            if exported:",
        "        if meta is None:\n            if False:",
        (f"{STALE}::test_a_foreign_model_file_without_metadata_in_an_export_folder_is_refused_naming_it",),
    ),
    Mutant(
        "export_id_not_compared",
        "core/artifacts.py",
        'for what, found in (("export ids", ids), ("weights hashes", hashes)):',
        'for what, found in (("weights hashes", hashes),):',
        (f"{STALE}::test_a_file_of_another_export_of_the_same_weights_is_refused",),
    ),
    Mutant(
        "overwrite_deletes_a_users_file",
        "export/exporter.py",
        "        if meta is None or META_VERSION not in meta:",
        "        if False:",
        (f"{STALE}::test_overwrite_never_deletes_a_file_gantool_did_not_write",),
    ),
    Mutant(
        "interrupted_commit_left_to_the_reader",
        "core/artifacts.py",
        "    finish_interrupted_commit(folder)\n    files = export_files(folder)",
        "    files = export_files(folder)",
        (f"{STALE}::test_a_killed_export_is_completed_by_the_next_reader",),
        ci=False,
    ),
    Mutant(
        "journal_not_rolled_forward",
        "core/fileio.py",
        "                if (stage / name).is_file():\n                    os.replace(stage / name, folder / name)",
        "                if False:\n                    os.replace(stage / name, folder / name)",
        (f"{ATOMIC}::test_a_commit_killed_at_every_step_leaves_the_old_files_or_the_new_ones",),
    ),
    Mutant(
        "full_disk_names_the_folder",
        "export/exporter.py",
        'raise InputError(f"cannot write {out_dir / name}: {e.strerror or e}") from None',
        'raise InputError(f"cannot write {out_dir}: {e.strerror or e}") from None',
        (f"{ATOMIC}::test_an_export_that_fails_on_a_full_disk_names_the_file_and_leaves_nothing",),
    ),
    Mutant(
        "failed_export_leaves_its_folder",
        "core/fileio.py",
        "            if not target.exists():\n                _remove_empty(created)",
        "            if False:\n                _remove_empty(created)",
        (f"{ATOMIC}::test_a_failed_export_leaves_no_new_folder",),
    ),
    Mutant(
        "ctrl_c_exits_1",
        "cli/export_cmd.py",
        "    sys.exit(128 + signum)",
        "    sys.exit(1 if signum == signal.SIGINT else 128 + signum)",
        (f"{ATOMIC}::test_an_interrupted_export_exits_130_and_leaves_the_earlier_export",),
    ),
    Mutant(
        "onnx_non_finite_weights_run",
        "runtime/backends.py",
        "super().__init__(model_file, metadata, opened.provider, opened.note, weights=onnx_initializers(model_file))",
        "super().__init__(model_file, metadata, opened.provider, opened.note, weights={})",
        (f"{STALE}::test_non_finite_weights_are_refused_by_every_backend[onnx]",),
    ),
    # ------------------------------------------ non-finite weights, every backend alike (issue #23 item 6, #24)
    Mutant(
        "openvino_non_finite_weights_run",
        "runtime/backends.py",
        'super().__init__(model_file, metadata, "CPU", note, weights=onnx_initializers(model_file))',
        'super().__init__(model_file, metadata, "CPU", note, weights={})',
        (f"{FINITE}::test_one_nan_weight_is_refused_at_load_by_every_backend[openvino]",),
        why="OpenVINO ran a model with NaN weights (before: only ONNX Runtime's backend checked)",
    ),
    Mutant(
        "aoti_non_finite_weights_run",
        "runtime/torch_backends.py",
        "        with aoti_constants(path, device.type) as weights:",
        "        with contextlib.nullcontext({}) as weights:",
        (f"{FINITE}::test_aoti_package_with_a_nan_weight_is_refused_at_load",),
        why="an AOTInductor package with a NaN constant ran (before: its weights were never read)",
    ),
    Mutant(
        "backend_weights_not_checked",
        "runtime/backend.py",
        "        refuse_non_finite(path, weights)  # first: a NaN file gets the NaN message, whatever it records\n",
        "",
        (f"{FINITE}::test_one_nan_weight_is_refused_at_load_by_every_backend",),
        why="the one check every backend's weights pass through",
    ),
    Mutant(
        "eager_non_finite_weights_run",
        "runtime/torch_backends.py",
        "        weights = generator.state_dict()  # the trained weights",
        "        weights = {}  # the trained weights",
        (f"{STALE}::test_non_finite_weights_are_refused_by_every_backend[eager]",),
    ),
    Mutant(
        "int8_only_folder_wants_fp32",
        "core/artifacts.py",
        'wanted = [*(model_artifacts(backend, precision) if precision != "fp32" else []), *model_artifacts(backend)]',
        "wanted = model_artifacts(backend)",
        (f"{STALE}::test_a_folder_with_only_the_int8_model_runs_with_precision_int8",),
    ),
    Mutant(
        "truncated_zip_called_a_checkpoint",
        "core/artifacts.py",
        "        check_zip_archive(path)\n        names = _zip_names(path)",
        "        names = _zip_names(path)",
        (f"{STALE}::test_a_truncated_torchscript_file_is_called_truncated",),
    ),
    Mutant(
        "blocked_pickle_gives_torchs_advice",
        "training/checkpoint.py",
        '    if text.startswith("Weights only load failed"):',
        "    if False:",
        (f"{STALE}::test_a_blocked_pickle_gives_the_cause_never_the_weights_only_false_advice",),
    ),
    Mutant(
        "older_run_export_silent",
        "core/artifacts.py",
        "    if step != exported:",
        "    if False:",
        (f"{STALE}::test_a_run_whose_export_is_older_than_its_last_checkpoint_warns_once",),
    ),
    Mutant(
        "zero_one_mask_png_ignored",
        "core/mask_input.py",
        "    if colour.size and integer and values.max() == 1 and values.min() >= 0:",
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
    # ------------------------------------------------------------------- the trace scanner
    Mutant(
        "pt2_weight_payloads_read_as_text",
        "export/provenance.py",
        '_TENSOR_ENTRY = re.compile(r"(?:^|/)(?:data/\\d+|data/(?:weights|constants)/[^/]+(?<!\\.json))$")',
        '_TENSOR_ENTRY = re.compile(r"(?:^|/)data/\\d+$")',
        ("test_provenance.py::test_scanner_skips_pt2_weights_and_constants_but_reads_every_text_entry",),
        why="random weight bytes look like C:\\... paths: full-width --pt2 exports failed at random",
    ),
    Mutant(
        "aoti_library_weights_read_as_text",
        "export/provenance.py",
        "    elf = _elf_text_parts(data)",
        "    elf = None",
        ("test_provenance.py::test_scanner_reads_a_compiled_librarys_strings_but_not_its_weight_section",),
    ),
    Mutant(
        "pt2_range_constraints_in_hash_order",
        "export/formats.py",
        "        sort_range_constraints(program)  # equal checkpoints, equal bytes",
        "        pass",
        ("test_provenance.py::test_same_checkpoint_from_two_folders_gives_identical_onnx_bytes",),
        why="generator.pt2's bytes followed PYTHONHASHSEED: exports were not reproducible",
    ),
    Mutant(
        "json_escaped_windows_path_missed",
        "export/provenance.py",
        "[A-Za-z]:\\\\\\\\?(?:[^\\\\\\s",
        "[A-Za-z]:\\\\(?:[^\\\\\\s",
        ("test_provenance.py::test_scanner_skips_pt2_weights_and_constants_but_reads_every_text_entry",),
    ),
    Mutant(
        "info_header_printed_twice",
        "cli/info_cmd.py",
        "    click.echo(f\"{header}, runs in {description['precision']}\" if is_model else header)\n",
        "    click.echo(header)\n    click.echo(f\"{header}, runs in {description['precision']}\" if is_model else header)\n",
        ("test_cli.py::test_info_prints_its_header_once",),
        why="gantool info printed its header line twice",
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
        "finished_ddp_worker_tears_down",
        "cli/train_cmd.py",
        "        if result.world_size > 1:\n",
        "        if False:\n",
        ("test_train_faults.py::test_a_finished_worker_runs_no_interpreter_teardown_beside_the_process_groups_threads",),
        why="a worker of a finished run aborted in its teardown beside gloo's threads (CI, SIGABRT)",
        ci=False,
    ),
    Mutant(
        "failed_ddp_worker_tears_down",
        "cli/train_cmd.py",
        '            if os.environ.get("WORLD_SIZE", "1") == "1":\n',
        "            if True:\n",
        ("test_train_faults.py::test_a_failed_worker_runs_no_interpreter_teardown_beside_the_process_groups_threads",),
        ci=False,
    ),
    Mutant(
        "branch_names_a_checkpoint_it_never_wrote",
        "training/loop.py",
        "    last_good = resumed\n",
        "    last_good = run_dir / CHECKPOINTS_DIR / LAST_CHECKPOINT if state is not None else None\n",
        ("test_train_faults.py::test_a_branch_stopped_before_its_first_step_names_no_checkpoint_it_never_wrote",
         "test_train_faults.py::test_a_non_finite_loss_in_a_branch_names_no_checkpoint_it_never_wrote",
         "test_train_faults.py::test_a_run_resumed_from_a_kept_step_checkpoint_names_that_one_as_the_last_good",
         "test_train_faults.py::test_a_branch_that_fails_after_logging_records_no_checkpoint_of_its_own"),
        ci=True,
    ),
    Mutant(
        "ddp_workers_own_error_recorded_as_process_lost",
        "training/launch.py",
        "            _record_failure(folder, line, worker_report(failure)[1])\n",
        "            _record_failure(folder, line)\n",
        ("test_train_faults.py::test_a_non_finite_loss_under_two_processes_is_one_line_and_recorded_as_non_finite",),
        ci=False,
    ),
    Mutant(
        "resume_takes_nan_weights",
        "training/checkpoint.py",
        '    refuse_non_finite_networks(state, f"{path} cannot be resumed")\n',
        "",
        ("test_train_faults.py::test_nan_weights_are_refused_by_resume_and_init_from_before_any_folder",),
        ci=True,
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
        'cfg = cfg.replace(data=normalise_data(cfg.data))  # absolute and normalised: no "sub/.."',
        "pass",
        ("test_train_faults.py::test_relative_data_is_recorded_absolute_and_resume_elsewhere_trains_on_it",),
    ),
    Mutant(
        "data_change_not_refused",
        "training/sources.py",
        "    if not differs:\n        return\n    text",
        "    if True:\n        return\n    text",
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
        "training/readers.py",
        "            if self.bad[i]:\n                continue",
        "            if False:\n                continue",
        ("test_train_faults.py::test_a_truncated_jpeg_is_warned_about_once_and_a_held_out_one_is_not_replaced",
         "test_networks_masks_data.py::test_unreadable_files_are_skipped_and_counted"),
    ),
    # ------------------------------------------------ training data at scale: the index, shards (#43)
    Mutant(
        "data_index_never_stale",
        "training/index.py",
        "            if st.st_mtime_ns != mtime or (size >= 0 and st.st_size != size):",
        "            if False:",
        ("test_data_sources.py::test_a_folder_is_indexed_once_and_the_index_is_reused_until_the_folder_changes",),
        why="an image added to the folder is never seen: the old index is reused",
    ),
    Mutant(
        "data_index_racy_trusted",
        "training/index.py",
        "            if mtime >= self.built_ns - (RACY_COARSE_NS if mtime % 1_000_000_000 == 0 else RACY_NS):",
        "            if False:",
        ("test_data_sources.py::test_an_index_built_right_after_a_change_is_not_trusted",),
        why="a file added in the scan's clock tick would go unnoticed for good",
    ),
    Mutant(
        "unreadable_images_not_kept_across_resume",
        "training/loop.py",
        '"data_unreadable": source.unreadable_indices(),',
        '"data_unreadable": [],',
        ("test_data_sources.py::test_a_member_that_is_not_an_image_is_skipped_counted_and_a_sample_without_one_left_out",),
    ),
    Mutant(
        "shard_member_read_at_the_wrong_offset",
        "training/shards.py",
        "            names.append(member[0])\n            parts.append(part)\n            offsets.append(member[1])",
        "            names.append(member[0])\n            parts.append(part)\n            offsets.append(member[1] - 512)",
        ("test_data_sources.py::test_shards_are_read_at_random_and_match_a_folder_of_the_same_images",),
    ),
    # ------------------------------------------------ the same input means the same thing (issue #23)
    Mutant(
        "mask_colour_by_luma",
        "core/mask_input.py",
        "    level = colour.max(axis=2) if colour.shape[2] else np.zeros(values.shape[:2], np.float32)",
        "    level = colour.mean(axis=2) if colour.shape[2] else np.zeros(values.shape[:2], np.float32)",
        (f"{INPUTS}::test_a_mask_file_a_pil_image_and_an_array_give_the_same_holes",),
        why="a red hole is no hole in a file but one in an array",
    ),
    Mutant(
        "alpha_only_mask_ignored",
        "core/mask_input.py",
        "        level = values[..., -1] if alpha_only else level * opacity",
        "        level = level * opacity",
        (f"{INPUTS}::test_a_mask_file_a_pil_image_and_an_array_give_the_same_holes",),
    ),
    Mutant(
        "animated_image_first_frame",
        "core/processing.py",
        "                if frames > 1:",
        "                if False:",
        (f"{INPUTS}::test_an_animated_gif_is_refused_in_one_line",),
    ),
    Mutant(
        "icc_profile_dropped",
        "inference/inpainter.py",
        "    return keep_colour_profile(image, output_array_to_image(known, mode))",
        "    return output_array_to_image(known, mode)",
        (f"{INPUTS}::test_an_icc_profile_is_kept_in_the_output",),
    ),
    Mutant(
        "short_png_padded",
        "core/png.py",
        "        return (inflated, expected) if inflated < expected else None\n",
        "        return None\n",
        (f"{INPUTS}::test_a_png_whose_data_ends_before_its_last_row_is_refused",),
        why="Pillow pads a PNG whose data ends early with black rows, which were inpainted",
    ),
    Mutant(
        "output_jpg_becomes_a_folder",
        "inference/pipeline.py",
        "    if out is not None and out.suffix.lower() in NOT_PNG_IMAGE_SUFFIXES and not out.is_dir():",
        "    if False:",
        (f"{INPUTS}::test_an_output_named_in_another_image_format_is_refused",),
    ),
    Mutant(
        "skip_existing_ignored_locally",
        "inference/pipeline.py",
        "            if already_done(job, skip_existing, protected):\n                failed.append(skipped(job))",
        "            if False:\n                failed.append(skipped(job))",
        (f"{INPUTS}::test_skip_existing_resumes_a_folder_run",),
    ),
    Mutant(
        "resumed_run_with_nothing_left_exits_1",
        "inference/pipeline.py",
        "        return self.failed == 0 and (self.inpainted > 0 or self.skipped > 0)",
        "        return self.failed == 0 and self.inpainted > 0",
        (f"{INPUTS}::test_skip_existing_resumes_a_folder_run",),
    ),
    Mutant(
        "empty_array_reaches_numpy",
        "inference/inpainter.py",
        "        _check_not_empty(obj.shape[1], obj.shape[0], what)",
        "        pass",
        (f"{INPUTS}::test_an_empty_array_is_one_clear_error",),
    ),
    Mutant(
        "bomb_limit_without_a_way_on",
        "core/processing.py",
        '            "if you trust the file, raise the limit with --max-pixels N (max_pixels= in Python)"',
        '            ""',
        (f"{INPUTS}::test_a_huge_image_over_pillows_limit_says_how_to_proceed",),
    ),
    Mutant(
        "max_pixels_not_applied",
        "core/processing.py",
        "        Image.MAX_IMAGE_PIXELS = (count + 1) // 2",
        "        pass",
        (f"{INPUTS}::test_a_huge_image_over_pillows_limit_says_how_to_proceed",),
    ),
    Mutant(
        "bench_json_infinity",
        "tools/timing.py",
        "        return value if math.isfinite(value) else None",
        "        return value",
        ("test_bench.py::test_json_output_is_strict_json",),
    ),
    Mutant(
        "bench_e2e_size_unchecked",
        "tools/bench_inpaint.py",
        "    if e2e_images and e2e_size < 4:",
        "    if False:",
        ("test_bench.py::test_option_faults_are_one_line_and_only_error_rows_exit_1",),
    ),
    Mutant(
        "bench_error_rows_only_exit_0",
        "cli/bench_cmd.py",
        '    if not result["measured_rows"]:\n        raise click.ClickException(nothing)\n    click.echo(',
        "    if False:\n        raise click.ClickException(nothing)\n    click.echo(",
        ("test_bench.py::test_option_faults_are_one_line_and_only_error_rows_exit_1",),
    ),
    Mutant(
        "bench_unknown_provider_accepted",
        "tools/bench_inpaint.py",
        '        check_choice("provider", p, PROVIDERS)',
        "        pass",
        ("test_bench.py::test_option_faults_are_one_line_and_only_error_rows_exit_1",),
    ),
    Mutant(
        "eval_grid_always_png",
        "tools/evaluate.py",
        "lambda tmp: Image.fromarray(picture).save(tmp, format=grid_format, **extra)",
        'lambda tmp: Image.fromarray(picture).save(tmp, format="PNG", pnginfo=mark)',
        ("test_eval.py::test_the_grid_is_written_in_the_format_its_name_says",),
    ),
    Mutant(
        "ray_address_not_probed",
        "inference/ray.py",
        "        timeout = check_reachable(address, timeout)  # what is left of it bounds ray.init\n",
        "        pass\n",
        (f"{RAYS}::test_an_unreachable_ray_address_fails_within_the_timeout_in_one_line",),
        ci=False,
        why="Ray retries a closed port for minutes",
    ),
    Mutant(
        "ray_answering_port_not_probed",
        "inference/ray_connect.py",
        '    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")  # as Ray reads it',
        "    tls = True",
        (
            f"{RAYS}::test_a_port_that_answers_but_is_not_ray_is_refused_within_the_timeout[silent]",
            f"{RAYS}::test_a_port_that_answers_but_is_not_ray_is_refused_within_the_timeout[http/1.1]",
            f"{RAYS}::test_cli_a_port_that_answers_but_is_not_ray_fails_in_one_line",
        ),
        why="only TCP checked: Ray's handshake with a silent port took 40 s to over 300 s",
    ),
    Mutant(
        "ray_gcs_call_not_made",
        "inference/ray_connect.py",
        "        check_ray_call(address, *target, deadline, timeout, client=client, credentials=credentials)",
        "        pass",
        (
            f"{RAYS}::test_a_port_that_answers_but_is_not_ray_is_refused_within_the_timeout[grpc]",
            f"{RAYS}::test_a_missing_or_wrong_ray_token_is_one_line_not_a_20_s_wait",
        ),
        why="a foreign gRPC server or a missing token: ray.init retries for 20 s",
    ),
    Mutant(
        "compiler_temp_files_in_the_users_tmpdir",
        "export/formats.py",
        '    os.environ["TMPDIR"], tempfile.tempdir = str(scratch), str(scratch)',
        "    pass",
        (f"{ATOMIC}::test_a_kill_9_during_aoti_leaves_only_a_staging_folder_that_the_next_export_removes",),
        ci=False,
        why="a killed --aoti export left the compiler's /tmp/cc*.s files behind",
    ),
    Mutant(
        "torchscript_written_by_torchs_cpp_writer",
        "export/formats.py",
        "            torch.jit.save(traced, buffer, _extra_files={TORCHSCRIPT_METADATA_ENTRY: json.dumps(own)})",
        "            torch.jit.save(traced, str(path), _extra_files={TORCHSCRIPT_METADATA_ENTRY: json.dumps(own)})\n"
        "            buffer.write(path.read_bytes())",
        (
            f"{ATOMIC}::test_a_write_the_kernel_refuses_half_way_is_one_line_not_an_abort[--torchscript-generator.torchscript.pt]",
        ),
        ci=False,
        why="a write refused half-way aborted the process (SIGABRT, exit 134, a C++ stack)",
    ),
    Mutant(
        "pt2_written_by_torchs_cpp_writer",
        "export/formats.py",
        "        torch.export.save(program, buffer, extra_files={PT2_METADATA_ENTRY: json.dumps(own)})",
        "        torch.export.save(program, str(path), extra_files={PT2_METADATA_ENTRY: json.dumps(own)})\n"
        "        buffer.write(path.read_bytes())",
        (f"{ATOMIC}::test_a_write_the_kernel_refuses_half_way_is_one_line_not_an_abort[--pt2-generator.pt2]",),
        ci=False,
        why="a write refused half-way aborted the process (SIGABRT, exit 134, a C++ stack)",
    ),
    Mutant(
        "ray_client_address_checked_only_to_the_greeting",
        "inference/ray_connect.py",
        "    if request is None:",
        "    if request is None or client:",
        (
            f"{RAYS}::test_a_port_that_answers_but_is_not_ray_is_refused_within_the_timeout[ray client, grpc]",
            f"{RAYS}::test_a_port_that_answers_but_is_not_ray_is_refused_within_the_timeout[ray client, http/2]",
        ),
        why="a foreign HTTP/2 or gRPC port passed as a Ray Client server; Ray Client's own wait followed",
    ),
    Mutant(
        "ray_tls_only_tcp_checked",
        "inference/ray_connect.py",
        "        check_ray_call(address, *target, deadline, timeout, client=client, credentials=credentials)",
        "        if not tls:\n"
        "            check_ray_call(address, *target, deadline, timeout, client=client, credentials=credentials)",
        (
            f"{RAYS}::test_with_ray_use_tls_rays_first_call_is_made_over_tls[grpc over tls]",
            f"{RAYS}::test_with_ray_use_tls_rays_first_call_is_made_over_tls[silent]",
        ),
        why="with RAY_USE_TLS only TCP was checked; Ray's handshake waited 20 s or more",
    ),
    Mutant(
        "ray_missing_token_loader_taken_for_no_token",
        "inference/ray_connect.py",
        '        logger.debug("cannot tell which token Ray sends (%s): a refused token is left to ray.init", e)\n'
        "        return None",
        "        return ()",
        (f"{RAYS}::test_a_token_is_checked_only_where_rays_loader_tells_which_it_sends",),
    ),
    Mutant(
        "ray_output_folder_not_locked",
        "inference/ray_connect.py",
        "                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "                pass",
        (f"{RAYS}::test_a_second_run_on_a_locked_output_folder_is_refused",),
        ci=False,
    ),
    Mutant(
        "ray_empty_temp_folder_left",
        "inference/ray_worker.py",
        "        with contextlib.suppress(OSError):  # not empty: another chunk of this run is in progress here\n"
        "            self.tries_dir.rmdir()",
        "        pass",
        (f"{RAYS}::test_no_empty_ray_temp_folders_are_left",),
        ci=False,
    ),
    Mutant(
        "ray_found_output_claimed_as_this_runs",
        "inference/ray_worker.py",
        "                yield (written(job) if retried else skipped(job)), None",
        "                yield written(job), 0.0",
        (f"{RAYS}::test_an_output_written_by_another_process_after_planning_is_kept_and_reported_skipped",),
        ci=False,
    ),
    Mutant(
        "ray_tls_probe_closes_under_grpcs_poller",
        "inference/ray_connect.py",
        "            thread.join(timeout=POLLER_JOIN_S)",
        "            pass",
        (f"{RAYS}::test_with_ray_use_tls_rays_first_call_is_made_over_tls",),
        ci=False,
    ),
    Mutant(
        "ray_skip_existing_ignored",
        "inference/ray.py",
        "        if already_done(job, skip_existing, protected):",
        "        if False:",
        (f"{RAYS}::test_cli_ray_flag",),
        ci=False,
    ),
    Mutant(
        "ray_manifest_calls_written_files_not_processed",
        "inference/manifest.py",
        "                if finished_by_this_run(job, begun, overwrite):",
        "                if False:",
        (f"{RAYS}::test_after_a_signal_the_manifest_lists_every_input_once_in_its_true_state",),
        ci=False,
    ),
    Mutant(
        "ray_interrupted_frames_keep_the_execution",
        "inference/ray.py",
        "                release_interrupted(interrupted, threads_before)",
        "                pass",
        (f"{RAYS}::test_a_signal_between_ray_datas_start_and_its_iteration_stops_the_execution_before_returning",),
        ci=False,
    ),
    Mutant(
        "ray_record_cut_by_a_signal",
        "inference/ray.py",
        "        with signals_deferred():\n            reported.add(str(result.source))",
        "        with contextlib.nullcontext():\n            reported.add(str(result.source))",
        (f"{RAYS}::test_a_signal_while_a_result_is_recorded_still_writes_its_manifest_line",),
        why="a SIGTERM between marking a file reported and writing its line lost the line (CI)",
        ci=False,
    ),
    Mutant(
        "ray_wind_down_cut_by_a_second_signal",
        "inference/ray_connect.py",
        "handlers_installed(dict.fromkeys(STOP_SIGNALS, signal.SIG_IGN))",
        "handlers_installed({signal.SIGINT: signal.SIG_IGN})",
        (f"{RAYS}::test_a_second_signal_of_the_other_kind_during_the_wind_down_leaves_the_manifest_complete",),
        ci=False,
    ),
    Mutant(
        "export_signal_raised_inside_the_trace",
        "export/formats.py",
        "with fx_config.patch(backed_size_oblivious=True), signals_deferred():",
        "with fx_config.patch(backed_size_oblivious=True):",
        (f"{ATOMIC}::test_a_signal_during_torch_exports_trace_is_handled_when_the_trace_ends",),
        why="SIGTERM during `gantool export --onnx` ended in SIGSEGV (CI)",
    ),
    Mutant(
        "ray_sigterm_not_handled",
        "inference/ray_connect.py",
        "{signal.SIGTERM: handler, signal.SIGINT: signal.default_int_handler}",
        "{signal.SIGINT: signal.default_int_handler}",
        (f"{RAYS}::test_after_a_signal_the_manifest_lists_every_input_once_in_its_true_state",),
        ci=False,
    ),
    # ------------------------------------------------------------- serve under hostile clients (#21)
    Mutant(
        "serve_tcp_nodelay_unset",
        "serving/server.py",
        "        set_nodelay(transport)\n        self._header_timer",
        "        self._header_timer",
        (f"{HOSTILE}::test_tcp_nodelay_is_set_on_accepted_connections",),
    ),
    Mutant(
        "serve_slow_body_never_dropped",
        "serving/limits.py",
        "                if left <= 0:",
        "                if False:",
        (f"{HOSTILE}::test_slow_uploads_hold_no_slot_and_are_dropped_at_the_deadline",),
    ),
    Mutant(
        "serve_header_limit_gone",
        "serving/server.py",
        "            if (end < 0 and len(buffered) > self.max_header_bytes) or end > self.max_header_bytes:",
        "            if False:",
        (f"{HOSTILE}::test_headers_over_the_limit_are_431_json",),
    ),
    Mutant(
        "decode_any_format",
        "core/processing.py",
        "            with Image.open(source, formats=DECODE_FORMATS) as img:",
        "            with Image.open(source) as img:",
        (f"{HOSTILE}::test_only_allowed_formats_are_decoded_and_no_program_runs",),
    ),
    Mutant(
        "serve_origin_unchecked",
        "serving/limits.py",
        "            if key != own and key not in self.origin_keys:",
        "            if False:",
        (f"{HOSTILE}::test_host_and_origin_are_checked_before_any_work",),
    ),
    Mutant(
        "file_weights_hash_trusted",
        "runtime/backend.py",
        "        check_file_weights(path, weights, metadata)\n",
        "",
        ("test_model_roles.py::test_a_file_whose_recorded_ids_were_edited_still_cannot_run_other_weights",),
    ),
    Mutant(
        "export_stage_always_beside",
        "core/fileio.py",
        "    inside = target.is_dir()  # on the target's own filesystem either way (see the section's comment)",
        "    inside = False",
        ("test_export_filesystems.py::test_a_stage_for_an_existing_folder_lives_inside_it_and_is_absolute",),
    ),
    Mutant(
        "serve_errors_without_cors",
        "serving/answers.py",
        "    extra += cors_headers(origin, allowed)",
        "    pass",
        ("test_serve_answers.py::test_every_status_carries_the_common_headers",),
    ),
    Mutant(
        "serve_departed_client_computed",
        "serving/app.py",
        "            future.cancel()\n            waiting.cancel()",
        "            waiting.cancel()",
        (f"{HOSTILE}::test_a_client_that_left_costs_no_model_run",),
    ),
    Mutant(
        "blend_charged_per_hole",
        "core/processing.py",
        "    return sum((w + 2 * BLEND_MARGIN) * (h + 2 * BLEND_MARGIN) for _, _, w, h in boxes)",
        "    return len(boxes) * (2 * BLEND_MARGIN + 1) ** 2",
        # The server test catches it too (checked with --only); this one is fast, so CI runs it.
        (f"{HOSTILE}::test_the_blend_is_costed_by_its_regions_area_not_its_hole_count",),
        why="the blend costed per hole: one huge hole (seconds of Poisson solves) passes as one tiny one",
    ),
    Mutant(
        "serve_blend_limit_unchecked",
        "serving/app.py",
        "        return check_cost(cost, max_model_pixels=settings.max_model_pixels, max_blend_pixels=settings.max_blend_pixels)",
        "        return check_cost(cost, max_model_pixels=settings.max_model_pixels)",
        (f"{HOSTILE}::test_a_request_with_one_huge_hole_to_blend_is_refused_before_the_model",),
        why="--max-blend-pixels never checked: a huge hole holds a worker for its whole blend",
    ),
    Mutant(
        "crop_windows_one_merge_pass",
        "inference/planning.py",
        "        if len(merged) == len(current):",
        "        if True:",
        (f"{HOSTILE}::test_crop_windows_match_the_pairwise_merge",),
    ),
    Mutant(
        "serve_second_signal_not_an_exit",
        "serving/server.py",
        "        if self.signal_received is not None:  # the second one",
        "        if False:  # the second one",
        (f"{HOSTILE}::test_a_second_signal_exits_at_once",),
        ci=False,
        why="a second Ctrl-C while requests drain waits for them instead of exiting now",
    ),
    Mutant(
        "serve_arena_not_shrunk",
        "runtime/backends.py",
        '        out = run_releasing_arena(self.session, feeds, "inpainted", shape, on_gpu=self.on_gpu)\n'
        "        return out.astype(np.float32, copy=False)",
        "        return self._run(image, mask)",
        (
            f"{MEMORY}::test_a_releasing_run_gives_the_same_pixels_and_returns_the_arena",
            f"{MEMORY}::test_a_large_request_gives_its_memory_back",
        ),
        why="ONNX Runtime's CPU arena keeps the biggest request's activations: the server stays hundreds of MB larger",
    ),
    Mutant(
        "serve_worker_keeps_last_batch",
        "serving/batcher.py",
        "            self._run(batch)\n"
        "            # Not kept while the next _collect waits: the batch holds its images and the model's output.\n"
        "            del batch",
        "            self._run(batch)",
        (f"{MEMORY}::test_the_model_thread_keeps_no_answered_request_alive",),
        why="the last request's image and model output stay alive until the next request: never trimmed",
    ),
    Mutant(
        "serve_heap_not_trimmed_after_large_request",
        "serving/app.py",
        "background=BackgroundTask(trim_heap) if large else None",
        "background=None",
        (f"{MEMORY}::test_a_large_request_gives_its_memory_back",),
        ci=False,
    ),
    Mutant(
        "serve_model_runs_never_release",
        "serving/batcher.py",
        "strategy, batch_size, self.crop_margin, self.release_memory_pixels)",
        "strategy, batch_size, self.crop_margin, 0)",
        (f"{MEMORY}::test_the_server_releases_through_its_runs_and_leaves_the_callers_backend_alone",),
        why="the server's model runs kept ONNX Runtime's arena grown for good (it set the threshold on "
        "the caller's backend before; now it passes it per run)",
    ),
    Mutant(
        "a_signal_ignored_at_start_is_handled_again",
        "core/signals.py",
        "    handlers = {sig: handler for sig, handler in handlers.items() if sig not in IGNORED_AT_START}\n",
        "",
        ("test_signals.py::test_a_signal_ignored_at_start_stays_ignored_and_the_ddp_agent_leaves_it_alone",),
        why="a run started with `&` in a script stopped on the script's Ctrl-C: gantool installed its own "
        "SIGINT handler over the SIG_IGN it was started with",
    ),
    Mutant(
        "ddp_agent_handles_nohups_hangup",
        "training/launch.py",
        "        signals_to_handle=agent_signals(),\n",
        "",
        ("test_signals.py::test_training_started_with_nohup_in_the_background_of_a_script_ignores_hangup_and_ctrl_c",),
        why="nohup gantool train --nproc-per-node 2 ended when the terminal closed: torch's agent installed "
        "its SIGHUP handler over nohup's SIG_IGN",
    ),
    Mutant(
        "signal_handlers_put_back_after_a_served_signal",
        "core/signals.py",
        "        if restore():",
        "        if True:",
        ("test_signals.py::test_restore_false_keeps_the_handlers",),
        why="serve put the default handlers back once a signal came: a second Ctrl-C while it drained "
        "was a KeyboardInterrupt traceback, not an exit at once",
    ),
    Mutant(
        "bench_ratio_from_medians_not_paired_rounds",
        "tools/interleave.py",
        "    ratios = [n / d for n, d in zip(numerator, denominator) if d > 0]",
        "    ratios = [statistics.median(numerator) / statistics.median(denominator)] if denominator else []",
        ("test_bench.py::test_paired_ratio_cancels_load_that_hits_one_round",),
    ),
    Mutant(
        "bench_rounds_always_in_one_order",
        "tools/interleave.py",
        "        for i in order if r % 2 == 0 else order[::-1]:",
        "        for i in order:",
        ("test_bench.py::test_interleaved_runs_one_call_of_each_row_per_round_alternating_the_order",),
    ),
    Mutant(
        "openvino_fp32_without_the_f32_hint",
        "runtime/openvino.py",
        'PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}',
        'PRECISION_HINTS = {"fp32": "bf16", "bf16": "bf16", "int8": "f32"}',
        ("test_openvino.py::test_precisions_it_cannot_run_are_one_line_refusals",),
    ),
    Mutant(
        "auto_keeps_int8_on_onnx_runtime",
        "runtime/choice.py",
        "    return precision in AUTO_OPENVINO_PRECISIONS and openvino_can_run(provider, precision)",
        "    return False",
        ("test_openvino.py::test_int8_file_runs_within_its_gate_and_known_pixels_stay_exact",),
        why="--precision int8 ran on ONNX Runtime, 2-2.6x slower than OpenVINO on both development CPUs",
    ),
    Mutant(
        "openvino_reads_padded_pools_as_written",
        "runtime/openvino.py",
        "    if not pools_as_convolutions(model):\n",
        "    if True:\n",
        ("test_openvino.py::test_an_int8_file_with_padded_pools_is_rewritten_when_openvino_reads_it",),
        why="an older int8 file's push-pull fill 0.09 off on OpenVINO (its int8 pipeline drops count_include_pad)",
    ),
    Mutant(
        "int8_export_keeps_padded_pools",
        "export/quantize.py",
        "            _pools_as_convolutions(candidate)\n",
        "",
        ("test_export.py::test_a_push_pull_generator_exports_with_parity_in_every_cpu_format",),
        ci=False,  # an export of the push-pull fill: slow tier
        why="the int8 file keeps the average pools that OpenVINO run directly (outside gantool) gets wrong",
    ),
    # ------------------------------------------- a dead rank under --nproc-per-node (#22, item 5)
    Mutant(
        "dead_rank_tie_names_the_survivor",
        "training/launch.py",
        "        return failures[rank].timestamp, failures[rank].exitcode in secondary, rank",
        "        return failures[rank].timestamp, False, rank",
        ("test_distributed.py::test_the_dead_rank_is_named_when_the_survivor_fails_in_the_same_second",),
        why="torch's whole-second tie: rank 0, which only lost contact, named for a killed rank 1",
    ),
    Mutant(
        "dead_peer_not_recognised",
        "training/distributed.py",
        "    return isinstance(error, RuntimeError) and any(mark in text for mark in _PEER_GONE)",
        "    return False",
        ("test_distributed.py::test_a_dead_peer_fails_the_collective_at_once_and_is_recognised",),
        why="gloo's 'Connection closed by peer' (a plain RuntimeError): the survivor's traceback",
    ),
    Mutant(
        "lost_peer_in_the_loop_taken_for_a_stop",
        "training/loop.py",
        "            if dist.enabled and is_collective_failure(e):\n                # Another process",
        "            if False:\n                # Another process",
        (
            "test_train_faults.py::test_nproc_launch_a_killed_rank_is_one_line_with_the_last_checkpoint_which_resumes_exactly",
        ),
        why="the launcher's SIGTERM plus the failed collective read as a signal stop: status.json 'stopped'",
    ),
    Mutant(
        "survivor_speaks_under_the_launcher",
        "cli/train_cmd.py",
        "            if not os.environ.get(LAUNCHER_ENV):",
        "            if True:",
        (
            "test_train_faults.py::test_nproc_launch_a_killed_rank_is_one_line_with_the_last_checkpoint_which_resumes_exactly",
        ),
        why="two error lines for one dead rank (the survivor's, then the launcher's)",
    ),
    Mutant(
        "agent_failure_log_shown",
        "training/launch.py",
        "        logger.setLevel(logging.CRITICAL)",
        "        logger.setLevel(logging.ERROR)",
        (
            "test_train_faults.py::test_nproc_launch_a_killed_rank_is_one_line_with_the_last_checkpoint_which_resumes_exactly",
        ),
        why="torch elastic's 'E... failed (exitcode: -9) local_rank: 1 ...' log line before ours",
    ),
    Mutant(
        "dead_rank_report_without_the_checkpoint",
        "training/launch.py",
        '        line += " " + last_checkpoint_line(folder, nproc)',
        '        line += " The run\'s last checkpoint is in its checkpoints/ folder (resume with --resume .../last.pt)"',
        (
            "test_train_faults.py::test_nproc_launch_a_killed_rank_is_one_line_with_the_last_checkpoint_which_resumes_exactly",
        ),
        why="the old line: no path, no step, no working resume command",
    ),
    Mutant(
        "killed_rank0_leaves_status_running",
        "training/launch.py",
        "            _record_failure(folder, line, worker_report(failure)[1])",
        "            pass",
        (
            "test_train_faults.py::test_nproc_launch_a_killed_rank_is_one_line_with_the_last_checkpoint_which_resumes_exactly[0]",
        ),
        ci=False,  # two DDP runs (slow tier)
        why="kill -9 of rank 0: status.json said running after the launcher had reported the failure",
    ),
    Mutant(
        "stopped_worker_left_stopped",
        "training/launch.py",
        '            if state in "Tt":',
        "            if False:",
        ("test_train_faults.py::test_the_launcher_names_a_stopped_worker_and_resumes_it_once_another_has_ended",),
        why="a SIGSTOPped rank held the agent's SIGTERM pending until its SIGKILL 30 s later",
    ),
    Mutant(
        "stopped_worker_not_named",
        "training/launch.py",
        '            self.stopped = {self.ranks[pid]: pid for pid, state in live.items() if state in "Tt"}',
        "            self.stopped = {}",
        ("test_train_faults.py::test_the_launcher_names_a_stopped_worker_and_resumes_it_once_another_has_ended",),
        why="the line named the rank that waited, not the one that stopped answering",
    ),
    Mutant(
        "stopped_rank_named_as_the_waiter",
        "training/launch.py",
        "    rank = min([r for r in failures if r not in stopped] or failures, key=order)",
        "    rank = min(failures, key=order)",
        ("test_distributed.py::test_the_dead_rank_is_named_when_the_survivor_fails_in_the_same_second",),
        why="rank 0 SIGSTOPped: resumed, it ended in the waiter's second and was named as the one that waited",
    ),
    Mutant(
        "abort_after_rename_names_the_older_checkpoint",
        "training/loop.py",
        "            if _file_id(path) not in (None, before):",
        "            if False:",
        ("test_train_faults.py::test_a_second_signal_just_after_the_checkpoint_was_renamed_reports_that_checkpoint",),
        why="a second signal just after last.pt's rename: the line said step 4 for a last.pt holding step 6",
    ),
    Mutant(
        "collective_timeout_not_applied",
        "training/distributed.py",
        "        if self.enabled and setter is not None:",
        "        if False:",
        ("test_train_faults.py::test_nproc_launch_a_stopped_rank_ends_the_run_within_the_collective_timeout",),
        ci=False,  # a DDP run that then waits out the test's own limit
        why="a hung rank held the others in gloo's default 30-minute timeout",
    ),
    Mutant(
        "amp_auto_choice_not_recorded",
        "training/loop.py",
        "            atomic_write_text(run_dir / RUN_CONFIG_FILE, toml_text({**cfg.to_dict(), **chosen}))",
        "            atomic_write_text(run_dir / RUN_CONFIG_FILE, toml_text(cfg.to_dict()))",
        ("test_amp_compile.py::test_amp_auto_follows_native_bf16_and_the_run_config_records_the_choice",),
        ci=False,
    ),
    Mutant(
        "export_swallowed_signal_still_commits",
        "export/exporter.py",
        "    if stop_requested is not None and stop_requested():",
        "    if False:",
        ("test_atomicity.py::test_a_signal_swallowed_inside_the_exporter_still_stops_before_the_commit",),
    ),
    Mutant(
        "export_interrupt_wrapped_by_an_exporter_is_a_failure",
        "cli/export_cmd.py",
        "        except GantoolError:\n            if not seen:\n                raise\n            _stopped(seen[0])\n",
        "        except GantoolError:\n            raise\n",
        ("test_atomicity.py::test_a_signal_an_exporter_turns_into_its_own_error_still_exits_130_or_143",),
    ),
    Mutant(
        "calib_folder_checked_after_the_export",
        "export/exporter.py",
        "        check_calib_folder(calib)  # before minutes of export, not after them\n",
        "        pass\n",
        ("test_formats.py::test_calib_and_gate_options_fail_in_one_line",),
        why="an empty --calib folder was found only after the ONNX export, with the calibration's own message",
    ),
    Mutant(
        "info_never_says_imported",
        "export/exporter.py",
        "        imported = meta.get(META_TRAIN_PHASE) == IMPORTED_PHASE\n",
        "        imported = False\n",
        ("test_import_downstream.py::test_info_shows_the_architecture_variant_of_an_imported_models_weights",),
    ),
    Mutant(
        "serve_holes_counted_after_the_image_is_decoded",
        "serving/app.py",
        "            if max_holes is not None and not boxes:\n                check_holes(mask, max_holes)",
        "            if False:\n                check_holes(mask, max_holes)",
        (f"{HOSTILE}::test_too_many_holes_are_refused_before_the_image_is_decoded",),
        why="a 1,000-hole upload decoded its whole image before the count refused it (870 ms at 12 MP, not 0.2 s)",
    ),
    Mutant(
        "inpaint_blend_limit_not_applied",
        "inference/pipeline.py",
        "    warning = blend_warning(cost, max_blend_pixels)",
        "    warning = None",
        ("test_inpaint.py::test_a_blend_over_max_blend_pixels_warns_with_its_time_and_still_runs",),
        why="gantool inpaint ran a blend of any size without a word (the server refuses it)",
    ),
    Mutant(
        "openvino_memory_kept_after_a_large_run",
        "runtime/backends.py",
        "        openvino.release_memory(self.compiled)\n        self._local.request = None\n        return out",
        "        return out",
        (f"{MEMORY}::test_a_releasing_openvino_run_returns_its_memory",),
        ci=False,
        why="OpenVINO's CPU plugin kept a large run's buffers for good (90 MB for the tiny model at 1024 px)",
    ),
    Mutant(
        "int8_fallback_ranks_the_least_sensitive_first",
        "export/quantize.py",
        "key=lambda c: errors[c.name])",
        "key=lambda c: -errors[c.name])",
        (f"{INT8_FALLBACK}::test_the_convolution_that_int8_ruins_is_left_in_float",),
        why="int8's float fallback must leave the convolutions with the largest own int8 error in float first",
    ),
    Mutant(
        "int8_fallback_ignores_the_float_cap",
        "export/sensitivity.py",
        "if (sum(c.macs for c in fitting) + conv.macs) / total > max_float_fraction:",
        "if (sum(c.macs for c in fitting) + conv.macs) / total > 1.0:",
        (f"{INT8_FALLBACK}::test_a_model_that_needs_more_than_the_cap_in_float_is_refused_with_the_figures",),
        why="beyond the cap on float multiply-adds int8 buys little: the export must refuse",
    ),
    Mutant(
        "int8_float_nodes_not_recorded",
        "export/quantize.py",
        "props[META_FLOAT_NODES] = json.dumps(floats)",
        "props[META_FLOAT_NODES] = json.dumps([])",
        (f"{INT8_FALLBACK}::test_the_convolution_that_int8_ruins_is_left_in_float",),
        why="the int8 file must say which convolutions run in float",
    ),
    Mutant(
        "int8_conv_error_ignores_its_weights",
        "export/sensitivity.py",
        '            own += _weight_noise(pair["float"], pair["dequantized"], np.mean(power**2, axis=1), conv)\n',
        "",
        (f"{INT8_FALLBACK}::test_the_convolution_that_int8_ruins_is_left_in_float",),
        why="a convolution's own int8 error includes its weights' rounding (small taps under one large tap)",
    ),
    Mutant(
        "int8_relu_not_fused",
        "export/sensitivity.py",
        '{"Relu": lambda x: np.maximum(x, 0)}',
        "{}",
        (f"{INT8_FALLBACK}::test_a_relu_before_a_batchnorm_is_fused_so_every_convolution_stays_int8",),
        why="unfused, a ReLU's input is rounded on its negative range too, which a BN after it magnifies",
    ),
    Mutant(
        "int8_float_convs_input_activation_fused",
        "export/quantize.py",
        "return [c.input_activation for c in floats if c.input_activation is not None]",
        "return []",
        (f"{INT8_FALLBACK}::test_the_convolution_that_int8_ruins_is_left_in_float",),
        why="a fused ReLU feeding a float convolution lets ONNX Runtime quantize that convolution's weights",
    ),
    Mutant(
        "fp32_bound_never_widened",
        "export/parity.py",
        "    return max(atol, FP32_ERROR_MULTIPLE * own_error)",
        "    return atol",
        ("test_parity.py::test_fp32_tolerance_widens_to_the_models_own_fp32_error",),
        why="an ill-conditioned model's exports must be judged against its own fp32 error, not a fixed 1e-4",
    ),
    Mutant(
        "ray_shut_down_under_its_own_threads",
        "inference/ray_connect.py",
        "            thread.join(max(0.0, deadline - time.monotonic()))\n",
        "            pass\n",
        ("test_ray_inpaint.py::test_settling_waits_for_the_runs_threads_but_not_for_parked_ones",),
        why="a Ray Data thread inside a Ray call at ray.shutdown() ends the process with status 1, the manifest unfinished",
    ),
    Mutant(
        "ray_actors_beyond_the_batches",
        "inference/ray.py",
        "        n_actors = min(n_actors, max(1, len(chunks)))\n",
        "",
        ("test_ray_inpaint.py::test_no_more_actors_start_than_there_are_batches",),
        why="an actor without a batch loads the model for nothing (and Ray warns)",
    ),
    Mutant(
        "mlflow_resend_after_a_kill",
        "training/tracking_mlflow.py",
        "if step > self.sent.get(k, -1)",
        "if True",
        ("test_mlflow_tracking.py::test_a_killed_run_resumed_has_every_step_once_and_ends_finished",),
        why="a resume after kill -9 sends the steps after its last checkpoint again: MLflow's history shows them twice",
    ),
    Mutant(
        "mlflow_run_not_reopened_on_resume",
        "training/tracking_mlflow.py",
        "        run = self.client.get_run(record[\"run_id\"])\n        except MlflowException as e:",
        "        run = None\n        except MlflowException as e:",
        ("test_mlflow_tracking.py::test_a_killed_run_resumed_has_every_step_once_and_ends_finished",),
        why="--resume opens a second MLflow run instead of continuing the run folder's",
    ),
    Mutant(
        "model_uri_cache_never_used",
        "runtime/model_uri.py",
        "    return _export_in(entry) if entry.is_dir() else None",
        "    return None",
        ("test_mlflow_models.py::test_a_cached_pinned_uri_needs_no_mlflow_and_no_download",),
        why="every use of models:/NAME/VERSION downloads it again and needs the store",
    ),
]


# Mutants whose tests export a model, train, or start a server and wait on it (tens of seconds
# each): `python tests/mutants.py` runs them, CI's bounded --ci selection leaves them out so
# .ci/run stays well inside its hour.
NOT_IN_CI = {
    "ray_actors_beyond_the_batches",
    "foreign_model_file_accepted",
    "export_id_not_compared",
    "overwrite_deletes_a_users_file",
    "journal_not_rolled_forward",
    "full_disk_names_the_folder",
    "failed_export_leaves_its_folder",
    "ctrl_c_exits_1",
    "onnx_non_finite_weights_run",
    "eager_non_finite_weights_run",
    "openvino_non_finite_weights_run",
    "aoti_non_finite_weights_run",
    "backend_weights_not_checked",
    "int8_only_folder_wants_fp32",
    "truncated_zip_called_a_checkpoint",
    "blocked_pickle_gives_torchs_advice",
    "older_run_export_silent",
    "aoti_library_weights_read_as_text",
    "pt2_range_constraints_in_hash_order",
    "second_signal_still_checkpoints",
    "relative_data_kept_relative",
    "export_stage_always_beside",
    "serve_errors_without_cors",
    "file_weights_hash_trusted",
    "data_change_not_refused",
    "run_inside_run_allowed",
    "untrained_folder_left_behind",
    "bad_image_warned_every_time",
    "icc_profile_dropped",
    "output_jpg_becomes_a_folder",
    "skip_existing_ignored_locally",
    "resumed_run_with_nothing_left_exits_1",
    "bench_json_infinity",
    "bench_e2e_size_unchecked",
    "bench_error_rows_only_exit_0",
    "bench_unknown_provider_accepted",
    "eval_grid_always_png",
    "serve_tcp_nodelay_unset",
    "serve_slow_body_never_dropped",
    "serve_header_limit_gone",
    "decode_any_format",
    "serve_origin_unchecked",
    "serve_departed_client_computed",
    "serve_blend_limit_unchecked",
    "openvino_fp32_without_the_f32_hint",
    "dead_peer_not_recognised",
    "lost_peer_in_the_loop_taken_for_a_stop",
    "survivor_speaks_under_the_launcher",
    "agent_failure_log_shown",
    "dead_rank_report_without_the_checkpoint",
    "serve_holes_counted_after_the_image_is_decoded",
    "inpaint_blend_limit_not_applied",
    # 15-30 s each in .ci/run (session 7): exports at every step, or int8's fallback sweeps.
    "non_finite_output_written",
    "mixed_export_folder_accepted",
    "stale_export_files_kept",
    "calib_folder_checked_after_the_export",
    "export_swallowed_signal_still_commits",
    "int8_fallback_ranks_the_least_sensitive_first",
    "int8_fallback_ignores_the_float_cap",
    "int8_float_nodes_not_recorded",
    "int8_relu_not_fused",
    "int8_float_convs_input_activation_fused",
}
assert {m.name for m in MUTANTS} >= NOT_IN_CI, sorted(NOT_IN_CI - {m.name for m in MUTANTS})
MUTANTS = [replace(m, ci=False) if m.name in NOT_IN_CI else m for m in MUTANTS]


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
    """Every old snippet must occur exactly once in its file, or the list needs updating; the
    error names every mutant that does not, one per line (a refactor often moves several)."""
    problems = []
    for m in mutants:
        path = root / PACKAGE / m.file
        if not path.is_file():
            problems.append(f"mutant {m.name}: file {PACKAGE}/{m.file} not found")
            continue
        count = path.read_text(encoding="utf-8").count(m.old)
        if count == 0:
            problems.append(f"mutant {m.name}: snippet not found in {PACKAGE}/{m.file}")
        elif count > 1:
            problems.append(f"mutant {m.name}: snippet found {count} times in {PACKAGE}/{m.file} (must be unique)")
    if problems:
        raise ListError("\n".join(problems) + "\n- update tests/mutants.py")


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")
    for part in ("toolkit", "tests"):
        shutil.copytree(REPO / part, dest / part, ignore=ignore)
    if (REPO / "models").is_dir():  # the shipped files some tests run (absent from the tests' fake repos)
        shutil.copytree(REPO / "models", dest / "models", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, dest / name)


def run_pytest(
    root: Path, tests: tuple[str, ...] | list[str], stop_at_first: bool = True
) -> tuple[int, str, float, list[str]]:
    """(exit status, pytest's last line, seconds, the ``FAILED``/``ERROR`` lines of its summary)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "toolkit"), str(root / "tests")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # edited and restored files must never meet a stale .pyc
    # Each copy its own pytest temp root: copies run side by side under --jobs.
    (root / "tmp").mkdir(exist_ok=True)
    env["PYTEST_DEBUG_TEMPROOT"] = str(root / "tmp")
    # -m "": a selected test runs even when it is marked slow (addopts leaves the slow tier out).
    command = [sys.executable, "-m", "pytest", *(["-x"] if stop_at_first else []), "-q", "-rfE", "-m", "",
               "-p", "no:cacheprovider", "-p", "no:randomly", *(f"tests/{t}" for t in tests)]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return -1, "timeout", time.perf_counter() - start, []
    lines = [line for line in done.stdout.strip().splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    last = lines[-1] if lines else done.stderr.strip()[-200:]
    return done.returncode, last, time.perf_counter() - start, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--ci", action="store_true", help="the bounded CI selection")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run on the unmodified copy")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="run N mutants at a time (N copies)")
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

    jobs = max(1, args.jobs)
    with tempfile.TemporaryDirectory(prefix="gantool-mutants-") as tmp:
        roots = [Path(tmp) / f"copy{i}" for i in range(jobs)]
        for root in roots:
            copy_tree(root)
        if not args.no_baseline:
            every = list(dict.fromkeys(t for m in mutants for t in m.tests))
            # Not -x: a red baseline names every failing test, not only the first. With --jobs the
            # selections are split by file (a file's tests share their module fixtures).
            files = list(dict.fromkeys(t.split("::")[0] for t in every))
            chunks = [[t for t in every if t.split("::")[0] in files[i::jobs]] for i in range(jobs)]
            chunks = [c for c in chunks if c]
            with ThreadPoolExecutor(len(chunks)) as pool:
                results = list(pool.map(lambda rc: run_pytest(rc[0], rc[1], stop_at_first=False), zip(roots, chunks)))
            code = next((r[0] for r in results if r[0] != 0), 0)
            summary = "; ".join(r[1] for r in results)
            seconds = max(r[2] for r in results)
            failed = [line for r in results for line in r[3]]
            print(f"baseline (unmodified copy, {len(every)} selections): {summary} [{seconds:.0f} s]", flush=True)
            if code != 0:
                print("error: the selected tests fail without any mutant; fix them first:", file=sys.stderr)
                for line in failed or [f"(no test named: pytest exited {code}: {summary})"]:
                    print(f"  {line}", file=sys.stderr)
                return 2 if code in (4, 5) else 1
        free: queue.Queue[Path] = queue.Queue()
        for root in roots:
            free.put(root)

        def run_mutant(m: Mutant) -> tuple[Mutant, int, str, float, str]:
            root = free.get()  # a copy no other thread is editing
            try:
                path = root / PACKAGE / m.file
                original = path.read_text(encoding="utf-8")
                path.write_text(original.replace(m.old, m.new, 1), encoding="utf-8")
                try:
                    code, summary, seconds, _ = run_pytest(root, m.tests)
                finally:
                    path.write_text(original, encoding="utf-8")
            finally:
                free.put(root)
            verdict = "survived" if code == 0 else "caught (timeout)" if code == -1 else "caught"
            print(f"  {m.name}: {verdict} [{seconds:.0f} s]", flush=True)
            return m, code, summary, seconds, verdict

        with ThreadPoolExecutor(jobs) as pool:
            outcomes = list(pool.map(run_mutant, mutants))
        rows, survivors = [], []
        for m, code, summary, seconds, verdict in outcomes:
            if code in (4, 5):  # usage error / nothing collected: the selection is wrong, not the mutant
                print(
                    f"error: mutant {m.name}: its tests could not run ({summary}) - update tests/mutants.py",
                    file=sys.stderr,
                )
                return 2
            if code == 0:
                survivors.append(m.name)
            rows.append((m.name, f"{len(m.tests)} selected; {summary}", verdict, seconds))

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

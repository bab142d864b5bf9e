"""tests/mutants.py itself: a red baseline is reported with the names of its failing tests; --jobs keeps each mutant in its own copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def copy_with_a_red_baseline(dest: Path) -> None:
    """A copy of the checkout in which one selected test of mutant d_alpha_ignored fails without any mutant."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")
    for part in ("toolkit", "tests"):
        shutil.copytree(REPO / part, dest / part, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    with open(dest / "tests" / "test_oracles.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef test_discriminator_loss_is_alpha_times_half_the_bce_sum():\n    assert 1 == 2, 'planted'\n")


@pytest.mark.slow  # developer tooling (not gantool itself): pytest runs in copies of the tree
def test_a_red_baseline_names_its_failing_tests(tmp_path):
    copy_with_a_red_baseline(tmp_path)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "tests" / "mutants.py"), "--only", "d_alpha_ignored"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fix them first" in done.stderr
    assert "FAILED tests/test_oracles.py::test_discriminator_loss_is_alpha_times_half_the_bce_sum" in done.stderr
    assert "caught" not in done.stdout and "survived" not in done.stdout  # no mutant ran on a red baseline


def test_every_mutant_is_well_formed_and_its_snippet_and_tests_exist():
    """All mutants, not only CI's selection: a merge once shifted one mutant's fields by a line, and
    nothing noticed because that mutant is left out of ``--ci``."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import mutants
    finally:
        sys.path.remove(str(REPO / "tests"))
    chosen = mutants.select(None, ci=False)
    mutants.check_snippets(REPO, chosen)  # raises ListError naming every stale mutant
    for m in chosen:
        assert all(isinstance(v, str) for v in (m.name, m.file, m.old, m.new)), m.name
        assert m.tests and all(isinstance(t, str) for t in m.tests), m.name
        for node in m.tests:
            assert (REPO / "tests" / node.split("::")[0]).is_file(), f"{m.name}: {node}"


def test_stale_snippets_are_all_named_at_once(tmp_path):
    """After a refactor several snippets go stale together: the error lists each (missing file,
    snippet gone, snippet repeated), not only the first, so one run shows what to update."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import mutants
    finally:
        sys.path.remove(str(REPO / "tests"))
    package = tmp_path / mutants.PACKAGE
    package.mkdir(parents=True)
    (package / "a.py").write_text("x = 1\ny = 2\ny = 2\n", encoding="utf-8")
    planted = [
        mutants.Mutant("fine", "a.py", "x = 1", "x = 0", ("t.py",)),
        mutants.Mutant("gone", "a.py", "z = 3", "z = 0", ("t.py",)),
        mutants.Mutant("twice", "a.py", "y = 2", "y = 0", ("t.py",)),
        mutants.Mutant("moved", "b.py", "x = 1", "x = 0", ("t.py",)),
    ]
    with pytest.raises(mutants.ListError) as raised:
        mutants.check_snippets(tmp_path, planted)
    lines = str(raised.value).splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["mutant gone", "mutant twice", "mutant moved"]
    assert "found 2 times" in lines[1] and "not found" in lines[2] and "update tests/mutants.py" in lines[-1]
    mutants.check_snippets(tmp_path, planted[:1])  # a matching list passes


@pytest.mark.slow  # developer tooling (not gantool itself): pytest runs in copies of the tree
def test_jobs_run_mutants_side_by_side_each_in_its_own_copy():
    # Four mutants of one file, two at a time: were the copies shared, one job's restore would
    # undo (or its edit leak into) the other's mutant, and one would survive.
    names = ["d_alpha_ignored", "g_alpha_ignored", "psnr_20_log10", "hole_mask_dropped_from_reconstruction"]
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "mutants.py"), "--jobs", "2", "--only", *names],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "baseline (unmodified copy, 4 selections)" in done.stdout
    for name in names:
        assert f"  {name}: caught" in done.stdout, done.stdout
    assert "all 4 mutants caught" in done.stdout


@pytest.mark.slow  # developer tooling (not gantool itself): pytest runs in copies of the tree
def test_a_red_baseline_split_over_jobs_still_names_its_failing_tests(tmp_path):
    copy_with_a_red_baseline(tmp_path)
    # Two files, so each job's baseline chunk holds one of them; the planted failure is in one chunk.
    done = subprocess.run(
        [sys.executable, str(tmp_path / "tests" / "mutants.py"), "--jobs", "2", "--only", "d_alpha_ignored",
         "resume_rng_restore_dropped"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED tests/test_oracles.py::test_discriminator_loss_is_alpha_times_half_the_bce_sum" in done.stderr
    assert "caught" not in done.stdout and "survived" not in done.stdout

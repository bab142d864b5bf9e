"""tests/mutants.py itself: a red baseline is reported with the names of its failing tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_red_baseline_names_its_failing_tests(tmp_path):
    # A copy of the checkout in which one selected test of mutant d_alpha_ignored fails without any mutant.
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")
    for part in ("toolkit", "tests"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "tests" / "test_oracles.py", "a", encoding="utf-8") as f:
        f.write("\n\ndef test_discriminator_loss_is_alpha_times_half_the_bce_sum():\n    assert 1 == 2, 'planted'\n")
    done = subprocess.run(
        [sys.executable, str(tmp_path / "tests" / "mutants.py"), "--only", "d_alpha_ignored"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fix them first" in done.stderr
    assert "FAILED tests/test_oracles.py::test_discriminator_loss_is_alpha_times_half_the_bce_sum" in done.stderr
    assert "caught" not in done.stdout and "survived" not in done.stdout  # no mutant ran on a red baseline

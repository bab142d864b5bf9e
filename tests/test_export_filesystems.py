"""Exports onto other filesystems: a tmpfs mount as the output folder (containers, /dev/shm,
network volumes), a full one, a journal another folder left behind, and relative output paths
whose scratch files a compiler writes from another working directory.

The mounts are real tmpfs mounts; they need root (CI runs as root) and skip elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import TINY_CONFIG, random_generator
from gantool.cli import cli
from gantool.core import fileio
from gantool.training.checkpoint import save_checkpoint


def _state() -> dict:
    generator = random_generator(TINY_CONFIG, seed=1)
    return {"model_config": TINY_CONFIG.to_dict(), "generator": generator.state_dict(), "step": 1, "phase": "g"}


def _can_mount() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs as root)"
    return None


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "16m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


needs_root = pytest.mark.skipif(_can_mount() is not None, reason=str(_can_mount()))


@needs_root
def test_an_export_onto_a_mounted_filesystem_works_and_leaves_no_stage(tmp_path: Path) -> None:
    # Before the fix: "cannot complete the interrupted export into mnt: Invalid cross-device link",
    # with mnt/.gantool-commit.json and a staging folder in the parent left behind.
    checkpoint = save_checkpoint(tmp_path / "run" / "last.pt", _state())
    with tmpfs(tmp_path / "mnt") as mnt:
        assert os.stat(mnt).st_dev != os.stat(tmp_path).st_dev
        runner = CliRunner()
        for extra in ([], ["--overwrite"]):  # a first export, then one over it (a commit through the journal)
            result = runner.invoke(cli, ["export", str(checkpoint), "-o", str(mnt), "--onnx", "--no-verify", *extra])
            assert result.exit_code == 0, result.output
            assert (mnt / "generator.onnx").is_file() and (mnt / "export_report.json").is_file()
            assert _hidden(mnt) == [] and _hidden(tmp_path) == [], (_hidden(mnt), _hidden(tmp_path))
        other = runner.invoke(cli, ["export", str(checkpoint), "-o", str(tmp_path / "other"), "--onnx", "--no-verify"])
        assert other.exit_code == 0, other.output


@needs_root
def test_an_export_onto_a_full_filesystem_says_so_and_leaves_it_empty(tmp_path: Path) -> None:
    checkpoint = save_checkpoint(tmp_path / "run" / "last.pt", _state())
    with tmpfs(tmp_path / "small", size="24k") as small:
        result = CliRunner().invoke(cli, ["export", str(checkpoint), "-o", str(small), "--onnx", "--no-verify"])
        assert result.exit_code == 1, result.output
        assert "No space left on device" in result.output and "interrupted" not in result.output, result.output
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
        assert list(small.iterdir()) == []  # no stage, no journal, no partial file
    assert _hidden(tmp_path) == []
    later = CliRunner().invoke(cli, ["export", str(checkpoint), "-o", str(tmp_path / "b"), "--onnx", "--no-verify"])
    assert later.exit_code == 0, later.output


def test_a_journal_that_cannot_be_completed_blocks_only_its_own_folder(tmp_path: Path, caplog) -> None:
    """A commit into ``broken`` that can never complete (its file's place is taken by a folder)
    leaves ``broken`` as it is and warns; exports into other folders of the same parent go on."""
    # Before the fix, every later export beside it failed with "cannot complete the interrupted export".
    checkpoint = save_checkpoint(tmp_path / "run" / "last.pt", _state())
    broken = tmp_path / "broken"
    (broken / "generator.onnx").mkdir(parents=True)  # os.replace of a file onto a folder fails
    stage = tmp_path / f"{fileio.STAGE_PREFIX}broken.999999999.abcd1234"
    stage.mkdir()
    (stage / "generator.onnx").write_bytes(b"new")
    journal = {"stage": stage.name, "install": ["generator.onnx"], "remove": [], "pid": 999999999}
    (broken / fileio.JOURNAL_NAME).write_text(json.dumps(journal))
    out = tmp_path / "other"
    result = CliRunner().invoke(cli, ["export", str(checkpoint), "-o", str(out), "--onnx", "--no-verify"])
    assert result.exit_code == 0, result.output
    assert (out / "generator.onnx").is_file()
    assert (broken / fileio.JOURNAL_NAME).is_file() and stage.is_dir()  # its own business, kept for a retry
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"cannot complete the interrupted export into {broken}" in w for w in warned), warned


def test_a_stage_for_an_existing_folder_lives_inside_it_and_is_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("out").mkdir()
    with fileio.staged_folder(Path("out")) as stage:
        assert stage.is_absolute() and stage.parent == (tmp_path / "out")
        (stage / "a.bin").write_bytes(b"1")
        fileio.commit_staged_folder(stage, Path("out"), remove=[])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.bin"]
    with fileio.staged_folder(Path("new")) as stage:  # no target yet: beside it, in its parent
        assert stage.is_absolute() and stage.parent == tmp_path
        (stage / "b.bin").write_bytes(b"2")
        fileio.commit_staged_folder(stage, Path("new"), remove=[])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "out"]


def test_a_stage_left_inside_a_folder_by_a_killed_export_is_removed_by_the_next(tmp_path: Path) -> None:
    checkpoint = save_checkpoint(tmp_path / "run" / "last.pt", _state())
    out = tmp_path / "out"
    out.mkdir()
    leftover = out / f"{fileio.STAGE_PREFIX}.999999999.abcd1234"  # a dead writer's stage inside its target
    leftover.mkdir()
    (leftover / "generator.onnx").write_bytes(b"half")
    old = os.path.getmtime(leftover) - 2 * fileio.STALE_TMP_SECONDS
    os.utime(leftover, (old, old))
    result = CliRunner().invoke(cli, ["export", str(checkpoint), "-o", str(out), "--onnx", "--no-verify"])
    assert result.exit_code == 0, result.output
    assert _hidden(out) == []


@pytest.mark.slow  # an AOTInductor compile: a minute or more on 2 cores
def test_aoti_export_with_a_relative_output_from_another_directory(tmp_path: Path, subprocess_env) -> None:
    # Before the fix: "AOTInductor compile for cpu failed: CppCompileError" (the compiler, run in
    # another directory, could not open the relative staging folder's header.i).
    import sys

    save_checkpoint(tmp_path / "my run" / "last.pt", _state())
    work = tmp_path / "wörk dir"
    work.mkdir()
    command = [sys.executable, "-m", "gantool", "export", "../my run/last.pt", "-o", "ex", "--aoti", "--onnx"]
    done = subprocess.run(command, cwd=work, env=subprocess_env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "ex" / "generator.aoti.pt2").is_file() and (work / "ex" / "generator.onnx").is_file()
    assert _hidden(work / "ex") == [] and _hidden(work) == []

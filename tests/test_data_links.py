"""Data folders assembled from links: folder links are followed (once each, whatever the loops),
counted and reported; the recorded data path is absolute and normalised."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from gantool.cli import cli
from gantool.training.data import ImageFolderSource, scan_images
from tiny import TINY_ARGS

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="needs POSIX symlinks")


def _images(folder: Path, count: int, prefix: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(prefix) + count)
    for i in range(count):
        Image.fromarray((rng.random((40, 40, 3)) * 255).astype(np.uint8)).save(folder / f"{prefix}{i}.png")


def test_a_linked_folder_is_read_and_counted(tmp_path: Path) -> None:
    # Before the fix a folder of 2 images plus a link to a folder of 3 trained on 2 (rglob skips dir links).
    _images(tmp_path / "data", 2, "a")
    _images(tmp_path / "elsewhere" / "more", 3, "b")  # outside the data folder: fine
    (tmp_path / "data" / "more").symlink_to(tmp_path / "elsewhere" / "more")
    scan = scan_images(tmp_path / "data")
    assert [p.relative_to(tmp_path / "data").as_posix() for p in scan.paths] == [
        "a0.png", "a1.png", "more/b0.png", "more/b1.png", "more/b2.png"
    ]  # fmt: skip
    assert scan.linked == 3 and scan.repeated == []


def test_loops_and_second_links_are_walked_once(tmp_path: Path) -> None:
    _images(tmp_path / "data" / "sub", 2, "a")
    (tmp_path / "data" / "sub" / "up").symlink_to(tmp_path / "data")  # a link to an ancestor
    (tmp_path / "data" / "again").symlink_to(tmp_path / "data" / "sub")  # a second name for sub
    _images(tmp_path / "x", 1, "c")
    _images(tmp_path / "y", 1, "d")
    (tmp_path / "x" / "to_y").symlink_to(tmp_path / "y")
    (tmp_path / "y" / "to_x").symlink_to(tmp_path / "x")  # a cycle between two folders
    (tmp_path / "data" / "x").symlink_to(tmp_path / "x")
    scan = scan_images(tmp_path / "data")
    names = sorted(p.name for p in scan.paths)
    assert names == ["a0.png", "a1.png", "c0.png", "d0.png"], names  # each image once
    assert len(scan.repeated) == 3  # sub/up, sub (second name) and x/to_y/to_x
    source = ImageFolderSource(tmp_path / "data")
    assert len(source) == 4 and source.linked == 4  # "again" sorts first: sub is read through it


def _train(data: str, out: str):
    args = ["train", "--data", data, *TINY_ARGS, "--steps-g", "1", "--steps-d", "0", "--steps-joint", "0",
            "--val-images", "1", "--out", out]  # fmt: skip
    return CliRunner().invoke(cli, args)


def test_training_reads_linked_folders_and_records_a_normalised_data_path(tmp_path: Path, monkeypatch, caplog) -> None:
    # Before the fix: 2 files recorded, and the data path kept "sub/..".
    _images(tmp_path / "proj" / "data", 2, "a")
    _images(tmp_path / "shared", 3, "b")
    (tmp_path / "proj" / "data" / "linked").symlink_to(tmp_path / "shared")
    (tmp_path / "proj" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    caplog.set_level("INFO")
    result = _train("sub/../data", "run")
    assert result.exit_code == 0, result.output
    state = torch.load(tmp_path / "proj" / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["data"]["files"] == 5
    recorded = str(tmp_path.resolve() / "proj" / "data")
    assert state["data"]["path"] == recorded and state["train_config"]["data"] == recorded
    assert any("3 of 5 image(s) came through folder links" in r.getMessage() for r in caplog.records)

"""Atomic writes: temp files with a recognisable prefix, leftovers of killed writes
removed, one-line errors on a full disk, the previous file intact, umask respected."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import pytest

from gantool.core import fileio
from gantool.core.errors import InputError
from gantool.core.fileio import TMP_PREFIX, atomic_save, atomic_write_text


@pytest.fixture(autouse=True)
def fresh_sweep(monkeypatch):
    monkeypatch.setattr(fileio, "_swept", set())


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_dead_writers_are_removed_but_a_live_writers_temp_is_kept(
    tmp_path,
):
    dead = tmp_path / f"{TMP_PREFIX}last.pt.{dead_pid()}.0a1b2c3d"
    dead.write_bytes(b"half a checkpoint")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f"{TMP_PREFIX}last.pt.{sleeper.pid}.0a1b2c3d"
        live.write_bytes(b"being written right now")
        mine = tmp_path / f"{TMP_PREFIX}other.png.{os.getpid()}.0a1b2c3d"  # another thread of this process
        mine.write_bytes(b"x")
        user = tmp_path / ".notes.txt.tmp"
        user.write_text("not ours")
        atomic_write_text(tmp_path / "config.toml", "a = 1\n")
        assert not dead.exists()
        assert live.exists() and mine.exists() and user.exists()
        assert (tmp_path / "config.toml").read_text() == "a = 1\n"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_temp_files_carry_the_prefix(tmp_path):
    seen = []

    def save(tmp):
        seen.append(tmp.name)
        tmp.write_bytes(b"x")

    atomic_save(tmp_path / "model.onnx", save)
    assert seen[0].startswith(f"{TMP_PREFIX}model.onnx.{os.getpid()}.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@pytest.mark.parametrize(
    "code, words",
    [(errno.ENOSPC, "No space left on device"), (errno.EACCES, "Permission denied")],
)
def test_a_failed_write_is_one_line_naming_the_path_and_keeps_the_old_file(tmp_path, code, words):
    target = tmp_path / "last.pt"
    target.write_bytes(b"the previous checkpoint")

    def failing(tmp):
        tmp.write_bytes(b"half")
        raise OSError(code, os.strerror(code))

    with pytest.raises(InputError) as info:
        atomic_save(target, failing)
    message = str(info.value)
    assert str(target) in message and words in message and "\n" not in message
    assert target.read_bytes() == b"the previous checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_save_checkpoint_on_a_full_disk_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    import torch

    from gantool.training.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint(path, {"model_config": {}, "generator": {}, "step": 1, "phase": "g"})

    def full(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(InputError, match=r"cannot write .*last\.pt: No space left on device"):
        save_checkpoint(path, {"model_config": {}, "generator": {}, "step": 2, "phase": "g"})
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1


def test_files_get_the_umask_permissions_and_the_umask_is_never_changed(tmp_path, monkeypatch):
    calls = []
    real_umask = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real_umask(mask))
    old = real_umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        real_umask(old)
    assert calls == []  # no process-wide umask flip (writes run on background threads)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o640


def test_concurrent_writes_from_threads_all_land(tmp_path):
    def write(i: int) -> None:
        for k in range(20):
            atomic_write_text(tmp_path / f"f{i}.txt", f"{i}-{k}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"f{i}.txt" for i in range(4)]
    assert all((tmp_path / f"f{i}.txt").read_text() == f"{i}-19" for i in range(4))

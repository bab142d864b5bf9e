"""Training data at scale (#43): the data index, list files, WebDataset shards (written here by
webdataset's own writers and by ``gantool data pack``), ``gantool data check``, and the bad inputs
of each, one line apiece."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from click.testing import CliRunner
from PIL import Image

import gantool.training.index as index_module
from gantool.cli import cli
from gantool.core.errors import InputError
from gantool.training.checkpoint import load_checkpoint
from gantool.training.data import InpaintingDataset
from gantool.training.index import INDEX_DIR, RUN_INDEX_FILE, beside_data_path, scan_folder
from gantool.training.loop import train
from gantool.training.shards import MANIFEST_NAME, ShardSource
from gantool.training.sources import ImageFolderSource, ImageListSource, open_source
from tiny import TINY_ARGS, tiny_train_config


def run_cli(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_line(result, fragment: str) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and fragment.lower() in lines[0].lower(), result.output
    return lines[0]


def photos(folder: Path, count: int, size: tuple[int, int] = (40, 48)) -> Path:
    """``count`` noise images, PNG and JPEG alternately, a third of them in a subfolder."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        pixels = np.random.default_rng(i).integers(0, 256, (*size, 3), dtype=np.uint8)
        sub = folder / "sub" if i % 3 == 0 else folder
        sub.mkdir(exist_ok=True)
        Image.fromarray(pixels).save(sub / f"p{i:02d}.{'jpg' if i % 2 else 'png'}")
    return folder


def png_bytes(seed: int, size: tuple[int, int] = (40, 48)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def write_shards(folder: Path, count: int, per_shard: int, extra: dict | None = None) -> str:
    """``count`` samples (a PNG and a JSON member each) in shards of ``per_shard``; returns the brace pattern."""
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "train-%06d.tar"), maxcount=per_shard, verbose=0) as writer:
        for i in range(count):
            writer.write({"__key__": f"{i:06d}", "png": png_bytes(i), "json": json.dumps({"i": i}).encode(),
                          **(extra or {})})  # fmt: skip
    last = len(list(folder.glob("train-*.tar"))) - 1
    return str(folder / f"train-{{000000..{last:06d}}}.tar")


def age(folder: Path, seconds: float = 10.0) -> None:
    """Move every folder's mtime into the past: an index built now is then not 'racy'."""
    then = time.time() - seconds
    for path in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        os.utime(path, (then, then))


def samples(source, keys) -> list[tuple[torch.Tensor, ...]]:
    dataset = InpaintingDataset(source, 32, 16, "mixed")
    return [dataset[k] for k in keys]


# ------------------------------------------------------------------ the index


def test_a_folder_is_indexed_once_and_the_index_is_reused_until_the_folder_changes(tmp_path, monkeypatch):
    data = photos(tmp_path / "data", 9)
    age(data)
    first = ImageFolderSource(data, keep_index=True)
    kept = beside_data_path(data.resolve(), "folder", str(data.resolve()))
    assert kept.is_file() and kept.parent.name == INDEX_DIR
    scans = []
    real_scan = index_module.scan_folder
    monkeypatch.setattr(index_module, "scan_folder", lambda *a, **k: scans.append(a) or real_scan(*a, **k))
    again = ImageFolderSource(data, keep_index=True)
    assert scans == [] and list(again.paths) == list(first.paths)  # reused: nothing walked or stat'ed
    assert again.fingerprint() == first.fingerprint()
    Image.new("RGB", (40, 40)).save(data / "sub" / "new.png")  # the sub folder's mtime changes
    grown = ImageFolderSource(data, keep_index=True)
    assert len(scans) == 1 and len(grown) == 10 and grown.fingerprint() != first.fingerprint()
    assert not (data / INDEX_DIR / "new.png").exists() and INDEX_DIR not in {p.parts[-2] for p in grown.paths}


def test_an_index_built_right_after_a_change_is_not_trusted(tmp_path, monkeypatch):
    data = photos(tmp_path / "data", 4)  # written just now: within the racy window of the scan
    ImageFolderSource(data, keep_index=True)
    scans = []
    real_scan = index_module.scan_folder
    monkeypatch.setattr(index_module, "scan_folder", lambda *a, **k: scans.append(a) or real_scan(*a, **k))
    monkeypatch.setattr(index_module, "RACY_NS", 10**12)  # as if the file system ticked in 1000 s steps
    ImageFolderSource(data, keep_index=True)
    assert len(scans) == 1


def test_the_folder_fingerprint_is_the_one_checkpoints_recorded_before_the_index(tmp_path):
    import hashlib

    data = photos(tmp_path / "data", 7)
    digest, total, files = hashlib.sha256(), 0, sorted(p for p in data.rglob("*") if p.is_file())
    for path in files:  # what ImageFolderSource.fingerprint computed before #43
        st = path.stat()
        total += st.st_size
        digest.update(path.relative_to(data).as_posix().encode() + b"\0" + f"{st.st_size}:{st.st_mtime_ns}".encode() + b"\n")
    expected = {"path": str(data.resolve()), "files": 7, "bytes": total, "sha256": digest.hexdigest()}
    assert ImageFolderSource(data).fingerprint() == expected


def test_a_read_only_data_folder_trains_and_the_resume_reads_the_run_folders_index(tmp_path, monkeypatch):
    data = photos(tmp_path / "data", 8)
    (data / INDEX_DIR).write_text("in the way: no index can be kept beside the data")
    age(data)
    cfg = tiny_train_config(data=str(data), out=str(tmp_path / "run"), steps_g=4, steps_d=0, steps_joint=0,
                            val_images=1, checkpoint_every=2)  # fmt: skip
    half = train(cfg, stop_after=2, progress=False)
    assert (half.run_dir / RUN_INDEX_FILE).is_file()
    monkeypatch.setattr(index_module, "scan_folder", lambda *a, **k: pytest.fail("the folder was scanned again"))
    resumed = train({}, resume=half.last_checkpoint, progress=False)
    assert resumed.step == 4


def _os_walk_scan(root: Path) -> tuple[list[Path], int, list[Path]]:
    """What scan_images did before the index (os.walk, one thread): the oracle."""
    found, linked_dirs, seen, repeated, linked = [], set(), set(), [], 0
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            repeated.append(Path(folder))
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        via_link = folder in linked_dirs
        for name in dirs:
            child = os.path.join(folder, name)
            if via_link or os.path.islink(child):
                linked_dirs.add(child)
        for name in files:
            path = Path(folder, name)
            if path.suffix.lower() in (".png", ".jpg") and path.is_file():
                found.append(path)
                linked += via_link or path.is_symlink()
    return sorted(found), linked, repeated


def test_the_parallel_scan_walks_as_os_walk_did(tmp_path):
    data = tmp_path / "data"
    for i, rel in enumerate(["b/x.png", "a/y.png", "a-c/z.png", "a/b/w.png", "top.png", "A/u.PNG", "notes.txt",
                             "b/deep/er/v.jpg"]):  # fmt: skip
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(png_bytes(i) if rel.lower().endswith((".png", ".jpg")) else b"text")
    (data / "a" / "loop").symlink_to(data, target_is_directory=True)  # a cycle
    (data / "again").symlink_to(data / "b", target_is_directory=True)  # sorts before b: it walks b's files
    (data / "b" / "up").symlink_to(data / "a-c", target_is_directory=True)
    (data / "top link.png").symlink_to(data / "top.png")
    (data / "broken.png").symlink_to(data / "gone.png")
    index = scan_folder(data, threads=4)
    paths, linked, repeated = _os_walk_scan(data)
    assert [data / n for n in index.names] == paths
    assert index.linked == linked and sorted(index.repeated) == sorted(str(r) for r in repeated)
    assert "again/x.png" in list(index.names) and len(repeated) == 3  # b, a/loop and b/up (a-c walked first)


# ------------------------------------------------------------------ list files


def test_a_list_file_names_images_relative_to_its_folder_from_any_directory(tmp_path, monkeypatch):
    data = photos(tmp_path / "proj" / "images", 6)
    listing = tmp_path / "proj" / "train list.txt"
    names = ["images/p01.jpg", "images/sub/p00.png", "# a comment", "", "images/p05.jpg", str(data / "p02.png")]
    listing.write_text("\n".join(names) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    source = open_source("proj/train list.txt")
    assert isinstance(source, ImageListSource) and len(source) == 4  # the list's order, comments left out
    assert [p.name for p in source.paths] == ["p01.jpg", "p00.png", "p05.jpg", "p02.png"]
    assert source.fingerprint()["kind"] == "list"
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    result = run_cli("train", "--data", "../proj/train list.txt", "--out", "run", *TINY_ARGS, "--steps-g", "2",
                     "--steps-d", "0", "--steps-joint", "0", "--val-images", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    state = load_checkpoint(other / "run" / "checkpoints" / "last.pt")
    assert state["data"]["path"] == str(listing.resolve()) and state["data"]["files"] == 4


def test_a_list_naming_missing_files_is_one_line(tmp_path):
    photos(tmp_path / "images", 2)
    listing = tmp_path / "list.txt"
    listing.write_text("images/sub/p00.png\nimages/gone.png\nimages/also-gone.jpg\n")
    line = one_line(run_cli("train", "--data", listing, *TINY_ARGS, "--out", tmp_path / "run"), "2 file(s)")
    assert "line 2: images/gone.png" in line and not (tmp_path / "run").exists()


# ------------------------------------------------------------------ shards


def test_shards_are_read_at_random_and_match_a_folder_of_the_same_images(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(10):
        (folder / f"{i:06d}.png").write_bytes(png_bytes(i))
    pattern = write_shards(tmp_path / "shards", 10, per_shard=4)
    shards = open_source(pattern)
    assert isinstance(shards, ShardSource) and len(shards) == 10 and len(shards.index.shards) == 3
    keys = [(i, 1000 + i) for i in (7, 0, 9, 3, 3)]
    for a, b in zip(samples(shards, keys), samples(ImageFolderSource(folder), keys)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    # a list of the shard files, and '::'-joined patterns, name the same samples
    (tmp_path / "shards.txt").write_text("shards/train-000000.tar\nshards/train-000001.tar\nshards/train-000002.tar\n")
    assert len(open_source(str(tmp_path / "shards.txt"))) == 10
    joined = f"{tmp_path}/shards/train-000000.tar::{tmp_path}/shards/train-{{000001..000002}}.tar"
    assert open_source(joined).fingerprint()["sha256"] == shards.fingerprint()["sha256"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path]:
    """A folder of 14 images and ``gantool data pack`` of it into small shards."""
    root = tmp_path_factory.mktemp("packed")
    folder = photos(root / "photos", 14)
    (folder / "notes.png").write_text("not an image")  # left out by pack, named in the manifest
    result = run_cli("data", "pack", folder, "-o", root / "shards", "--shard-size", "12kB", "--quiet")
    assert result.exit_code == 0, result.output
    return folder, root / "shards"


def test_data_pack_writes_shards_a_manifest_and_their_index(packed, tmp_path):
    folder, out = packed
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["images"] == 14 and manifest["skipped"] == {"count": 1, "first": ["notes.png"]}
    assert len(manifest["shards"]) > 2 and sum(s["images"] for s in manifest["shards"]) == 14
    assert manifest["source"]["path"] == str(folder.resolve())
    tars = sorted(p.name for p in out.glob("*.tar"))
    assert tars == [s["name"] for s in manifest["shards"]]
    with tarfile.open(out / tars[0]) as tar:  # stored as it was: the first image's bytes, unchanged
        first = tar.getmembers()[0]
        assert first.name == "000000000.jpg"  # p01.jpg sorts first (p00 is in sub/)
        assert tar.extractfile(first).read() == (folder / "p01.jpg").read_bytes()
    source = open_source(str(out))
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.*") if p.name != "notes.png")
    ordered = sorted(names, key=lambda n: n.split("/"))
    for i in (0, 5, 13):
        assert source.read_bytes(i) == (folder / ordered[i]).read_bytes()
    assert any((out / INDEX_DIR).glob("index-shards-*.json"))  # the first run on them reads this
    # never into an existing folder's files
    line = one_line(run_cli("data", "pack", folder, "-o", out, "--quiet"), "is not empty")
    assert str(out) in line


def test_a_run_on_packed_shards_trains_as_on_the_folder_and_resumes_bitwise_after_kill_9(
    packed, tmp_path, subprocess_env
):
    folder, out = packed
    common = [*TINY_ARGS, "--steps-g", "3", "--steps-d", "1", "--steps-joint", "8", "--val-images", "2",
              "--checkpoint-every", "2", "--log-every", "1", "--sample-every", "100", "--no-keep-checkpoints"]  # fmt: skip
    straight = run_cli("train", "--data", out, "--out", tmp_path / "a", *common)
    assert straight.exit_code == 0, straight.output
    images = sorted((p.relative_to(folder).as_posix() for p in folder.rglob("p*.*")), key=lambda n: n.split("/"))
    (tmp_path / "photos.txt").write_text("".join(f"{folder / n}\n" for n in images))  # what pack packed, in order
    on_folder = run_cli("train", "--data", tmp_path / "photos.txt", "--out", tmp_path / "f", *common)
    assert on_folder.exit_code == 0, on_folder.output
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    f = load_checkpoint(tmp_path / "f" / "checkpoints" / "last.pt")
    assert a["data"]["kind"] == "shards" and a["data"]["files"] == 14 and a["step"] == 12
    for key, tensor in a["generator"].items():  # the same images in the same order: the same run
        assert torch.equal(tensor, f["generator"][key]), key
    # the same run killed (SIGKILL: no handler runs) after its first checkpoint, then resumed
    cmd = [sys.executable, "-m", "gantool", "train", "--data", str(out), "--out", str(tmp_path / "b"), *common]
    cmd[cmd.index("--steps-joint") + 1] = "100000"  # it runs until killed
    proc = subprocess.Popen(cmd, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last = tmp_path / "b" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 180
    while not last.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=60)
    killed_at = load_checkpoint(last)["step"]
    assert 2 <= killed_at < 12, killed_at
    result = run_cli("train", "--resume", last, "--steps-joint", "8", "--quiet")
    assert result.exit_code == 0, result.output
    b = load_checkpoint(last)
    assert b["step"] == 12
    for name in ("generator", "discriminator"):
        for key, tensor in a[name].items():
            assert torch.equal(tensor, b[name][key]), f"{name}.{key} differs after kill -9 and resume"


def test_bad_shards_are_one_line_each(tmp_path):
    pattern = write_shards(tmp_path / "s", 6, per_shard=3)
    tiny = [*TINY_ARGS, "--out", tmp_path / "run"]
    one_line(run_cli("train", "--data", str(tmp_path / "s" / "train-{000000..000004}.tar"), *tiny),
             "3 of the 5 shards")  # fmt: skip
    one_line(run_cli("train", "--data", str(tmp_path / "none" / "train-{000000..000001}.tar"), *tiny),
             "matches no existing shard")  # fmt: skip
    one_line(run_cli("train", "--data", str(tmp_path / "s" / "val-*.tar"), *tiny), "matches no shard")
    raw = (tmp_path / "s" / "train-000001.tar").read_bytes()
    (tmp_path / "s" / "train-000001.tar").write_bytes(raw[: len(raw) // 3])  # an interrupted download
    line = one_line(run_cli("train", "--data", pattern, *tiny), "truncated")
    assert "train-000001.tar" in line
    import gzip

    (tmp_path / "z.tar").write_bytes(gzip.compress(raw))
    one_line(run_cli("train", "--data", tmp_path / "z.tar", *tiny), "compressed shards cannot be read at random")
    assert not (tmp_path / "run").exists()


def test_a_member_that_is_not_an_image_is_skipped_counted_and_a_sample_without_one_left_out(tmp_path, caplog):
    folder = tmp_path / "s"
    folder.mkdir()
    with wds.TarWriter(str(folder / "train-000000.tar")) as writer:
        for i in range(8):
            writer.write({"__key__": f"{i:06d}", "png": b"not a png" if i == 2 else png_bytes(i)})
        writer.write({"__key__": "meta", "json": b"{}"})  # no image member at all
    run = tmp_path / "run"
    result = run_cli("train", "--data", folder / "train-000000.tar", "--out", run, *TINY_ARGS, "--steps-g", "6",
                     "--steps-d", "0", "--steps-joint", "0", "--val-images", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    status = json.loads((run / "status.json").read_text())
    assert status["unreadable_images"] == 1 and status["first_unreadable"].endswith("train-000000.tar:000002.png")
    messages = [r.getMessage() for r in caplog.records]
    assert any("hold no image member" in m and "meta" in m for m in messages), messages
    assert sum("skipping unreadable image" in m for m in messages) == 1
    summary = run_cli("runs", run)
    assert "1 unreadable image(s) skipped" in summary.output, summary.output
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["data_unreadable"] == [2]


def test_a_shard_set_changed_under_a_resumed_run_is_refused_unless_allowed(tmp_path):
    pattern = write_shards(tmp_path / "s", 8, per_shard=4)
    cfg = tiny_train_config(data=pattern, out=str(tmp_path / "run"), steps_g=4, steps_d=0, steps_joint=0,
                            val_images=1, checkpoint_every=2)  # fmt: skip
    half = train(cfg, stop_after=2, progress=False)
    write_shards(tmp_path / "s", 9, per_shard=4)  # re-written with one more sample: a third shard
    grown = str(tmp_path / "s" / "train-{000000..000002}.tar")
    line = one_line(run_cli("train", "--resume", half.last_checkpoint, "--data", grown, "--quiet"), "data differs")
    assert "8 -> 9 shard samples" in line and "--allow-data-change" in line
    write_shards(tmp_path / "s", 8, per_shard=4, extra={"txt": b"caption"})  # same count, other members
    line = one_line(run_cli("train", "--resume", half.last_checkpoint, "--quiet"), "data differs")
    assert "members, offsets or sizes changed" in line or "bytes" in line
    result = run_cli("train", "--resume", half.last_checkpoint, "--allow-data-change", "--quiet")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------ gantool data check


def test_data_check_reports_counts_unreadable_images_missing_files_and_broken_shards(tmp_path, packed):
    _, out = packed
    result = run_cli("data", "check", out, "--quiet", "--json")
    report = json.loads(result.output)
    assert result.exit_code == 0 and report["ok"] and report["entries"] == 14 and report["shards"] > 2
    folder = photos(tmp_path / "f", 4)
    raw = (folder / "p01.jpg").read_bytes()
    (folder / "p01.jpg").write_bytes(raw[: len(raw) // 2])
    result = run_cli("data", "check", folder, "--quiet")
    assert result.exit_code == 1 and "1 unreadable image(s)" in result.output and "p01.jpg" in result.output
    (tmp_path / "l.txt").write_text("f/sub/p00.png\nf/missing.png\n")
    report = json.loads(run_cli("data", "check", tmp_path / "l.txt", "--json").output)
    assert report["missing"] == 1 and report["missing_first"] == ["line 2: f/missing.png"] and not report["ok"]
    shards = tmp_path / "s"
    shards.mkdir()
    for name in ("a.tar", "b.tar"):
        (shards / name).write_bytes((out / "train-000000.tar").read_bytes())
    (shards / "b.tar").write_bytes((shards / "b.tar").read_bytes()[:3000])
    report = json.loads(run_cli("data", "check", str(shards / "*.tar"), "--json").output)
    assert len(report["broken_shards"]) == 1 and "b.tar" in report["broken_shards"][0] and report["entries"] > 0


def test_a_killed_pack_leaves_no_output_and_a_second_pack_succeeds(tmp_path, subprocess_env):
    folder = photos(tmp_path / "photos", 5)
    out = tmp_path / "shards"
    env = dict(subprocess_env, GANTOOL_TEST_KILL_AT="rename")
    cmd = [sys.executable, "-m", "gantool", "data", "pack", str(folder), "-o", str(out), "--quiet"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9 and not out.exists()
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / MANIFEST_NAME).read_text())["images"] == 5
    assert not any(p.name.startswith(".gantool-stage") for p in tmp_path.iterdir())


@pytest.mark.parametrize("value, fragment", [("0", "at least one byte"), ("12XB", "not a size"), ("-5MB", "not a size")])
def test_bad_shard_sizes_are_one_line(tmp_path, value, fragment):
    photos(tmp_path / "p", 1)
    one_line(run_cli("data", "pack", tmp_path / "p", "-o", tmp_path / "o", "--shard-size", value), fragment)
    assert not (tmp_path / "o").exists()


def test_open_source_refuses_what_is_no_data(tmp_path):
    (tmp_path / "binary.bin").write_bytes(b"\0\1\2")
    with pytest.raises(InputError, match="binary file"):
        open_source(str(tmp_path / "binary.bin"))
    with pytest.raises(InputError, match="file not found"):
        open_source(str(tmp_path / "gone.txt"))


def test_the_launchers_index_is_what_its_workers_read(tmp_path, monkeypatch):
    from gantool.training.index import INDEX_ENV
    from gantool.training.launch import _hand_index_to_workers

    data = photos(tmp_path / "data", 5)
    (data / INDEX_DIR).write_text("read-only, as far as the index goes")
    age(data)
    monkeypatch.delenv(INDEX_ENV, raising=False)
    _hand_index_to_workers(ImageFolderSource(data))  # what check_launch does before starting the workers
    handed = Path(os.environ.pop(INDEX_ENV))
    assert handed.is_file()
    monkeypatch.setenv(INDEX_ENV, str(handed))
    monkeypatch.setattr(index_module, "scan_folder", lambda *a, **k: pytest.fail("a worker scanned the folder"))
    assert len(ImageFolderSource(data, keep_index=True)) == 5


def test_a_data_set_whose_files_exceed_the_decode_budget_is_not_cached_at_all(tmp_path, monkeypatch):
    import gantool.training.readers as readers

    data = photos(tmp_path / "data", 4)
    total = sum(p.stat().st_size for p in data.rglob("*.*"))
    monkeypatch.setattr(readers, "DECODE_CACHE_BYTES", total - 1)
    large = ImageFolderSource(data)
    large.load(0, 24, np.random.default_rng(0))
    assert not large.cache_decoded and large._decoded == {}  # no worker spends memory on a few of many images
    monkeypatch.setattr(readers, "DECODE_CACHE_BYTES", 10 * total)
    small = ImageFolderSource(data)
    small.load(0, 24, np.random.default_rng(0))
    assert small.cache_decoded and list(small._decoded) == [0]


def test_data_pack_takes_a_list_file_in_its_order(tmp_path):
    folder = photos(tmp_path / "photos", 4)
    (tmp_path / "two.txt").write_text("photos/p02.png\nphotos/p01.jpg\n")
    result = run_cli("data", "pack", tmp_path / "two.txt", "-o", tmp_path / "out", "--prefix", "val", "--json")
    manifest = json.loads(result.output)
    assert result.exit_code == 0 and manifest["images"] == 2 and manifest["shards"][0]["name"] == "val-000000.tar"
    source = open_source(str(tmp_path / "out"))
    assert source.read_bytes(0) == (folder / "p02.png").read_bytes()
    assert source.read_bytes(1) == (folder / "p01.jpg").read_bytes()


def test_the_train_command_printed_by_pack_pastes_with_a_space_in_the_path(tmp_path):
    """`train on them with: gantool train --data OUT` is copied into a shell: the path is one word."""
    photos(tmp_path / "my photos", 2)
    out = tmp_path / "my shards"
    result = run_cli("data", "pack", tmp_path / "my photos", "-o", out)
    assert result.exit_code == 0, result.output
    assert "packing" not in result.output  # stderr is no terminal here: no bar frames in a log
    assert "checking" not in run_cli("data", "check", out).output
    line = next(line for line in result.output.splitlines() if line.startswith("train on them with: "))
    assert shlex.split(line.removeprefix("train on them with: ")) == ["gantool", "train", "--data", str(out)]


def test_ctrl_c_during_pack_is_one_line_exit_130_and_leaves_no_output(tmp_path):
    """Ctrl-C (a real SIGINT to this process) while `gantool data pack` writes: one line, exit 130,
    and neither the output nor its staging folder is left. Before: click's "Aborted!" and exit 1,
    as for an error (every command without stop handling of its own)."""
    folder = photos(tmp_path / "photos", 600, size=(64, 64))
    out = tmp_path / "shards"
    packing = threading.Event()

    def ctrl_c_once_packing() -> None:  # the staging folder exists from the first shard to the commit
        deadline = time.monotonic() + 60
        while not packing.is_set() and time.monotonic() < deadline:
            if any(p.name.startswith(".gantool-stage") for p in tmp_path.iterdir()):
                packing.set()
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.001)

    watcher = threading.Thread(target=ctrl_c_once_packing)
    watcher.start()
    try:
        result = run_cli("data", "pack", folder, "-o", out, "--quiet")
    finally:
        packing.set()
        watcher.join()
    assert result.exit_code == 130, result.output
    assert result.output.strip() == "interrupted (SIGINT): gantool data stopped", result.output
    assert not out.exists() and not any(p.name.startswith(".gantool-stage") for p in tmp_path.iterdir())

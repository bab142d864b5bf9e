"""`gantool bench data`: what the training data loader delivers, from a folder, a list file and
WebDataset shards of the same images, and how long a training process takes to start on each.

Two measurements, each with its rows timed round by round (A, B, C, then C, B, A, ...):

- **throughput**: images/s of decoded, cropped samples out of the real DataLoader
  (``InpaintingDataset`` under ``StepBatchSampler``), per source and worker count, timed
  from the first batch on (worker start-up excluded), with the decode cache off so every
  sample is a decode (a data set larger than the cache). Set against what one training
  step consumes (``bench train``'s joint step at the same size, in the same run).
- **start-up**: seconds from launching ``gantool train`` to its first logged step, per
  source and image count (tiny images, a tiny model, no workers: what grows with the data
  is what is timed). The first start of each source builds its index; the rows are later
  starts, which read it.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from gantool.core.constants import METRICS_FILE
from gantool.core.errors import InputError
from gantool.tools.interleave import cpu_peak
from gantool.training.data import InpaintingDataset, StepBatchSampler
from gantool.training.sources import open_source

KINDS = ("folder", "list", "shards")
FILES_PER_FOLDER = 1000  # the start-up sets spread their files like real data sets do
STARTUP_TIMEOUT_S = 600


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    peak = cpu_peak()
    return {"cpu": peak["model"], "cores": peak["cores"], "load_average": [round(v, 2) for v in load]}


# ------------------------------------------------------------------ the images


def photo_like(seed: int, size: tuple[int, int]) -> Image.Image:
    """A smooth picture (gradient and shapes), so its JPEG is the size and decode cost of a photo's."""
    g = np.random.default_rng(seed)
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    t = (xx / width * math.cos(g.uniform(0, 6.3)) + yy / height * math.sin(g.uniform(0, 6.3)) + 2) / 4
    c0, c1 = g.uniform(0, 255, 3), g.uniform(0, 255, 3)
    base = c0 * (1 - t[..., None]) + c1 * t[..., None] + g.normal(0, 6, (height, width, 3))
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(8):
        x0, y0 = g.uniform(0, width), g.uniform(0, height)
        w, h = g.uniform(0.05, 0.4) * width, g.uniform(0.05, 0.4) * height
        draw.ellipse((x0, y0, x0 + w, y0 + h), fill=tuple(int(v) for v in g.integers(0, 256, 3)))
    return img


def write_photos(folder: Path, count: int, size: tuple[int, int], quality: int = 90) -> None:
    for i in range(count):
        sub = folder / f"{i // FILES_PER_FOLDER:04d}"
        sub.mkdir(parents=True, exist_ok=True)
        photo_like(i, size).save(sub / f"{i:07d}.jpg", quality=quality)


def write_tiny_files(folder: Path, count: int) -> None:
    """``count`` small PNG files (distinct pixels for the first few hundred, then repeats)."""
    payloads = []
    for seed in range(256):
        out = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(out, "PNG")
        payloads.append(out.getvalue())
    for i in range(count):
        sub = folder / f"{i // FILES_PER_FOLDER:04d}"
        if i % FILES_PER_FOLDER == 0:
            sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i:07d}.png").write_bytes(payloads[i % len(payloads)])


def same_images_three_ways(folder: Path, work: Path) -> dict[str, str]:
    """--data for the folder, a list file naming its images, and shards `gantool data pack` made of it."""
    from gantool.training.index import scan_folder
    from gantool.training.packing import pack_images

    names = list(scan_folder(folder).names)
    listing = work / f"{folder.name}.txt"
    listing.write_text("".join(f"{folder / n}\n" for n in names), encoding="utf-8")
    shards = work / f"{folder.name}-shards"
    pack_images(folder, shards, progress=False)
    return {"folder": str(folder), "list": str(listing), "shards": str(shards)}


# ------------------------------------------------------------------ throughput


def loader_run(data: str, workers: int, batches: int, batch_size: int, crop: int) -> Callable[[int], float]:
    """A function of the round that times ``batches`` batches out of a fresh DataLoader (after its first)."""
    source = open_source(data, keep_index=False)
    source.cache_decoded = False  # every sample decoded, as in a data set larger than the cache
    dataset = InpaintingDataset(source, crop, max(8, crop * 3 // 5))

    def run(round_index: int) -> float:
        start_step = round_index * (batches + 1)
        sampler = StepBatchSampler(len(source), batch_size, 0, start_step, start_step + batches + 1)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
        it = iter(loader)
        next(it)  # the workers are up and their first batch is out
        started = time.perf_counter()
        for _ in it:
            pass
        return time.perf_counter() - started

    return run


def interleaved_rounds(runs: Sequence[Callable[[int], float]], rounds: int) -> list[list[float]]:
    times: list[list[float]] = [[] for _ in runs]
    order = list(range(len(runs)))
    for r in range(rounds):
        for i in order if r % 2 == 0 else order[::-1]:
            times[i].append(runs[i](r))
    return times


# ------------------------------------------------------------------ start-up


def startup_seconds(data: str, work: Path, env: dict[str, str]) -> float:
    """Seconds from launching ``gantool train --data DATA`` to its first metrics line."""
    out = Path(tempfile.mkdtemp(prefix="run-", dir=work)) / "run"
    command = [
        sys.executable, "-m", "gantool", "train", "--data", data, "--out", str(out), "--size", "32",
        "--local-size", "16", "--width", "4", "--disc-width", "2", "--disc-fc", "8", "--batch-size", "4",
        "--workers", "0", "--steps-g", "1000000", "--steps-d", "0", "--steps-joint", "0", "--log-every", "1",
        "--sample-every", "1000000", "--checkpoint-every", "1000000", "--quiet",
    ]  # fmt: skip
    metrics = out / METRICS_FILE
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (metrics.exists() and metrics.stat().st_size > 0):
            if proc.poll() is not None:
                raise InputError(
                    f"gantool train --data {data} ended before its first step: {proc.communicate()[1][-500:]}"
                )
            if time.perf_counter() - started > STARTUP_TIMEOUT_S:
                raise InputError(f"gantool train --data {data} took over {STARTUP_TIMEOUT_S} s to its first step")
            time.sleep(0.005)
        took = time.perf_counter() - started
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate()
        shutil.rmtree(out.parent, ignore_errors=True)
    return took


# ------------------------------------------------------------------ the benchmark


def bench_data(
    images: int = 600,
    image_size: tuple[int, int] = (512, 384),
    crop: int = 160,
    batch_size: int = 16,
    batches: int = 8,
    workers: Sequence[int] = (0, 1, 2),
    rounds: int = 3,
    startup_counts: Sequence[int] = (1000, 100_000),
    train: bool = True,
    data: str | None = None,
    work_dir: str | None = None,
) -> dict[str, Any]:
    """Throughput per source and worker count, start-up per source and image count, and (``train``)
    the images/s a joint training step consumes at ``crop`` px: see the module's docstring."""
    if rounds < 1 or batches < 1 or batch_size < 1 or images < 1 or any(w < 0 for w in workers):
        raise InputError("--rounds, --batches, --batch-size and --images must be positive, --workers >= 0")
    result: dict[str, Any] = {"benchmark": "data", "machine_start": machine(), "torch": torch.__version__}
    work = Path(tempfile.mkdtemp(prefix="gantool-bench-data-", dir=work_dir))
    env = dict(os.environ)
    toolkit = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (toolkit, env.get("PYTHONPATH", "")) if p)
    try:
        # throughput
        folder = Path(data) if data else work / "photos"
        if not data:
            write_photos(folder, images, image_size)
        sources = same_images_three_ways(folder, work)
        rows = [(kind, w) for kind in KINDS for w in workers]
        runs = [loader_run(sources[kind], w, batches, batch_size, crop) for kind, w in rows]
        times = interleaved_rounds(runs, rounds)
        result["throughput"] = [
            {
                "source": kind,
                "workers": w,
                "images_per_s": batches * batch_size / statistics.median(t),
                "min_images_per_s": batches * batch_size / max(t),
                "max_images_per_s": batches * batch_size / min(t),
                "times_s": t,
            }  # fmt: skip
            for (kind, w), t in zip(rows, times)
        ]
        result["throughput_setup"] = {"images": len(open_source(sources["folder"], keep_index=False)),
                                      "image_size": list(image_size) if not data else None, "data": data,
                                      "crop": crop, "batch_size": batch_size, "batches": batches, "rounds": rounds}  # fmt: skip
        if train:
            from gantool.core.config import BENCH_TRAIN_BATCH
            from gantool.tools.bench_train import bench_train

            consumed = bench_train(size=crop, batch_size=BENCH_TRAIN_BATCH, steps=3, warmup=1, reference=False)
            row = consumed["rows"][0]
            result["training"] = {"images_per_s": row["images_per_s"], "batch_size": BENCH_TRAIN_BATCH, "size": crop,
                                  "amp_bf16": row["amp_bf16"], "device": consumed["device"]}  # fmt: skip
            for entry in result["throughput"]:
                entry["x_training"] = entry["images_per_s"] / row["images_per_s"]
        # start-up
        startup = []
        for count in startup_counts:
            tiny = work / f"tiny-{count}"
            write_tiny_files(tiny, count)
            three = same_images_three_ways(tiny, work)
            first = {kind: startup_seconds(three[kind], work, env) for kind in KINDS}  # builds each index
            again = interleaved_rounds([_startup_run(three[kind], work, env) for kind in KINDS], rounds)
            for kind, t in zip(KINDS, again):
                startup.append({"source": kind, "images": count, "first_start_s": first[kind],
                                "median_s": statistics.median(t), "times_s": t})  # fmt: skip
            shutil.rmtree(tiny, ignore_errors=True)
            shutil.rmtree(Path(three["shards"]), ignore_errors=True)
        result["startup"] = startup
        if len(startup_counts) >= 2:
            low, high = min(startup_counts), max(startup_counts)
            result["startup_ratio"] = {
                kind: _median_of(startup, kind, high) / _median_of(startup, kind, low) for kind in KINDS
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["machine_end"] = machine()
    return result


def _startup_run(data: str, work: Path, env: dict[str, str]) -> Callable[[int], float]:
    return lambda _round: startup_seconds(data, work, env)


def _median_of(rows: list[dict[str, Any]], kind: str, count: int) -> float:
    return next(float(r["median_s"]) for r in rows if r["source"] == kind and r["images"] == count)


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=1)

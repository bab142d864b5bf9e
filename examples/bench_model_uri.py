"""Start-up of `gantool inpaint --model models:/NAME/VERSION` against the same export folder by path.

    MLFLOW_TRACKING_URI=sqlite:///mlflow.db python examples/bench_model_uri.py runs/x/export models:/x/1 --rounds 15

Each round runs `gantool inpaint` twice as a fresh process (one small image, one hole), once per
--model, in alternating order; after one untimed warm-up of each (the URI's first use downloads
it into the cache). Prints the median wall time of each and the median of the paired rounds'
ratios (URI / path) with its spread. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from gantool.tools.interleave import paired_ratio


def run_once(model: str, image: Path, mask: Path, out: Path) -> float:
    command = [sys.executable, "-m", "gantool", "inpaint", str(image), "--mask", str(mask), "--model", model,
               "-o", str(out), "--overwrite"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the export folder, by path")
    parser.add_argument("uri", help="the same export as an MLflow URI (models:/NAME/VERSION)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        image, mask = work / "image.png", work / "mask.png"
        rng = np.random.default_rng(0)
        Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(image)
        hole = np.zeros((96, 128), np.uint8)
        hole[30:60, 40:80] = 255
        Image.fromarray(hole).save(mask)
        models = {"path": args.folder, "uri": args.uri}
        outputs = {name: work / f"{name}.png" for name in models}
        for name, model in models.items():  # warm-up: the URI's download, the OS's file cache
            run_once(model, image, mask, outputs[name])
        assert outputs["path"].read_bytes() == outputs["uri"].read_bytes(), "the two models differ"
        times: dict[str, list[float]] = {name: [] for name in models}
        for r in range(args.rounds):
            for name in list(models) if r % 2 == 0 else list(models)[::-1]:
                times[name].append(run_once(models[name], image, mask, outputs[name]))
    ratio = paired_ratio(times["uri"], times["path"])
    print(json.dumps({name: {"median_s": statistics.median(t), "times_s": t} for name, t in times.items()}, indent=1))
    print(
        f"start-up, median of {args.rounds} rounds: path {statistics.median(times['path']):.3f} s, "
        f"{args.uri} {statistics.median(times['uri']):.3f} s; URI / path {ratio['median']:.3f}x "
        f"({ratio['min']:.3f}-{ratio['max']:.3f})"
    )


if __name__ == "__main__":
    main()

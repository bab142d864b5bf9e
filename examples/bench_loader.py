"""Time the training data pipeline per sample: decoded per sample against decoded once.

    python examples/bench_loader.py data/photos/train --size 128 --scale 1 4

Prints the median and 90th percentile of one ``InpaintingDataset`` sample (crop, flip and a
mixed mask) for each way, the rows interleaved round by round so load hits both alike.
Compare with a training step (``gantool train`` logs ``data_wait``, the loader's share).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gantool.training.data import InpaintingDataset, open_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--scale", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN", "MAX"))
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    ways = {}
    for cached in (False, True):
        source = open_source(args.data, 0, tuple(args.scale))
        source.cache_decoded = cached and source.cache_decoded
        ways["decoded once" if cached else "decoded per sample"] = InpaintingDataset(
            source, args.size, args.size // 2, "mixed"
        )
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(args.rounds):
        for name, dataset in ways.items():
            start = time.perf_counter()
            dataset[(i % len(dataset), i)]
            times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        ms = np.array(values[len(ways[name]) :] or values) * 1e3  # after each image's first decode
        print(f"{name:20s} median {np.median(ms):7.1f} ms/sample  p90 {np.percentile(ms, 90):7.1f}")


if __name__ == "__main__":
    main()

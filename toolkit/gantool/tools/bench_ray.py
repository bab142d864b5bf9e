"""`gantool bench ray`: the ``--ray`` file pipeline against the local one."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gantool.core.errors import GantoolError, InputError
from gantool.inference.pipeline import run_inpaint
from gantool.runtime.backends import load_backend
from gantool.tools.bench_pipeline import write_bench_folder


def bench_ray_inpaint(
    model: str | Path | None = None,
    images: int = 200,
    size: int = 512,
    provider: str = "cpu",
    strategy: str = "auto",
    batch_size: int = 4,
    actors: int | None = None,
    address: str | None = None,
) -> dict[str, Any]:
    """``gantool inpaint --ray`` against ``gantool inpaint`` on the same folder.

    The local pipeline's rate is images / wall time with the model already open.
    The Ray path's per-image rate is measured on the driver between the first and
    the last batch of results (they stream back one batch at a time); its fixed
    start-up (ray.init, starting the actors and opening the model in each, the
    first batch) is the rest of its wall time, reported apart.
    """
    import tempfile

    from gantool.inference.ray import import_ray, ray_inpaint

    if images < 4 * batch_size:
        raise InputError(f"--e2e-images must be at least {4 * batch_size} to measure the Ray path's rate")
    ray = import_ray()
    with tempfile.TemporaryDirectory(prefix="gantool-bench-ray-") as tmp:
        root = Path(tmp)
        folder, mask_path = write_bench_folder(root, images, size)
        start = time.perf_counter()
        backend = load_backend(model, provider, "onnx")
        local_load = time.perf_counter() - start
        start = time.perf_counter()
        local = run_inpaint([folder], backend, mask=mask_path, output=root / "local", strategy=strategy,
                            batch_size=batch_size)  # fmt: skip
        local_wall = time.perf_counter() - start

        started_here = not ray.is_initialized()
        start = time.perf_counter()
        if started_here:
            ray.init(address=address, include_dashboard=False, logging_level="WARNING")
        init_s = time.perf_counter() - start
        try:
            summary = ray_inpaint([folder], model=model, provider=provider, backend_name="onnx", mask=mask_path,
                                  output=root / "ray", strategy=strategy, batch_size=batch_size,
                                  actors=actors)  # fmt: skip
        finally:
            if started_here:
                ray.shutdown()
    done = sorted(summary.finished_at)
    if len(done) != images:
        raise GantoolError(f"the Ray run reported {len(done)} of {images} images")
    steady_s = done[-1] - done[batch_size - 1]  # from the end of the first batch to the last result
    rate = (images - batch_size) / steady_s if steady_s > 0 else float("inf")
    local_rate = images / local_wall
    ray_wall = init_s + summary.seconds
    return {
        "benchmark": "inpaint --ray",
        "images": images, "size": size, "strategy": strategy, "batch_size": batch_size,
        "provider": summary.provider, "where": summary.where, "cpu_count": os.cpu_count(),
        "local": {"model_load_s": local_load, "wall_s": local_wall, "images_per_s": local_rate,
                  "failed": local.failed},
        "ray": {"ray_init_s": init_s, "wall_s": ray_wall, "images_per_s": rate,
                "startup_s": ray_wall - images / rate, "first_batch_s": summary.startup_seconds,
                "failed": summary.failed},
        "ratio": rate / local_rate,
        "goal": 0.8,
        "met": rate / local_rate >= 0.8,
        "measures": "images/s of the local pipeline (model open) vs the Ray path between its first and last "
                    "batch of results; Ray's fixed start-up = its wall time (with ray.init) minus images / that rate",
    }  # fmt: skip

"""How many CPU threads one model run may use in this process.

Unset (the default), each runtime picks its own (ONNX Runtime and OpenVINO: all cores).
``gantool serve --ray`` sets it in each replica so that replicas x threads stays within the
cores Ray gives them (two replicas each using every core of a node only contend). Read by
the runtimes when a model is opened: ONNX Runtime's ``intra_op_num_threads``, OpenVINO's
``INFERENCE_NUM_THREADS``, and torch's ``set_num_threads`` (set at once).
"""

from __future__ import annotations

_threads: int | None = None


def set_inference_threads(threads: int | None) -> None:
    """Limit the models opened from now on to ``threads`` CPU threads (None: each runtime's default)."""
    global _threads
    if threads is not None and threads < 1:
        raise ValueError(f"inference threads must be at least 1, got {threads}")
    _threads = threads
    if threads is not None:
        import torch  # a core dependency; its thread pool is process-wide

        torch.set_num_threads(threads)


def inference_threads() -> int | None:
    """The limit set by :func:`set_inference_threads`, or None."""
    return _threads

"""Giving freed memory back to the operating system after a large model run.

glibc's ``malloc`` keeps freed memory in the process for reuse (large blocks too, once
its dynamic mmap threshold has grown), so a process that once held a big image stays
that large. :func:`trim_heap` asks glibc to return what is free (``malloc_trim(0)``).
Where the C library has no ``malloc_trim`` (macOS, Windows, musl) it does nothing.
ONNX Runtime's own arena is shrunk by :func:`gantool.runtime.providers.run_releasing_arena`.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any


@functools.cache
def _malloc_trim() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into this process: its C library
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the C heap's free memory to the system; True when glibc released any."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False

"""Signal handlers, installed in one place: which signals end a job, and installing handlers for
the length of a block (main thread only) with the previous ones put back after.

Each command decides what a stop means (training: stop at the next step boundary; export: clean
up and exit; ``--ray``: complete the manifest; serve: drain); this module owns only the mechanics.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

# Stop a job: Ctrl-C, and what SLURM, Kubernetes, `timeout` and torchrun send to end one.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@contextlib.contextmanager
def handlers_installed(
    handlers: Mapping[signal.Signals, Handler], restore: Callable[[], bool] = lambda: True
) -> Iterator[bool]:
    """``handlers`` while the block runs; then the previous ones again, unless ``restore()`` says
    no (a server that keeps its handlers once a signal came, so a second one still exits at once).

    Python sets handlers in the main thread only: elsewhere nothing is installed and the block
    gets ``False`` (``True`` where they are installed).
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {sig: signal.getsignal(sig) for sig in handlers}
    try:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        yield True
    finally:
        if restore():
            for sig, old in previous.items():
                signal.signal(sig, old)

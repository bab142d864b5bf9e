"""Signals during training: stop at the next step boundary, or checkpoint now.

SIGINT and SIGTERM ask the run to stop at the next step boundary with a
checkpoint. A second one stops at once: it raises :class:`AbortNow` wherever
the process is (mid-step, mid-checkpoint write), and the run then writes no
checkpoint, so the last complete one is left as it was (a write cut short
leaves only its temp file, which is removed). SIGUSR1 asks for a checkpoint at
the next boundary and training goes on.

Under torchrun the launcher forwards the signal it gets (Ctrl-C's SIGINT, a
scheduler's SIGTERM) to its workers, which run in their own sessions, and
sends SIGKILL 30 s later (--shutdown-timeout).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from gantool.core.signals import STOP_SIGNALS, Handler, handlers_installed, raised_from_handlers_unprinted

# Write a checkpoint at the next step boundary and keep training (POSIX only).
CHECKPOINT_SIGNAL: signal.Signals | None = getattr(signal, "SIGUSR1", None)


class AbortNow(KeyboardInterrupt):
    """Raised by a second stop signal: what is in memory may be half a step, so nothing is saved."""


class StopFlag:
    """Signal handlers that set flags the loop checks at step boundaries."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.aborted = False  # a second stop signal arrived: stop now, save nothing
        self.checkpoint_requested = False
        self.settled = False  # the run is over: a stop signal now changes nothing

    def settle(self) -> None:
        """From here on a stop signal is only noted: the run has ended and what is left (its
        report and exit) should not be cut short, nor the process killed by the signal."""
        self.settled = True

    def stop(self, signum: int, frame: Any) -> None:
        if self.settled:
            return
        if self.requested:
            self.aborted = True
            raise AbortNow
        self.requested, self.signum = True, signum

    def checkpoint_now(self, signum: int, frame: Any) -> None:
        self.checkpoint_requested = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """The handlers, from here until the block ends (main thread only; elsewhere a no-op).
        SIGINT and SIGTERM stop (:data:`gantool.core.signals.STOP_SIGNALS`)."""
        handlers: dict[signal.Signals, Handler] = {sig: self.stop for sig in STOP_SIGNALS}
        if CHECKPOINT_SIGNAL is not None:
            handlers[CHECKPOINT_SIGNAL] = self.checkpoint_now
        # An AbortNow that cannot get out (raised in a weakref callback) still stops the run at its next
        # step boundary: the first signal asked for that.
        with handlers_installed(handlers), raised_from_handlers_unprinted((AbortNow,)):
            yield self

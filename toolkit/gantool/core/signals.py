"""Signal handlers, installed in one place: which signals end a job, and installing handlers for
the length of a block (main thread only) with the previous ones put back after, and holding stop
signals off for a block that must not be cut half-way (:func:`signals_deferred`). A handler that
raises can land where no exception gets through (:func:`raised_from_handlers_unprinted`).

Each command decides what a stop means (training: stop at the next step boundary; export: clean
up and exit; ``--ray``: complete the manifest; serve: drain); this module owns only the mechanics.

A signal the process started with ignored stays ignored (:data:`IGNORED_AT_START`), as Python
itself leaves it: a shell ignores SIGINT and SIGQUIT for ``cmd &`` in a script, so that the
script's Ctrl-C does not stop its background jobs, and ``nohup`` ignores SIGHUP, so that closing
the terminal does not end the job.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType
from typing import Any

# Stop a job: Ctrl-C, and what SLURM, Kubernetes, `timeout` and torchrun send to end one.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

# What a parent may have ignored for gantool (read once, when gantool is imported).
IGNORED_AT_START: frozenset[signal.Signals] = frozenset(
    sig
    for sig in (getattr(signal, name, None) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"))
    if sig is not None and signal.getsignal(sig) == signal.SIG_IGN
)


@contextlib.contextmanager
def handlers_installed(
    handlers: Mapping[signal.Signals, Handler], restore: Callable[[], bool] = lambda: True
) -> Iterator[bool]:
    """``handlers`` while the block runs; then the previous ones again, unless ``restore()`` says
    no (a server that keeps its handlers once a signal came, so a second one still exits at once).

    Python sets handlers in the main thread only: elsewhere nothing is installed and the block
    gets ``False`` (``True`` where they are installed). Signals in :data:`IGNORED_AT_START` stay
    ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    handlers = {sig: handler for sig, handler in handlers.items() if sig not in IGNORED_AT_START}
    previous = {sig: signal.getsignal(sig) for sig in handlers}
    try:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        yield True
    finally:
        if restore():
            for sig, old in previous.items():
                signal.signal(sig, old)


@contextlib.contextmanager
def signals_deferred(signals: Iterable[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """``signals`` that arrive while the block runs are noted, and handled when it ends (also when
    it raises) by the handlers that were there before, as if they had arrived just then.

    For a block that a raising handler must not cut half-way: one manifest line and its
    bookkeeping, or torch.export's tracing, out of which an exception raised by a handler has
    crashed the process (SIGSEGV). Outside the main thread nothing is deferred (nor installed).
    """
    arrived: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        arrived.append(signum)

    try:
        with handlers_installed(dict.fromkeys(signals, note)):
            yield
    finally:
        for signum in arrived:  # the previous handlers are back
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)  # the default action, as if it came now


@contextlib.contextmanager
def raised_from_handlers_unprinted(
    kinds: tuple[type[BaseException], ...], then: Callable[[BaseException], None] | None = None
) -> Iterator[None]:
    """While the block runs, an exception of ``kinds`` that Python could not raise is dropped
    without its "Exception ignored in ..." traceback (and handed to ``then``); any other goes to
    the previous hook.

    A handler runs wherever the main thread is. Inside a weakref callback, a ``__del__`` or a
    garbage-collector callback (importlib's module-lock cleanup is one), the exception it raises
    cannot get out: Python prints it and goes on. So the handler must also note the signal, and
    the code check that note (an export before each format and its commit, training at its step
    boundary), or ``then`` sends the signal again (from another thread: sent from the hook, its
    handler would run at once, inside the hook). Outside the main thread nothing is installed,
    as no handler is (:func:`handlers_installed`).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        # Handlers run in the main thread only: the same kind of exception elsewhere is not theirs.
        if not isinstance(unraisable.exc_value, kinds) or threading.current_thread() is not threading.main_thread():
            previous(unraisable)
        elif then is not None:
            then(unraisable.exc_value)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous

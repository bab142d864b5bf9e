"""Joining a Ray cluster for ``gantool inpaint --ray`` without hanging, and the run's guards.

Ray retries an unreachable address for minutes, and a ``ray://`` or non-Ray port
ends in a long traceback: :func:`connect` probes the address with a TCP connection
first and bounds ``ray.init`` by the same timeout, so every failure is one line
naming the address. :class:`FolderLock` keeps two runs out of one output folder;
:func:`sigterm_as_interrupt` lets SIGTERM end a run as Ctrl-C does, so the manifest
is completed.
"""

from __future__ import annotations

import _thread
import contextlib
import fcntl
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gantool.core.errors import InputError, first_line
from gantool.core.fileio import ensure_writable_dir


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run: handled like Ctrl-C (the manifest is completed), exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while the run is on (elsewhere:
    untouched). Only the first: a repeated SIGTERM must not cut the manifest's completion short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not raised:
            raised.append(signum)
            raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address to probe, or None for "auto"/"local" (Ray finds those itself)."""
    if address in ("auto", "local"):
        return None
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://").rstrip("/")
    host, colon, port = rest.rpartition(":")
    if not colon or host.endswith(":") or not port.isdigit():  # no port given (or an IPv6 literal without one)
        host, port = rest, ("10001" if client else "6379")  # Ray Client's and the GCS's default ports
    host = host.strip("[]")
    if not host:
        raise InputError(f"--ray-address {address!r} names no host (expected HOST:PORT, ray://HOST:PORT or auto)")
    return host, int(port)


def check_reachable(address: str, timeout: float) -> None:
    """A TCP connection to the Ray address within ``timeout`` seconds, or one InputError naming it.

    Ray itself retries an unreachable address for minutes; an unresolvable host, a
    closed port and an unroutable address are all caught here in at most ``timeout``."""
    target = _split_address(address)
    if target is None:
        return
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            # getaddrinfo can block on DNS far longer than any socket timeout: the thread bounds it.
            with socket.create_connection(target, timeout=timeout):
                outcome.append(None)
        except OSError as e:
            outcome.append(e)

    worker = threading.Thread(target=connect, name="gantool-ray-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        cause: str = f"no answer within {timeout:g} s"
    elif outcome[0] is None:
        return
    else:
        error = outcome[0]
        cause = "unknown host" if isinstance(error, socket.gaierror) else (first_line(error) or type(error).__name__)
        if isinstance(error, TimeoutError):
            cause = f"no answer within {timeout:g} s"
    raise InputError(
        f"cannot reach the Ray cluster at {address} ({target[0]}:{target[1]}): {cause}; "
        "is its head node up? (or leave out --ray-address to start a local cluster)"
    )


def connect(ray: Any, address: str | None, timeout: float) -> None:
    """``ray.init``: a local cluster, or the one at ``address`` within ``timeout`` s, else one InputError."""
    with quiet_logger("ray"):
        if not address:
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
            return
        deadline = time.monotonic() + timeout  # the caller probed the address (check_reachable) first
        # The port answers, but Ray may still retry (not a Ray port, a version mismatch): a timer
        # interrupts the main thread at the deadline. Ray waits for the GCS inside C++ calls that
        # Python cannot interrupt, so such a port fails after Ray's own wait (about 40 s here).
        timer = None
        connected = threading.Event()

        def interrupt() -> None:
            if not connected.is_set():
                _thread.interrupt_main()

        if threading.current_thread() is threading.main_thread():
            timer = threading.Timer(max(0.1, deadline - time.monotonic()), interrupt)
            timer.daemon = True
            timer.start()
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            connected.set()
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):
                ray.shutdown()
            if timer is not None and not timer.is_alive():
                raise InputError(
                    f"no Ray cluster answered at {address}: the port accepts connections but Ray's handshake "
                    "failed (is it the head node's GCS port, 6379 by default?)"
                ) from None
            raise
        except Exception as e:  # Ray's ConnectionError, RuntimeError, gRPC errors: one line, the cause kept
            with contextlib.suppress(Exception):
                ray.shutdown()
            raise InputError(f"cannot connect to the Ray cluster at {address}: {first_line(e)}") from None
        finally:
            if timer is not None:
                timer.cancel()


class FolderLock:
    """An exclusive lock (flock) on the run's output folders: a second run on them is refused.
    The kernel drops it when the process ends, however it ends, so no stale lock is left."""

    def __init__(self, folders: Sequence[Path]) -> None:
        self.fds: list[int] = []
        for folder in sorted({f.resolve() for f in folders}):
            ensure_writable_dir(folder)
            fd = os.open(folder, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                self.release()
                raise InputError(
                    f"{folder} is in use by another gantool inpaint --ray run; wait for it to finish "
                    "(or give another -o)"
                ) from None
            self.fds.append(fd)

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)  # closing the descriptor releases the flock
        self.fds.clear()


@contextlib.contextmanager
def quiet_logger(name: str, drop: logging.Filter | None = None) -> Iterator[None]:
    """Ray's INFO chatter (start-up banner, "execution finished") off the CLI's output, while Ray runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    if drop is not None:
        logger.addFilter(drop)
    try:
        yield
    finally:
        logger.setLevel(level)
        if drop is not None:
            logger.removeFilter(drop)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Ctrl-C held off (main thread) while the manifest is completed: a second Ctrl-C during the
    wind-down would otherwise leave it half-written. The wind-down is short (Ray's shutdown)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

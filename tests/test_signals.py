"""gantool.core.signals: the one place a command's signal handlers are installed and put back."""

from __future__ import annotations

import signal
import threading

from gantool.core.signals import STOP_SIGNALS, handlers_installed


def _handler(signum: int, frame: object) -> None:
    raise AssertionError("not to be called")


def test_handlers_are_installed_for_the_block_and_the_previous_ones_put_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with handlers_installed(dict.fromkeys(STOP_SIGNALS, _handler)) as installed:
        assert installed
        assert all(signal.getsignal(sig) is _handler for sig in STOP_SIGNALS)
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def test_handlers_are_put_back_when_the_block_raises() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        with handlers_installed({signal.SIGTERM: _handler}):
            raise KeyError("inside")
    except KeyError:
        pass
    assert signal.getsignal(signal.SIGTERM) == before


def test_restore_false_keeps_the_handlers() -> None:
    """A server keeps its handlers once a signal came: a second one must still exit at once."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        with handlers_installed({signal.SIGTERM: _handler}, restore=lambda: False):
            pass
        assert signal.getsignal(signal.SIGTERM) is _handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_off_the_main_thread_nothing_is_installed() -> None:
    seen: list[object] = []

    def worker() -> None:
        with handlers_installed({signal.SIGTERM: _handler}) as installed:
            seen.extend([installed, signal.getsignal(signal.SIGTERM)])

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen[0] is False and seen[1] is not _handler

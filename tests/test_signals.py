"""gantool.core.signals: the one place a command's signal handlers are installed and put back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

from gantool.core.signals import STOP_SIGNALS, handlers_installed, raised_from_handlers_unprinted, signals_deferred
from gantool.inference.ray_connect import Terminated, sigterm_as_interrupt
from process_helpers import descendants
from tiny import TINY_ARGS


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


def test_a_deferred_signal_reaches_the_previous_handler_when_the_block_ends() -> None:
    got: list[tuple[str, int]] = []

    def previous(signum: int, frame: object) -> None:
        got.append(("handled", signum))
        raise KeyboardInterrupt

    with handlers_installed({signal.SIGTERM: previous}), pytest.raises(KeyboardInterrupt), signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal: its handler runs at the next bytecode
        time.sleep(0.05)
        got.append(("block done", 0))  # not cut: the block runs to its end first
    assert got == [("block done", 0), ("handled", signal.SIGTERM)]


def test_a_deferred_signal_is_delivered_also_when_the_block_raises_and_none_without_one() -> None:
    got: list[int] = []
    with handlers_installed({signal.SIGINT: lambda signum, frame: got.append(signum)}):
        with pytest.raises(KeyError), signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            raise KeyError("inside")
        assert got == [signal.SIGINT]
        with signals_deferred():
            pass
        assert got == [signal.SIGINT]


def test_a_deferred_signal_whose_previous_handling_was_the_default_still_ends_the_process() -> None:
    code = (
        "import os, signal, time\n"
        "from gantool.core.signals import signals_deferred\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        "with signals_deferred():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.05)\n"
        "    print('block done', flush=True)\n"
        "print('not reached', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == "block done\n", proc.stderr


def test_only_the_handlers_own_exceptions_go_unprinted() -> None:
    """Another exception that Python cannot raise (a failing ``__del__``) still reaches the hook
    that was there before; the handler's own is dropped; the old hook is back after the block."""
    reached: list[BaseException] = []
    before = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: reached.append(unraisable.exc_value)

    class FailsWhenDeleted:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    try:
        previous = sys.unraisablehook
        with raised_from_handlers_unprinted((KeyboardInterrupt,)):
            FailsWhenDeleted(KeyboardInterrupt())
            FailsWhenDeleted(ValueError("a real bug"))
        assert sys.unraisablehook is previous
    finally:
        sys.unraisablehook = before
    assert [type(e) for e in reached] == [ValueError]


def test_a_sigterm_swallowed_by_a_weakref_callback_still_ends_a_ray_run(monkeypatch) -> None:
    """`gantool inpaint --ray` raises Terminated on the first SIGTERM only (a second must not cut
    the manifest's completion short). Raised inside a weakref callback, it never got out, and the
    run went on deaf to every later SIGTERM. Now it is sent again and raised once the callback has
    returned, with nothing printed."""
    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(unraisable.exc_value))

    class Dropped:
        pass

    def callback(ref: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here, inside the callback
            pass

    with sigterm_as_interrupt(), pytest.raises(Terminated) as raised:
        dropped = Dropped()
        kept = weakref.ref(dropped, callback)
        del dropped
        assert kept() is None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the signal sent again is handled in this loop
            pass
    assert raised.value.signum == signal.SIGTERM
    assert printed == []


def test_off_the_main_thread_nothing_is_installed() -> None:
    seen: list[object] = []

    def worker() -> None:
        with handlers_installed({signal.SIGTERM: _handler}) as installed:
            seen.extend([installed, signal.getsignal(signal.SIGTERM)])
        with raised_from_handlers_unprinted((KeyboardInterrupt,)):  # no handler here, so no hook either
            seen.append(sys.unraisablehook)

    before = sys.unraisablehook
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen[0] is False and seen[1] is not _handler and seen[2] is before


def started_with(*ignored: str) -> list[str]:
    """A command prefix that starts what follows with ``ignored`` signals ignored and the other stop
    signals at their default, then execs it: what a shell does for `cmd &` in a script (SIGINT and
    SIGQUIT ignored) and `nohup` does (SIGHUP), whatever this suite itself was started with."""
    code = (
        "import os, signal, sys\n"
        "for name in ('SIGINT', 'SIGTERM', 'SIGHUP', 'SIGQUIT'):\n"
        f"    signal.signal(getattr(signal, name), signal.SIG_IGN if name in {list(ignored)!r} else signal.SIG_DFL)\n"
        "os.execvp(sys.argv[1], sys.argv[1:])\n"
    )
    return [sys.executable, "-c", code]


IGNORING_INT_AND_HUP = started_with("SIGINT", "SIGHUP")


def ignored_by(pid: int) -> set[int]:
    """The signals process ``pid`` ignores (Linux: SigIgn in /proc/PID/status, bit N-1 for signal N)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_a_signal_ignored_at_start_stays_ignored_and_the_ddp_agent_leaves_it_alone(
    subprocess_env: dict[str, str],
) -> None:
    script = (
        "import signal\n"
        "from gantool.core.signals import handlers_installed\n"
        "from gantool.training.launch import agent_signals\n"
        "def mine(signum, frame): pass\n"
        "with handlers_installed({signal.SIGINT: mine, signal.SIGTERM: mine}) as installed:\n"
        "    print(installed, signal.getsignal(signal.SIGINT) == signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is mine)\n"
        "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is mine)\n"
        "print(agent_signals())\n"
    )
    ran = subprocess.run([*IGNORING_INT_AND_HUP, sys.executable, "-c", script], env=subprocess_env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n") == ["True True True", "True False", "SIGTERM,SIGQUIT", ""]
    # Started normally, torch's agent stops the workers on all four, as torchrun does.
    plain = subprocess.run([*started_with(), sys.executable, "-c", script], env=subprocess_env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert plain.stdout.split("\n")[-2] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT", plain.stderr


@pytest.mark.parametrize("launcher", [[], ["--nproc-per-node", "2"]], ids=["one process", "two processes"])
def test_training_started_with_nohup_in_the_background_of_a_script_ignores_hangup_and_ctrl_c(
    launcher: list[str], tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    # Before: the 2-process launcher (torch's agent) stopped the run on SIGHUP despite nohup (exit
    # 129), and gantool's own handler stopped either run on a Ctrl-C meant for the script (130).
    out = tmp_path / "run"
    args = ["train", "--out", str(out), *TINY_ARGS, "--device", "cpu", "--log-every", "1", "--checkpoint-every",
            "2", "--sample-every", "100000", "--steps-g", "100000", "--steps-d", "0", "--steps-joint", "0"]  # fmt: skip
    proc = subprocess.Popen([*IGNORING_INT_AND_HUP, sys.executable, "-m", "gantool", *args, *launcher],
                            env=subprocess_env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    metrics = out / "metrics.jsonl"

    def logged() -> int:
        return metrics.read_text().count('"images_per_s"') if metrics.exists() else 0

    try:
        deadline = time.monotonic() + 240
        while not ((out / "checkpoints" / "last.pt").exists() and logged() >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        # Deterministic: no process of the run (torch's agent included) handles them. Where a
        # handler is installed, whether the signals below stop the run depends on where they land.
        if Path("/proc/self/status").is_file():
            for pid in [proc.pid, *children(proc.pid)]:
                assert {signal.SIGINT, signal.SIGHUP} <= ignored_by(pid), f"pid {pid} handles them"
        os.killpg(proc.pid, signal.SIGHUP)  # the terminal closed: to the whole process group
        os.killpg(proc.pid, signal.SIGINT)  # the script's Ctrl-C
        before = logged()
        while logged() < before + 3:  # still training
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # what still stops it, with a checkpoint
        stderr = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:  # a failure above: no process of the run may outlive the test
            for pid in [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, stderr
    assert (out / "checkpoints" / "last.pt").exists() and "Traceback" not in stderr

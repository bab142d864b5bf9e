"""``gantool train --nproc-per-node N``: DDP on one machine without spelling torchrun.

The launcher is PyTorch's own (``torch.distributed.launcher.api.elastic_launch``,
what ``torchrun`` runs): N worker processes of ``python -m gantool train ...``
with RANK / WORLD_SIZE / LOCAL_RANK set, a c10d rendezvous on 127.0.0.1.

What this adds around it:

- every refusal (options, resume, data, batch not divisible by N, ``--sync-bn``
  on the CPU) is one line *before* any process or folder exists
  (:func:`check_launch`);
- SIGINT and SIGTERM: the agent forwards them to every worker (which stop at
  the next step boundary with a checkpoint) and raises ``SignalException``
  here; that becomes exit 130 / 143, no traceback. SIGUSR1, which the agent
  does not handle, is forwarded to every worker here (checkpoint, continue).
  A signal gantool was started with ignored (SIGHUP under ``nohup``, SIGINT for
  ``cmd &`` in a script) is left out of the agent's ``signals_to_handle``, so
  it stays ignored there too;
- a worker that dies (kill -9, a crash) is one line naming its rank, how it
  ended and the run's last complete checkpoint. The agent polls its workers
  every ``monitor_interval`` s and stops the others (SIGTERM, then SIGKILL after
  30 s); a survivor blocked in a collective fails at once anyway (the dead
  process's sockets close) and exits quietly with
  :attr:`~gantool.core.errors.ProcessLostError.exit_code`, leaving the report
  to the launcher (:data:`LAUNCHER_ENV` tells it so);
- a worker that stops answering (SIGSTOP, a hang) while the others wait in a
  collective: they give up after ``--collective-timeout`` s and exit with the
  same code; the launcher names the silent one (:class:`_WorkerWatch` saw it
  stopped, or it is the only other one) and resumes every stopped worker
  (SIGCONT) once one has ended, so the agent's SIGTERM reaches it and nothing
  is left behind (a process stuck otherwise gets the agent's SIGKILL at 30 s);
- a worker that fails with its own one line (a non-finite loss, a checkpoint it
  cannot write) hands it to the launcher in the error file torch's agent gives it
  (:func:`report_worker_failure`), and says nothing itself: the launcher prints
  it once, naming the process, instead of "ended with exit code 1";
- after any worker failure the run's status.json says ``failed`` with that one
  line (:func:`~gantool.training.tracking.mark_failed`) and the worker's own
  reason, when it gave one: rank 0, which keeps it, may have been the process killed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from gantool.core.constants import CHECKPOINTS_DIR, DEFAULT_COLLECTIVE_TIMEOUT_S, STATUS_FILE
from gantool.core.errors import GantoolError, InputError, ProcessLostError, TrainingError, first_line
from gantool.core.fileio import atomic_write_text
from gantool.core.run_checkpoints import newest_checkpoint
from gantool.core.signals import IGNORED_AT_START, handlers_installed

log = logging.getLogger(__name__)

MAX_PROCESSES = 256
# Set in the workers' environment: the launcher reports a dead process, so a survivor says nothing.
LAUNCHER_ENV = "GANTOOL_NPROC_LAUNCHER"
# Set by torch's agent in each worker: the file its ProcessFailure reads back after the worker ended.
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
# The signals torch's agent stops the workers on, by default (LaunchConfig.signals_to_handle).
AGENT_DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
# How often the agent checks its workers (s): a dead one is noticed within this.
MONITOR_INTERVAL_S = 0.2


@dataclass(frozen=True)
class LaunchPlan:
    run_dir: Path | None  # the run folder the workers will use; None: a new runs/<timestamp> (rank 0 names it)
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S  # the run's --collective-timeout


def check_launch(options: Mapping[str, Any], resume: str | None, nproc: int, allow_data_change: bool) -> LaunchPlan:
    """Everything a worker would refuse, checked once here (writes nothing, starts nothing)."""
    from gantool.training.build import resolve_device
    from gantool.training.data import check_data_unchanged, data_fingerprint, open_source
    from gantool.training.distributed import sync_batchnorm_supported
    from gantool.training.loop import prepare_run

    if not 1 <= nproc <= MAX_PROCESSES:
        raise InputError(f"--nproc-per-node must be in 1..{MAX_PROCESSES}, got {nproc}")
    if "WORLD_SIZE" in os.environ:
        raise InputError("--nproc-per-node under torchrun: use one launcher (drop --nproc-per-node, or torchrun)")
    cfg, state, plan = prepare_run(options, resume)
    if cfg.batch_size % nproc:
        raise InputError(f"--batch-size {cfg.batch_size} must be divisible by the {nproc} processes")
    device = resolve_device(cfg.device)
    if cfg.sync_bn and not sync_batchnorm_supported(device):
        raise InputError(
            f"--sync-bn needs GPUs: torch's SyncBatchNorm does not run on {device.type} tensors; "
            "drop --sync-bn (each process then normalizes with its own batch statistics)"
        )
    if cfg.tensorboard:
        from gantool.training.tracking import summary_writer_class

        summary_writer_class()
    source = open_source(cfg.data, cfg.seed, index_dirs=[plan.folder] if plan.folder and not plan.new else [])
    if state is not None:
        check_data_unchanged(state.get("data"), data_fingerprint(source, cfg.data), allow_data_change)
    _hand_index_to_workers(source)
    return LaunchPlan(plan.folder.resolve() if plan.folder is not None else None, cfg.collective_timeout)


def _hand_index_to_workers(source: Any) -> None:
    """The workers read the data index built here (a file in the temp folder, named in their
    environment), so a read-only data folder is not scanned again by every process."""
    import atexit
    import tempfile

    from gantool.training.index import INDEX_ENV, write_index

    index = getattr(source, "index", None)
    if index is None:
        return
    fd, name = tempfile.mkstemp(prefix="gantool-data-index-", suffix=".json")
    os.close(fd)
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    if write_index(index, name):
        os.environ[INDEX_ENV] = name


def _children_states() -> dict[int, str]:
    """pid -> state letter (R, S, T: stopped, Z: ended, ...) of this process's children, from /proc (Linux)."""
    me, found = os.getpid(), dict[int, str]()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found[int(entry.name)] = fields[0]
    return found


def _children() -> list[int]:
    """The pids of this process's children (the workers), from /proc (Linux)."""
    return list(_children_states())


def _rank_of(pid: int) -> int | None:
    """The RANK in a process's environment (None: not a worker, or not yet exec'd)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    value = next((v[5:] for v in environ if v.startswith(b"RANK=")), None)
    return int(value) if value is not None and value.isdigit() else None


class _WorkerWatch:
    """The launcher's own look at its workers while the agent runs them (Linux /proc, every ``interval`` s).

    Once a worker has ended, every other one that is stopped (SIGSTOP, Ctrl-Z of its
    terminal, a debugger) is resumed with SIGCONT: a stopped process holds the agent's
    SIGTERM pending and would be killed only at the agent's 30 s SIGKILL. ``stopped``
    keeps the ranks (and pids) found stopped at that moment: the ones that stopped answering.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.ranks: dict[int, int] = {}  # pid -> rank
        self.stopped: dict[int, int] = {}  # rank -> pid
        self.ended = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gantool-worker-watch", daemon=True)

    def __enter__(self) -> _WorkerWatch:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self.poll()  # a worker stopped after the last look is not left stopped

    def _watch(self) -> None:
        while not self._done.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        states = _children_states()
        for pid in states:
            if pid not in self.ranks and (rank := _rank_of(pid)) is not None:
                self.ranks[pid] = rank
        if not any(states.get(pid, "Z") == "Z" for pid in self.ranks):
            return  # none has ended (or none has started)
        live = {pid: state for pid, state in states.items() if pid in self.ranks and state != "Z"}
        if not self.ended:
            self.ended = True
            self.stopped = {self.ranks[pid]: pid for pid, state in live.items() if state in "Tt"}
        for pid, state in live.items():
            if state in "Tt":
                try:  # its process group: DataLoader workers too (a worker leads its own session)
                    os.killpg(pid, signal.SIGCONT)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def _forward_sigusr1() -> Iterator[None]:
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None:
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        for pid in _children():
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    with handlers_installed({sig: forward}):
        yield


def launch(
    nproc: int, argv: list[str], run_dir: Path | None = None, collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S
) -> int:
    """Run ``gantool train ARGV`` in ``nproc`` processes; returns the exit code (0, 130, 143).

    A worker that fails is a one-line TrainingError naming its rank (or the one that
    stopped answering, which the others waited ``collective_timeout`` s for) and the
    last complete checkpoint of ``run_dir`` (None: the ``runs/<timestamp>`` rank 0
    made); the run's status.json then says failed, with that line.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"gantool-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=MONITOR_INTERVAL_S,
        signals_to_handle=agent_signals(),
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: N processes share the cores
    # The agent's notices ("Received 15 death signal, shutting down workers", one per worker;
    # "failed (exitcode: -9) local_rank: 1 ..."): what matters is said once below, or by rank 0.
    noisy = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.distributed.elastic")
    ]
    levels = [logger.level for logger in noisy]
    for logger in noisy:
        logger.setLevel(logging.CRITICAL)
    os.environ[LAUNCHER_ENV] = "1"
    watch = _WorkerWatch(MONITOR_INTERVAL_S)
    try:
        with _forward_sigusr1(), watch:
            elastic_launch(config, sys.executable)("-m", "gantool", "train", *argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = first_failure(e.failures, watch.stopped)
        if failure.exitcode in (130, 143):  # a worker stopped by a signal sent to it alone
            return failure.exitcode
        folder = run_dir or _run_of_pids({f.pid for f in e.failures.values()})
        line = failure_line(rank, failure, e.failures, nproc, watch, collective_timeout)
        line += " " + last_checkpoint_line(folder, nproc)
        if folder is not None:
            _record_failure(folder, line, worker_report(failure)[1])
        raise TrainingError(line) from None
    finally:
        os.environ.pop(LAUNCHER_ENV, None)
        for logger, level in zip(noisy, levels):
            logger.setLevel(level)
    return 0


def agent_signals() -> str:
    """The signals torch's agent stops the workers on (its default list), less those gantool was
    started with ignored: the agent would otherwise install its handler over ``nohup``'s SIG_IGN."""
    ignored = {sig.name for sig in IGNORED_AT_START}
    return ",".join(name for name in AGENT_DEFAULT_SIGNALS if name not in ignored)


def failure_line(
    rank: int, failure: Any, failures: Mapping[int, Any], nproc: int, watch: _WorkerWatch, timeout: float
) -> str:
    """What happened, for the first failure (``rank``, its ``ProcessFailure``): the start of the one line."""
    own, _ = worker_report(failure)
    if own is not None:
        end = "" if own.endswith(".") else "."
        return f"process {rank} of {nproc} failed (pid {failure.pid}): {own}{end} The others were stopped."
    if failure.exitcode != ProcessLostError.exit_code:
        how = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        return f"process {rank} of {nproc} ended with {how} (pid {failure.pid}); the others were stopped."
    # No process ended before it: it waited `timeout` s in a collective for one that stopped answering.
    waited = f"process {rank} (pid {failure.pid}) waited --collective-timeout {timeout:g} s for it"
    silent = dict(watch.stopped)
    if not silent and nproc == 2:  # the only other one
        known = {r: p for p, r in watch.ranks.items()} | {r: f.pid for r, f in failures.items()}
        if 1 - rank in known:
            silent = {1 - rank: known[1 - rank]}
    if not silent:
        return f"a process of {nproc} stopped answering: {waited}; the others were stopped."
    ranks = ", ".join(str(r) for r in sorted(silent))
    pids = ", ".join(str(silent[r]) for r in sorted(silent))
    how = ", found stopped by SIGSTOP, Ctrl-Z or a debugger" if watch.stopped else ""
    many = "es" if len(silent) > 1 else ""
    return (
        f"process{many} {ranks} of {nproc} stopped answering (pid{'s' if many else ''} {pids}{how}): "
        f"{waited}; the others were stopped."
    )


def report_worker_failure(message: str, reason: str) -> bool:
    """In a worker: hand its one-line failure (and status.json's short ``reason``) to the
    launcher through the error file torch's agent named (ProcessFailure reads its
    ``message`` and ``timestamp``). Returns whether gantool's launcher will print it,
    so the worker need not (under plain torchrun it still should)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return False
    record = {"message": message, "timestamp": int(time.time()), "reason": reason}
    try:  # whole or not at all: torch's agent raises on a half-written file
        atomic_write_text(path, json.dumps(record))
    except (GantoolError, OSError):  # a full disk: the worker prints its line itself
        return False
    return bool(os.environ.get(LAUNCHER_ENV))


def worker_report(failure: Any) -> tuple[str | None, str | None]:
    """The (one line, reason) a failed worker handed over with :func:`report_worker_failure`,
    or (None, None): it died, was stopped, or lost another process."""
    data = getattr(failure, "error_file_data", None)
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
        return None, None
    message = data.get("message")
    return (message, data["reason"]) if isinstance(message, str) and message else (None, None)


def _record_failure(folder: Path, line: str, reason: str | None = None) -> None:
    """status.json says failed, with ``line``, and the worker's own ``reason`` when it gave one
    (else "process lost"): a killed rank 0 left it saying running."""
    from gantool.training.tracking import PROCESS_LOST, mark_failed

    try:
        mark_failed(folder, line, reason or PROCESS_LOST)
    except (InputError, OSError) as e:  # a full disk: the line itself still reaches the user
        log.warning("could not record the failure in %s: %s", folder / STATUS_FILE, first_line(e))


def first_failure(failures: Mapping[int, Any], stopped: Collection[int] = ()) -> tuple[int, Any]:
    """The rank that failed first, and its ``ProcessFailure``.

    torch's ``ChildFailedError.get_first_failure`` orders by the failures' timestamps,
    which are whole seconds: a survivor the agent stopped (or that saw the dead one's
    sockets close) within the same second wins that tie when its rank is lower. So
    among the earliest, a process that ended by itself comes before one that ended
    because the other did (lost contact, or the agent's SIGTERM). A rank in ``stopped``
    (found stopped when the first one ended, then resumed and ended) never comes first.
    """
    secondary = {ProcessLostError.exit_code, 128 + signal.SIGTERM, -signal.SIGTERM}

    def order(rank: int) -> tuple[int, bool, int]:
        return failures[rank].timestamp, failures[rank].exitcode in secondary, rank

    rank = min([r for r in failures if r not in stopped] or failures, key=order)
    return rank, failures[rank]


def last_checkpoint_line(run_dir: Path | None, nproc: int) -> str:
    """ "last complete checkpoint: PATH (step N); resume with: ...", or that there is none.

    The run's newest: last.pt, else its highest step_N.pt (a run resumed from one after
    last.pt was deleted has no last.pt until its next checkpoint)."""
    path, _ = newest_checkpoint(run_dir / CHECKPOINTS_DIR) if run_dir is not None else (None, None)
    if path is None:
        return "No checkpoint was written."
    import torch

    try:  # the step from the file itself (mmap: the tensors are not read)
        step = int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:  # torch.load raises many types; the path is still the one to resume from
        at = ""
    else:
        at = f" (step {step})"
    return f"Last complete checkpoint: {path}{at}; resume with: gantool train --resume {shlex.quote(str(path))} --nproc-per-node {nproc}"


def _run_of_pids(pids: set[int]) -> Path | None:
    """The new ``runs/<timestamp>`` folder whose status.json one of ``pids`` (rank 0) wrote."""
    import json
    import socket

    from gantool.training.runfolder import RUNS_ROOT

    host, found = socket.gethostname(), []
    for status in RUNS_ROOT.glob(f"*/{STATUS_FILE}"):
        try:
            record = json.loads(status.read_text(encoding="utf-8"))
            if record.get("pid") in pids and record.get("host") == host:
                found.append((status.stat().st_mtime, status.parent))
        except (OSError, ValueError, AttributeError):
            continue
    return max(found)[1].resolve() if found else None

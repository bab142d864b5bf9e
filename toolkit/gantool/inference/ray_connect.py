"""Joining a Ray cluster for ``gantool inpaint --ray`` without hanging, and the run's guards.

Ray retries an unreachable address for minutes, waits 20 s to minutes on a port
that answers but is not Ray, and a ``ray://`` address ends in a long traceback:
:func:`check_reachable` probes the address first (a TCP connection, HTTP/2's
greeting, which every gRPC server answers, and Ray's first call: the GCS's, or Ray Client's
ping for a ``ray://`` address; over TLS with ``RAY_USE_TLS``) and
:func:`connect` bounds ``ray.init`` by what is left of the same timeout, so every
failure is one line naming the address. :class:`FolderLock` keeps two runs out of one output folder;
:func:`sigterm_as_interrupt` lets SIGTERM end a run as Ctrl-C does, so the manifest
is completed, :func:`release_interrupted` and :func:`settle_ray_threads` let Ray Data's
execution and threads end before Ray shuts down.
"""

from __future__ import annotations

import _thread
import contextlib
import fcntl
import gc
import logging
import os
import re
import signal
import socket
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gantool.core.errors import InputError, first_line
from gantool.core.fileio import ensure_writable_dir
from gantool.core.signals import STOP_SIGNALS, handlers_installed, raised_from_handlers_unprinted


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run: handled like Ctrl-C (the manifest is completed), exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while the run is on (elsewhere:
    untouched). Only the first: a repeated SIGTERM must not cut the manifest's completion short."""
    raised: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not raised:
            raised.append(signum)
            raise Terminated(signum)

    def send_again(swallowed: BaseException) -> None:
        # Raised inside a weakref callback, it never got out: the run would go on, deaf to SIGTERM.
        if isinstance(swallowed, Terminated):
            raised.clear()
        # Sent from another thread, a moment later: sent from here, its handler would run at once, in
        # this hook, where it cannot get out either (if it lands in a callback again, this repeats).
        signum = getattr(swallowed, "signum", signal.SIGINT)
        resend = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        resend.daemon = True
        resend.start()

    # Ctrl-C: KeyboardInterrupt, whatever handler was there before
    with (
        handlers_installed({signal.SIGTERM: handler, signal.SIGINT: signal.default_int_handler}),
        raised_from_handlers_unprinted((KeyboardInterrupt,), then=send_again),
    ):
        yield


def release_interrupted(error: BaseException, before: set[threading.Thread]) -> None:
    """Stop the Ray Data execution an interrupted run leaves behind, while Ray is still up.

    A signal that lands after Ray Data has started its executor but before its iterator's
    try/finally leaves the executor referenced only by the exception's frames: it went on
    inpainting after the run returned, and at interpreter exit, after ``ray.shutdown()``, its own
    shutdown started a new Ray instance and the process hung. One still running (an executor is
    its own thread, started since ``before``) is shut down as Ray Data shuts one down when its
    iteration ends, its actors killed; one whose work is done is freed from the frames, and Ray
    Data's finalizers shut it down."""
    running: list[Any] = []
    with contextlib.suppress(ImportError):  # a Ray Data that moved it: the frames below still free it
        from ray.data._internal.execution.streaming_executor import StreamingExecutor

        running = [t for t in threading.enumerate() if t not in before and isinstance(t, StreamingExecutor)]
    for executor in running:
        try:
            executor.shutdown(force=True)
        except Exception as e:  # the manifest is still to be completed: that goes first
            logger.debug("Ray Data's executor did not shut down: %s", first_line(e))
    traceback.clear_frames(error.__traceback__)  # keeps the frames (file, line), drops their locals
    gc.collect()  # the executor and its thread refer to each other


# Ray Data threads that sit parked once their iterator is closed: they call Ray only when fed.
_PARKED_RAY_THREADS = ("Prefetcher",)


def settle_ray_threads(before: set[threading.Thread], timeout: float = 10.0) -> list[str]:
    """Wait for the threads started since ``before`` (Ray Data's executor and iterator workers)
    to end. One still inside a Ray call when ``ray.shutdown()`` runs makes Ray's core worker end
    the whole process with status 1 ("The core worker has already been shutdown"), before the
    manifest is complete. Returns the names of those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    waiting = [t for t in threading.enumerate() if t not in before and t.name not in _PARKED_RAY_THREADS]
    for thread in waiting:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in waiting if t.is_alive()]


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


# What every gRPC server (a Ray GCS, a Ray Client server) answers at once: HTTP/2's connection
# preface, then an empty SETTINGS frame (9-byte header: length 0, type 0x4, no flags, stream 0).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# A side-effect-free call every Ray GCS serves (ray.init's own first call): a foreign gRPC
# server answers UNIMPLEMENTED, and a GCS a missing or wrong token UNAUTHENTICATED, where
# ray.init would retry either for about 20 s and end in "Failed to connect".
GCS_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
# Ray Client's own first call (its ping: ClusterInfo of type PING), which a Ray Client server
# answers at once, before any session exists; a GCS or a foreign gRPC server: UNIMPLEMENTED.
CLIENT_PROBE_METHOD = "/ray.rpc.RayletDriver/ClusterInfo"
TLS_FILES = ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT")  # what Ray reads with RAY_USE_TLS
# How long the TLS probe waits for grpc's connectivity thread to end (it polls every 0.2 s).
POLLER_JOIN_S = 1.0

logger = logging.getLogger(__name__)


def _shown(data: bytes) -> str:
    """The first line of what a foreign server sent, printable and short."""
    text = data.decode("ascii", "backslashreplace")
    return repr((text.splitlines() or [""])[0][:60])


def http2_greeting(sock: socket.socket, deadline: float) -> str | None:
    """None when the peer on ``sock`` answers HTTP/2's connection preface with a SETTINGS frame
    before ``deadline`` (``time.monotonic()``), as a gRPC server does; else what it did, in words."""
    header = b""
    try:
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        sock.sendall(HTTP2_PREFACE + HTTP2_EMPTY_SETTINGS)
        while len(header) < 9:
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            chunk = sock.recv(9 - len(header))
            if not chunk:
                return "it hung up " + (f"after sending {_shown(header)}" if header else "without an answer")
            header += chunk
    except TimeoutError:
        return "it stayed silent" + (f" after sending {_shown(header)}" if header else "")
    except OSError as e:  # a reset: it hung up with the preface unread
        return f"it hung up without an answer ({e.strerror or type(e).__name__})"
    if header[3] == 0x4 and int.from_bytes(header[5:9], "big") & 0x7FFFFFFF == 0:
        return None
    with contextlib.suppress(OSError):  # the rest of its first line, for the message
        sock.settimeout(max(min(0.2, deadline - time.monotonic()), 1e-3))
        header += sock.recv(120)
    return f"it answered {_shown(header)}"


WHICH_PORT = "is it the head node's GCS port (6379 by default), or ray://HOST:10001 for Ray Client?"
TOKEN_SOURCES = "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"


def _ray_auth_metadata() -> tuple[tuple[str, str], ...] | None:
    """The token header ray.init would send from this process (none unless RAY_AUTH_MODE=token),
    or None where this Ray does not tell: then a refused token is left to ray.init to report."""
    # Ray has no public way to ask: its own loader is private, hence the guards, so that the probe
    # sends exactly what Ray will or, where that is gone, gives no verdict on tokens at all.
    try:
        from ray._private.authentication.grpc_authentication_client_interceptor import (
            _get_authentication_metadata_tuple,
        )
    except ImportError as e:
        logger.debug("cannot tell which token Ray sends (%s): a refused token is left to ray.init", e)
        return None
    try:
        return tuple(_get_authentication_metadata_tuple())
    except Exception as e:  # a token file Ray cannot read, say: ray.init reports it in its words
        logger.debug("Ray's token loader failed (%s): a refused token is left to ray.init", first_line(e))
        return None


def _client_ping() -> bytes | None:
    """Ray Client's ping request, serialised by Ray's own generated module (None without Ray)."""
    try:
        from ray.core.generated import ray_client_pb2
    except ImportError:
        return None
    pb: Any = ray_client_pb2  # protobuf's generated names are made at import time: untyped
    return bytes(pb.ClusterInfoRequest(type=pb.ClusterInfoType.PING).SerializeToString())


def tls_credentials(address: str) -> Any:
    """grpcio's TLS credentials from Ray's own variables (as Ray builds them), or one InputError."""
    import grpc

    missing = [name for name in TLS_FILES if not os.environ.get(name)]
    if missing:
        raise InputError(
            f"cannot connect to the Ray cluster at {address}: RAY_USE_TLS is set but {', '.join(missing)} is not: Ray needs all of {', '.join(TLS_FILES)}"
        )
    pem = []
    for name in TLS_FILES:
        try:
            pem.append(Path(os.environ[name]).read_bytes())
        except OSError as e:
            raise InputError(
                f"cannot connect to the Ray cluster at {address}: cannot read {name} ({os.environ[name]}): {e.strerror or e}"
            ) from None
    cert, key, ca = pem
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def _grpc_cause(details: str | None) -> str:
    """grpcio's last connection error without its code and address: 'Handshake read failed (Socket
    closed)', 'Tls handshake failed (TSI_PROTOCOL_FAILURE)'."""
    found = re.search(r"last error: [A-Z_]+: \S+: ([^:]+)", details or "")
    return found.group(1).strip() if found else ((details or "").strip().splitlines() or ["no cause given"])[0][:120]


@contextlib.contextmanager
def _connectivity_states(channel: Any, watch: bool) -> Iterator[list[Any]]:
    """The states a grpc channel goes through while the block runs (none unless ``watch``).

    A subscription polls in a thread of grpc's own, which raises "Channel closed!" (a traceback
    on stderr) if the channel closes between two of its polls: it is ended here, before the
    channel closes."""
    states: list[Any] = []
    if not watch:
        yield states
        return
    before = set(threading.enumerate())
    channel.subscribe(states.append)
    pollers = set(threading.enumerate()) - before
    try:
        yield states
    finally:
        channel.unsubscribe(states.append)
        for thread in pollers:  # with no subscriber left it ends at its next poll (every 0.2 s)
            thread.join(timeout=POLLER_JOIN_S)


def check_ray_call(
    address: str,
    host: str,
    port: int,
    deadline: float,
    timeout: float,
    *,
    client: bool = False,
    credentials: Any = None,
) -> None:
    """Ray's first call to the gRPC server at host:port before ``deadline``, as ray.init (or, for a
    ``ray://`` address, Ray Client) makes it: the GCS's cluster id, or Ray Client's ping; both
    change nothing. One InputError where Ray would retry for 20 s or more: no such service (a
    foreign gRPC server), silence, a token it lacks or refuses, and with TLS (``credentials``) a
    handshake that fails."""
    try:
        import grpc  # comes with Ray
    except ImportError:
        return
    method, request = (CLIENT_PROBE_METHOD, _client_ping()) if client else (GCS_PROBE_METHOD, b"")
    if request is None:
        return
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    token = _ray_auth_metadata()
    options = [("grpc.enable_http_proxy", 0)]
    channel = (
        grpc.secure_channel(target, credentials, options) if credentials else grpc.insecure_channel(target, options)
    )
    # Only TLS needs the channel's states (READY: the TLS and HTTP/2 handshakes were done).
    with channel, _connectivity_states(channel, watch=credentials is not None) as states:
        call = channel.unary_unary(method)  # no (de)serializers: bytes in, bytes out
        try:
            call(request, timeout=max(deadline - time.monotonic(), 0.05), metadata=token or ())
            return
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
    first = "Ray Client's first call" if client else "Ray's first call"
    if code == grpc.StatusCode.UNAUTHENTICATED:  # it is Ray, with token authentication
        if token is None:
            return  # which token Ray sends is unknown here: no verdict
        raise InputError(
            f"cannot connect to the Ray cluster at {address}: it requires token authentication and "
            + (
                f"refuses this process's token (from {TOKEN_SOURCES}); give it the cluster's token"
                if token
                else f"this process sends no token; set RAY_AUTH_MODE=token and the cluster's token in {TOKEN_SOURCES}"
            )
        )
    what = {
        grpc.StatusCode.UNIMPLEMENTED: f"answered UNIMPLEMENTED to {first} (a foreign gRPC service, or a much older Ray)",
        grpc.StatusCode.DEADLINE_EXCEEDED: f"did not answer {first}",
    }.get(code)
    service = "Ray Client server" if client else "Ray GCS"
    handshaken = credentials is None or grpc.ChannelConnectivity.READY in states
    if (
        credentials is not None
        and not handshaken
        and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    ):
        cause = (
            "it stayed silent" if code == grpc.StatusCode.DEADLINE_EXCEEDED else f"it failed: {_grpc_cause(details)}"
        )
        raise InputError(
            f"cannot reach the Ray cluster at {address}: the port answers but no TLS connection was made "
            f"(RAY_USE_TLS is set): within {timeout:g} s {cause}; is TLS on at that port, and are "
            "RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY and RAY_TLS_CA_CERT the cluster's?"
        )
    if what is not None:  # anything else (e.g. a GCS going down) is left to ray.init to report
        spoken = "HTTP/2" if credentials is None else "gRPC over TLS"
        raise InputError(
            f"cannot reach the Ray cluster at {address}: the port speaks {spoken} but is not a {service}: "
            f"within {timeout:g} s it {what}; {WHICH_PORT}"
        )


def check_reachable(address: str, timeout: float) -> float:
    """A Ray GCS (or Ray Client server) at ``address`` within ``timeout`` seconds, or one InputError
    naming it; returns the seconds left of ``timeout``, for ``ray.init``.

    Ray itself retries an unreachable address for minutes, and waits 20 s to minutes on a port that
    answers but is not Ray: an unresolvable host, a closed port, an unroutable address, a server
    that stays silent, hangs up or speaks another protocol, a foreign gRPC server and a missing or
    refused Ray token are all caught here in at most ``timeout``. With ``RAY_USE_TLS`` the greeting is
    left out (it is inside TLS) and Ray's first call is made over TLS with Ray's certificates."""
    target = _split_address(address)
    if target is None:
        return timeout
    deadline = time.monotonic() + timeout
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")  # as Ray reads it
    client = address.startswith("ray://")  # Ray Client's server is gRPC too, but serves no GCS
    credentials = tls_credentials(address) if tls else None  # a missing certificate: refused before any wait
    outcome: list[BaseException | str | None] = []
    connected = threading.Event()

    def probe() -> None:
        try:
            # getaddrinfo can block on DNS far longer than any socket timeout: the thread bounds it.
            with socket.create_connection(target, timeout=timeout) as sock:
                connected.set()
                outcome.append(None if tls else http2_greeting(sock, deadline))
        except OSError as e:
            outcome.append(e)

    worker = threading.Thread(target=probe, name="gantool-ray-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    found = outcome[0] if outcome else None
    if not outcome and connected.is_set():
        found = "it stayed silent"  # the probe thread is still waiting for its SETTINGS frame
    if isinstance(found, str):
        raise InputError(
            f"cannot reach the Ray cluster at {address}: the port answers but does not speak gRPC, so it is "
            f"not a Ray {'Client server' if client else 'GCS'}: within {timeout:g} s {found}; {WHICH_PORT}"
        )
    if outcome and found is None:  # a gRPC server (or, with TLS, a TCP port): Ray's first call next
        check_ray_call(address, *target, deadline, timeout, client=client, credentials=credentials)
        return max(deadline - time.monotonic(), 0.0)
    cause: str = f"no answer within {timeout:g} s"
    if isinstance(found, OSError) and not isinstance(found, TimeoutError):
        cause = "unknown host" if isinstance(found, socket.gaierror) else (first_line(found) or type(found).__name__)
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
        # The probe found a Ray GCS, but Ray may still retry (a version mismatch, a GCS that went
        # away): a timer interrupts the main thread at the deadline. Ray waits for the GCS inside
        # C++ calls that Python cannot interrupt, so such a case fails after Ray's own wait.
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
    """Ctrl-C and SIGTERM ignored (main thread) while the manifest is completed: a second signal
    during the wind-down, of either kind (Ctrl-C, then SIGTERM from a job manager), would otherwise
    leave it half-written. The wind-down is short (Ray's shutdown)."""
    with handlers_installed(dict.fromkeys(STOP_SIGNALS, signal.SIG_IGN)):
        yield

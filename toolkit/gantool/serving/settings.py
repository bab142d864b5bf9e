"""The server's options (:class:`ServeSettings`, the ``gantool serve`` flags), checked once."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from gantool.core.constants import (
    DEFAULT_MAX_BLEND_PIXELS,
    DEFAULT_SERVE_BATCH_WAIT_MS,
    DEFAULT_SERVE_MAX_BATCH,
    DEFAULT_SERVE_MAX_HEADER_KB,
    DEFAULT_SERVE_MAX_HOLES,
    DEFAULT_SERVE_MAX_MODEL_PIXELS,
    DEFAULT_SERVE_MAX_PIXELS,
    DEFAULT_SERVE_MAX_QUEUE,
    DEFAULT_SERVE_MAX_UPLOAD_MB,
    DEFAULT_SERVE_MIN_UPLOAD_RATE_KB,
    DEFAULT_SERVE_READ_TIMEOUT,
    DEFAULT_SERVE_RELEASE_MEMORY_PIXELS,
    DEFAULT_SERVE_SHUTDOWN_TIMEOUT,
    DEFAULT_STRATEGY,
    STRATEGIES,
)
from gantool.core.errors import InputError, check_choice

INPAINT_PATH = "/v1/inpaint"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost: addresses other machines cannot reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(host: str) -> tuple[str, ...]:
    """``Host`` names answered when ``--allowed-host`` is not given: on loopback the bound
    address and localhost (a DNS-rebinding page sends its own name, refused); elsewhere
    any, since the names that reach the machine are not known here."""
    if not is_loopback(host):
        return ("*",)
    return tuple(sorted({host, "localhost"}))


def check_api_key(key: str | None, name: str = "--api-key") -> str | None:
    """The key, or InputError naming where it came from (``name``: the option, or the variable
    GANTOOL_API_KEY): one that no client could send the same way is refused at start."""
    if key is None or key == "":
        return None
    if not key.strip():
        raise InputError(f"{name} is blank: set a key, or leave it unset for no key")
    if key != key.strip():
        raise InputError(f"{name} has spaces around it: no client could send it (HTTP strips them); remove them")
    if not key.isascii() or not key.isprintable():
        raise InputError(f"{name} must be printable ASCII: browsers cannot send other characters in a header")
    return key


@dataclass(frozen=True)
class ServeSettings:
    """The server's limits and options (the ``gantool serve`` flags).

    ``allowed_hosts``: ``Host`` header names answered (``*`` any; a name with or without
    its port); the CLI's default is :func:`default_allowed_hosts`. Empty: any (library use).
    """

    max_batch: int = DEFAULT_SERVE_MAX_BATCH
    batch_wait_ms: float = DEFAULT_SERVE_BATCH_WAIT_MS
    max_queue: int = DEFAULT_SERVE_MAX_QUEUE
    max_upload_mb: float = DEFAULT_SERVE_MAX_UPLOAD_MB
    max_pixels: int = DEFAULT_SERVE_MAX_PIXELS
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    strategy: str = DEFAULT_STRATEGY
    read_timeout: float = DEFAULT_SERVE_READ_TIMEOUT
    min_upload_rate_kb: float = DEFAULT_SERVE_MIN_UPLOAD_RATE_KB
    max_header_kb: int = DEFAULT_SERVE_MAX_HEADER_KB
    shutdown_timeout: float = DEFAULT_SERVE_SHUTDOWN_TIMEOUT
    max_model_pixels: int = DEFAULT_SERVE_MAX_MODEL_PIXELS
    max_holes: int = DEFAULT_SERVE_MAX_HOLES
    max_blend_pixels: int = DEFAULT_MAX_BLEND_PIXELS
    release_memory_pixels: int = DEFAULT_SERVE_RELEASE_MEMORY_PIXELS
    allowed_hosts: tuple[str, ...] = field(default=())
    access_log: str = "off"  # "text" or "json": one line per request on stderr (gantool.serving.answers)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 1:
            raise InputError("--max-batch and --max-queue must be at least 1")
        if self.batch_wait_ms < 0 or self.max_upload_mb <= 0 or self.max_pixels < 1:
            raise InputError("--batch-wait-ms must be >= 0, --max-upload-mb and --max-pixels positive")
        if self.read_timeout <= 0 or self.min_upload_rate_kb <= 0 or self.max_header_kb < 1:
            raise InputError("--read-timeout, --min-upload-rate-kb and --max-header-kb must be positive")
        if self.shutdown_timeout < 0 or min(self.max_model_pixels, self.max_holes, self.max_blend_pixels) < 1:
            raise InputError(
                "--shutdown-timeout must be >= 0, --max-model-pixels, --max-holes and --max-blend-pixels positive"
            )
        if self.release_memory_pixels < 0:
            raise InputError("--release-memory-pixels must be >= 0 (0: never)")
        check_choice("strategy", self.strategy, STRATEGIES)
        check_choice("--access-log format", self.access_log, ("off", "text", "json"))
        check_api_key(self.api_key)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def max_header_bytes(self) -> int:
        return self.max_header_kb * 1024

    @property
    def min_upload_rate(self) -> float:
        """Bytes per second."""
        return self.min_upload_rate_kb * 1024

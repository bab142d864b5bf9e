"""Errors that carry a one-line message meant for the user.

The library raises these; the CLI turns them into ``click.ClickException`` so a
user sees one line and a non-zero exit code, never a traceback.
"""

from __future__ import annotations


class GantoolError(Exception):
    """Base class: anything the user can fix (bad input, missing file, ...)."""

    exit_code = 1


class InputError(GantoolError):
    """A user-supplied file, folder or option is unusable."""


class SizeLimitError(InputError):
    """An input is larger than a configured limit (pixels or bytes)."""


class CheckpointError(GantoolError):
    """A checkpoint is missing, corrupt or not a gantool checkpoint."""


class ModelError(GantoolError):
    """An exported model is missing, corrupt or fails parity."""


class NonFiniteError(ModelError):
    """A model's weights or output hold NaN or Inf (no other runtime would do better)."""


class StopRequested(GantoolError):
    """A stop signal arrived during work whose libraries swallowed it (torch.onnx, importlib's
    callbacks): the caller's check found it at the next step boundary."""


class ProviderError(GantoolError):
    """A requested execution provider / device cannot be used."""


class TrainingError(GantoolError):
    """Training cannot continue (for example a non-finite loss)."""


class ProcessLostError(TrainingError):
    """Under DDP, a collective failed because another process is gone (killed, crashed).

    Its own exit code tells ``gantool train --nproc-per-node``'s launcher that this
    process was a survivor, not the one that failed.
    """

    exit_code = 75  # EX_TEMPFAIL: nothing is wrong here; resume from the last checkpoint


def first_line(error: BaseException, limit: int = 400) -> str:
    """The first non-empty line of ``error``'s message, for one-line reports.

    The cause is kept whole: a line longer than ``limit`` is cut at a word
    boundary and marked, never in the middle of a word.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    if text.endswith(":") and len(lines) > 1:  # a heading ("Error(s) in loading state_dict for X:"): its details
        text = " ".join(lines)
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip() + " ..."


def choice_error(what: str, value: object, choices: tuple[str, ...] | list[str]) -> InputError:
    """The one wording for a value outside an enumeration."""
    return InputError(f"unknown {what} {value!r} (choose from {', '.join(choices)})")


def check_choice(what: str, value: str, choices: tuple[str, ...] | list[str]) -> str:
    """``value`` if it is one of ``choices``, else :func:`choice_error` raised."""
    if value not in choices:
        raise choice_error(what, value, choices)
    return value

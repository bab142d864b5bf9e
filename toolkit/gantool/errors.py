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


class CheckpointError(GantoolError):
    """A checkpoint is missing, corrupt or not a gantool checkpoint."""


class ModelError(GantoolError):
    """An exported model is missing, corrupt or fails parity."""


class ProviderError(GantoolError):
    """A requested execution provider / device cannot be used."""


class TrainingError(GantoolError):
    """Training cannot continue (for example a non-finite loss)."""

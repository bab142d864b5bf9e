"""Shared by the CLI tests (test_export.py, test_import_glcic.py, test_parity.py): running
``gantool`` in process and checking its one-line errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from gantool.cli import cli

# Tests that load TorchScript files themselves: torch 2.13 flags torch.jit with a DeprecationWarning,
# 2.14 with a FutureWarning. A module sets ``pytestmark = TORCH_JIT_WARNINGS``.
TORCH_JIT_WARNINGS = [
    pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning"),
]


def invoke(*args: object) -> Result:
    """``gantool ARGS`` in this process (each argument as its ``str``)."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_one_line_error(result: Result, *fragments: str) -> str:
    """The command failed with one ``Error`` line, no traceback, holding every fragment; returns that line."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], result.output
    return errors[0]

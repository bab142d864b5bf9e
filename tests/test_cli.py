"""The command line as a whole: every command's --help, the lazy loader, choices from the library."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from gantool.cli import COMMANDS, LazyGroup, cli
from gantool.core import constants


def _all_command_paths() -> list[list[str]]:
    paths: list[list[str]] = []

    def walk(group: click.Group, prefix: list[str]) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, f"{' '.join(prefix + [name])} is listed but cannot be loaded"
            paths.append(prefix + [name])
            if isinstance(command, click.Group):
                walk(command, prefix + [name])

    walk(cli, [])
    return paths


def test_every_command_and_subcommand_has_help() -> None:
    paths = _all_command_paths()
    assert {p[0] for p in paths} == set(COMMANDS)
    assert ["bench", "train"] in paths and ["bench", "inpaint"] in paths
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output and "--help" in result.output, path


def test_a_command_whose_module_is_missing_raises_instead_of_vanishing() -> None:
    group = LazyGroup(lazy={"typo": ("gantool.cli.no_such_module", "typo", "broken")})
    ctx = click.Context(group)
    assert "typo" in group.list_commands(ctx)
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        group.get_command(ctx, "typo")


def test_a_lazy_attribute_that_is_not_a_command_is_refused() -> None:
    group = LazyGroup(lazy={"odd": ("gantool.core.constants", "PROVIDERS", "not a command")})
    with pytest.raises(TypeError, match="not a click command"):
        group.get_command(click.Context(group), "odd")


@pytest.mark.parametrize(
    ("command", "option", "choices"),
    [
        (["inpaint"], "--provider", constants.PROVIDERS),
        (["inpaint"], "--backend", constants.BACKEND_CHOICES),
        (["inpaint"], "--precision", constants.PRECISIONS),
        (["inpaint"], "--strategy", constants.STRATEGIES),
        (["eval"], "--masks", constants.MASK_KINDS),
        (["eval"], "--provider", constants.PROVIDERS),
    ],
)
def test_cli_choices_come_from_the_library(command: list[str], option: str, choices: tuple[str, ...]) -> None:
    group: click.Group = cli
    ctx = click.Context(group)
    cmd = group.get_command(ctx, command[0])
    assert cmd is not None
    param = next(p for p in cmd.params if option in getattr(p, "opts", ()))
    assert isinstance(param.type, click.Choice)
    assert tuple(param.type.choices) == tuple(choices)


def test_info_prints_its_header_once(tmp_path) -> None:
    # `gantool info` once printed "FILE: KIND, N bytes" twice for a model file (and for a checkpoint).
    from conftest import random_generator, write_checkpoint
    from gantool.export.exporter import build_metadata
    from gantool.training.checkpoint import save_generator_weights

    generator = random_generator()
    checkpoint = write_checkpoint(tmp_path / "last.pt", generator, step=3, phase="g")
    state = {"model_config": generator.config.to_dict(), "generator": generator.state_dict(), "step": 3, "phase": "g"}
    model = save_generator_weights(tmp_path / "generator.safetensors", generator, build_metadata(state, "last.pt"))
    for path, header in ((model, f"{model}: safetensors, "), (checkpoint, f"{checkpoint}: checkpoint, ")):
        result = CliRunner().invoke(cli, ["info", str(path)])
        assert result.exit_code == 0, result.output
        headers = [line for line in result.output.splitlines() if line.startswith(header)]
        assert len(headers) == 1, result.output
        assert result.output.splitlines()[0] == headers[0]  # the header comes first

"""The package's structure stays as documented: one owner per fact, no import cycles,
and a README layout that matches the tree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gantool import artifacts

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "toolkit" / "gantool"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = path
    return mods


def _imports(path: Path, known: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            candidates = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found |= {c for c in candidates if c in known}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
    return found - {"gantool"}


def test_no_import_cycles_in_the_package() -> None:
    mods = _modules()
    graph = {name: _imports(path, set(mods)) - {name} for name, path in mods.items()}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in visiting, "import cycle: " + " -> ".join([*visiting[visiting.index(name) :], name])
        visiting.append(name)
        for dep in sorted(graph.get(name, ())):
            visit(dep)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def _string_literals() -> list[str]:
    literals = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.append(node.value)
    return literals


def test_each_export_file_name_and_metadata_key_is_written_once() -> None:
    literals = _string_literals()
    names = [a.filename for a in artifacts.ARTIFACTS]
    keys = [value for key, value in vars(artifacts).items() if key.startswith("META_") and key != "META_PREFIX"]
    assert len(keys) >= 9
    for fact in [*names, *keys, artifacts.TORCHSCRIPT_METADATA_ENTRY]:
        assert literals.count(fact) == 1, f"{fact!r} appears {literals.count(fact)} times as a string literal"



def test_each_run_folder_name_is_written_once() -> None:
    # The run folder's layout lives in gantool.constants; train, runfolder, runs, tracking,
    # export and artifacts name its files through it (runs.py once repeated them as literals).
    from gantool import constants

    literals = _string_literals()
    names = [constants.RUN_FILE, constants.RUN_CONFIG_FILE, constants.METRICS_FILE, constants.STATUS_FILE,
             constants.CHECKPOINTS_DIR, constants.LAST_CHECKPOINT, constants.SAMPLES_DIR]  # ("export" is also a command)
    for name in names:
        assert literals.count(name) == 1, f"{name!r} appears {literals.count(name)} times as a string literal"


def test_readme_layout_lists_every_module_and_nothing_else() -> None:
    text = (REPO / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1].split("\nmodels/", 1)[0]  # the package part
    listed = set(re.findall(r"^\s{2}(\w+\.py)\s", block, re.M))
    actual = {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert listed == actual, f"README Layout: missing {sorted(actual - listed)}, stale {sorted(listed - actual)}"

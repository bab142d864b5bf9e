"""The docs cannot drift: their command blocks run, and their options tables match ``--help``.

Both checks read README.md and docs/*.md as they are when the tests run, so a block or an
option that lands later is checked as soon as it does. The markers (HTML comments, which
GitHub does not render) are described in docs/development.md, "Docs that run":

- ``<!-- run -->`` on the line right before a ```bash (or ```python) fence: the default tier
  runs the block; ``<!-- run: slow -->``: only the slow tier runs it;
  ``<!-- skip: REASON -->``: never run, and the reason says why (a GPU, several machines, hours,
  a server that runs until Ctrl-C, ...). Every ```bash block carries one of the three.
- ``<!-- options: gantool CMD -->`` right before a table: the options table of ``gantool CMD``.

A page's blocks run in order in one scratch folder of their own (with a copy of examples/), with
``gantool`` and ``python`` the interpreter running the tests and the source tree's gantool, so
blocks must not collide: a later block that writes where an earlier one did fails as a user's
shell would. ``pip install -e .`` lines (with or without extras) are not run: the tests run in
the dev environment, which has every extra.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# ------------------------------------------------------------------------------ command blocks

RUN_MARKER = re.compile(r"^\s*<!--\s*(run|run:\s*slow|skip:\s*(?P<reason>\S.*?))\s*-->\s*$")
ANY_MARKER = re.compile(r"^\s*<!--\s*(run|skip)\b")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
SHELL_LANGS = {"bash", "sh", "shell", "console"}
RUNNABLE_LANGS = {"bash", "sh", "shell", "python"}


@dataclass
class Block:
    source: str  # "docs/training.md"
    line: int  # the fence's line, 1-based
    lang: str
    text: str
    marker: str | None  # "run", "slow", "skip" or None
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


class DocError(AssertionError):
    """A doc that breaks its own rules (a bad marker, a block that fails)."""


def command_blocks(text: str, source: str) -> list[Block]:
    """Every fenced block of ``text``, with the run/skip marker on the line before it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent = i, len(m.group("indent"))
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise DocError(f"{source}:{start + 1}: a ``` fence that is never closed")
        body = textwrap.dedent("\n".join(ln[indent:] if ln[:indent].isspace() else ln for ln in lines[start + 1 : end]))
        before = lines[start - 1] if start else ""
        marker, reason = None, ""
        if ANY_MARKER.match(before):
            mm = RUN_MARKER.match(before)
            if not mm:
                raise DocError(
                    f"{source}:{start}: bad marker {before.strip()!r}: use <!-- run -->, <!-- run: slow --> "
                    "or <!-- skip: REASON -->"
                )
            kind = mm.group(1)
            marker = "skip" if kind.startswith("skip") else "slow" if "slow" in kind else "run"
            reason = mm.group("reason") or ""
        lang = m.group("lang")
        if marker in ("run", "slow") and lang not in RUNNABLE_LANGS:
            raise DocError(f"{source}:{start + 1}: a ```{lang or '(no language)'} block cannot be marked to run")
        blocks.append(Block(source, start + 1, lang, body + "\n", marker, reason))
        i = end + 1
    return blocks


def unmarked_shell_blocks(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks if b.lang in SHELL_LANGS and b.marker is None]


# Options whose value is a path a command writes: two runnable blocks naming the same one collide
# (unless the later one says --overwrite, or continues a run with --resume).
WRITE_OPTIONS = {"--out", "-o", "--out-dir", "--output", "--plot", "--grid", "--manifest"}


def _commands(text: str) -> Iterator[list[str]]:
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            while words and re.match(r"^\w+=", words[0]):  # VAR=value prefixes
                words = words[1:]
            if words:
                yield words


def write_targets(blocks: list[Block]) -> list[str]:
    """Collisions: the same written path in two runnable blocks, across every page."""
    seen: dict[str, str] = {}
    clashes = []
    for block in blocks:
        if block.marker not in ("run", "slow") or block.lang == "python":
            continue
        for words in _commands(block.text):
            if "--overwrite" in words or "--resume" in words:
                continue
            for k, word in enumerate(words[:-1]):
                if word in WRITE_OPTIONS:
                    path = os.path.normpath(words[k + 1])
                    if path in seen:
                        clashes.append(f"{block.where}: {word} {words[k + 1]} was already written by {seen[path]}")
                    seen.setdefault(path, block.where)
    return clashes


@dataclass
class Scratch:
    folder: Path
    env: dict[str, str] = field(default_factory=dict)


PIP_SHIM = """#!/bin/sh
# The docs test runs in the dev environment, which has every extra: "pip install -e ." is not run.
case "$*" in
  "install -e ."|"install -e .[*]"|"install ."|"install gantool"*) echo "(docs test: skipped: pip $*)"; exit 0;;
esac
echo "docs test: only 'pip install -e .[extras]' may appear in a runnable block, not: pip $*" >&2
exit 2
"""


def make_scratch(folder: Path) -> Scratch:
    """A scratch folder with a copy of examples/ and ``gantool``, ``python`` and ``pip`` shims."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "examples", folder / "examples")
    bin_dir = folder.parent / f"{folder.name}-bin"
    bin_dir.mkdir(exist_ok=True)
    shims = {
        "gantool": f'#!/bin/sh\nexec "{sys.executable}" -m gantool "$@"\n',
        "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
        "python3": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
        "pip": PIP_SHIM,
    }
    for name, body in shims.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "toolkit"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return Scratch(folder, env)


def run_block(block: Block, scratch: Scratch, timeout: float = 600) -> None:
    """Run one block in the scratch folder; a non-zero exit raises DocError with its output."""
    if block.lang == "python":
        argv = [sys.executable, "-c", block.text]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    try:
        proc = subprocess.run(
            argv, cwd=scratch.folder, env=scratch.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        seen = b"".join(x if isinstance(x, bytes) else x.encode() for x in (e.stdout or b"", e.stderr or b""))
        tail = "\n".join(seen.decode(errors="replace").strip().splitlines()[-10:])
        raise DocError(f"{block.where}: the block ran past {timeout:.0f} s\n--- output so far ---\n{tail}") from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise DocError(f"{block.where}: the block failed (exit {proc.returncode}):\n{block.text}\n--- output ---\n{tail}")


def run_page(blocks: list[Block], scratch: Scratch, tiers: tuple[str, ...]) -> list[str]:
    """Run a page's blocks of the given tiers in order; returns where each ran."""
    ran = []
    for block in blocks:
        if block.marker in tiers:
            # The slow tier's exports and runs take minutes on a loaded 2-core machine.
            run_block(block, scratch, timeout=600 if block.marker == "run" else 1800)
            ran.append(block.where)
    return ran


def _all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in command_blocks(path.read_text(), _rel(path))]


def test_every_shell_block_is_marked_run_or_skip_with_a_reason() -> None:
    assert unmarked_shell_blocks(_all_blocks()) == [], (
        "mark each ```bash block <!-- run -->, <!-- run: slow --> or <!-- skip: REASON --> (docs/development.md)"
    )


def test_runnable_blocks_do_not_write_to_the_same_place() -> None:
    assert write_targets(_all_blocks()) == []


def _pages_with(tier: str) -> list[Path]:
    return [p for p in doc_files() if any(b.marker == tier for b in command_blocks(p.read_text(), _rel(p)))]


@pytest.mark.parametrize("page", _pages_with("run"), ids=_rel)
def test_the_runnable_blocks_of_a_page_run_in_order(page: Path, tmp_path: Path) -> None:
    blocks = command_blocks(page.read_text(), _rel(page))
    assert run_page(blocks, make_scratch(tmp_path / "scratch"), ("run",))


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with("slow"), ids=_rel)
def test_every_runnable_block_of_a_page_runs_in_order_slow_ones_too(page: Path, tmp_path: Path) -> None:
    blocks = command_blocks(page.read_text(), _rel(page))
    assert run_page(blocks, make_scratch(tmp_path / "scratch"), ("run", "slow"))


BROKEN_PAGE = """\
# A page

<!-- run -->
```bash
mkdir -p out && echo ok > out/first.txt
```

Text between blocks.

<!-- skip: needs a GPU -->
```bash
gantool train --device cuda
```

<!-- run -->
```bash
test -f out/first.txt            # the first block's output is there: blocks run in order
gantool train --no-such-option   # broken on purpose
```
"""


def test_the_block_runner_fails_on_a_broken_block_and_names_it(tmp_path: Path) -> None:
    blocks = command_blocks(BROKEN_PAGE, "page.md")
    assert [(b.line, b.marker, b.reason) for b in blocks] == [(4, "run", ""), (11, "skip", "needs a GPU"), (16, "run", "")]
    with pytest.raises(DocError, match=r"(?s)page\.md:16: the block failed.*no-such-option"):
        run_page(blocks, make_scratch(tmp_path / "scratch"), ("run",))
    assert (tmp_path / "scratch" / "out" / "first.txt").read_text() == "ok\n"  # and ran the first one
    fixed = BROKEN_PAGE.replace("gantool train --no-such-option", "gantool train --help > /dev/null")
    assert run_page(command_blocks(fixed, "page.md"), make_scratch(tmp_path / "again"), ("run",)) == [
        "page.md:4",
        "page.md:16",
    ]


def test_the_marker_rules_catch_unmarked_and_misspelt_blocks() -> None:
    unmarked = "Text.\n\n```bash\ngantool doctor\n```\n\n```\nplain output is not a command\n```\n"
    assert unmarked_shell_blocks(command_blocks(unmarked, "p.md")) == ["p.md:3"]
    with pytest.raises(DocError, match="bad marker"):
        command_blocks("<!-- skip -->\n```bash\ngantool doctor\n```\n", "p.md")  # a skip needs its reason
    with pytest.raises(DocError, match="cannot be marked to run"):
        command_blocks("<!-- run -->\n```\ngantool doctor\n```\n", "p.md")
    with pytest.raises(DocError, match="never closed"):
        command_blocks("```bash\ngantool doctor\n", "p.md")


def test_the_collision_check_catches_two_blocks_writing_one_run_folder() -> None:
    page = (
        "<!-- run -->\n```bash\ngantool train --steps-g 2 --out runs/demo\n```\n"
        "<!-- run -->\n```bash\ngantool train --resume runs/demo/checkpoints/last.pt --steps-joint 4\n"
        "gantool export runs/demo/checkpoints/last.pt -o runs/demo/export --overwrite\n```\n"
        "<!-- run: slow -->\n```bash\ngantool train --steps-g 4 \\\n    --out runs/demo/\n```\n"
    )
    assert write_targets(command_blocks(page, "p.md")) == ["p.md:11: --out runs/demo/ was already written by p.md:2"]


# ------------------------------------------------------------------------------ options tables

TABLE_MARKER = re.compile(r"^\s*<!--\s*options:\s*(?P<command>gantool(?:\s+[\w-]+)*)\s*-->\s*$")
OPTION_TOKEN = re.compile(r"^--?[A-Za-z0-9][\w-]*$")


@dataclass
class Row:
    where: str
    cell: str  # the first cell


@dataclass
class Table:
    command: str
    where: str
    rows: list[Row]


def _cells(line: str) -> list[str]:
    # "\|" inside a cell is a literal bar (`auto\|onnx`), not a column.
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def options_tables(text: str, source: str) -> tuple[list[Table], list[str]]:
    """The marked options tables of a page, and errors: a marker without a table, an
    options table (first header cell "option") without a marker."""
    lines = text.splitlines()
    tables, errors = [], []
    marked_at: set[int] = set()
    for i, line in enumerate(lines):
        m = TABLE_MARKER.match(line)
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j + 1 >= len(lines) or not lines[j].lstrip().startswith("|") or "---" not in lines[j + 1]:
            errors.append(f"{source}:{i + 1}: <!-- options: {m.group('command')} --> is not followed by a table")
            continue
        marked_at.add(j)
        rows = []
        k = j + 2
        while k < len(lines) and lines[k].lstrip().startswith("|"):
            rows.append(Row(f"{source}:{k + 1}", _cells(lines[k])[0]))
            k += 1
        tables.append(Table(" ".join(m.group("command").split()), f"{source}:{i + 1}", rows))
    for j, line in enumerate(lines):
        header = line.lstrip().startswith("|") and j + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[j + 1])
        if header and _cells(line)[0].lower() in ("option", "options") and j not in marked_at:
            errors.append(f"{source}:{j + 1}: an options table without <!-- options: gantool CMD --> before it")
    return tables, errors


@dataclass
class CommandOptions:
    options: list[click.Option]
    arguments: set[str]  # metavars as docs write them: CHECKPOINT, IMAGES


def cli_options(root: click.Command | None = None) -> dict[str, CommandOptions]:
    """Every command of the click tree (the group itself included) and its options, --help left out."""
    if root is None:
        from gantool.cli import cli as root
    found: dict[str, CommandOptions] = {}

    def walk(command: click.Command, path: str, ctx: click.Context) -> None:
        help_names = set(command.get_help_option_names(ctx))
        options = [p for p in command.params if isinstance(p, click.Option) and not set(p.opts) <= help_names]
        # An argument may be named by its name in capitals or by the metavar --help shows.
        arguments = {p.name.upper() for p in command.params if isinstance(p, click.Argument) and p.name}
        arguments |= {p.metavar.upper() for p in command.params if isinstance(p, click.Argument) and p.metavar}
        if options or arguments:
            found[path] = CommandOptions(options, arguments)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, f"{path} {name} cannot be loaded"
                walk(sub, f"{path} {name}", click.Context(sub, parent=ctx, info_name=name))

    walk(root, "gantool", click.Context(root, info_name="gantool"))
    return found


def _row_names(cell: str) -> tuple[set[str], set[str]]:
    """Option-like and upper-case words inside the backtick spans of a first cell."""
    options, words = set(), set()
    for span in re.findall(r"`([^`]+)`", cell):
        for token in re.split(r"[\s,/|\\]+", span):
            if OPTION_TOKEN.match(token):
                options.add(token)
            elif re.fullmatch(r"[A-Z][A-Z0-9_]*(\.\.\.)?", token):
                words.add(token.removesuffix("..."))
    return options, words


def check_options_tables(commands: dict[str, CommandOptions], tables: list[Table]) -> list[str]:
    """Both ways: every option of every command in its command's table(s); every row names one."""
    errors = []
    by_command: dict[str, list[Table]] = {}
    for table in tables:
        if table.command not in commands:
            errors.append(f"{table.where}: no command {table.command!r} has options")
            continue
        by_command.setdefault(table.command, []).append(table)
    for name, spec in sorted(commands.items()):
        mine = by_command.get(name, [])
        if not mine:
            if spec.options:
                errors.append(f"{name}: no options table (put <!-- options: {name} --> before one in docs/)")
            continue
        known = {n for opt in spec.options for n in [*opt.opts, *opt.secondary_opts]}
        help_names = {"-h", "--help"}
        documented: set[str] = set()
        for table in mine:
            for row in table.rows:
                options, words = _row_names(row.cell)
                for option in sorted(options - known - help_names):
                    errors.append(f"{row.where}: {option} is not an option of {name}")
                documented |= options
                named = (options & (known | help_names)) or (words & spec.arguments)
                if not named:
                    errors.append(f"{row.where}: the row {row.cell!r} names no option or argument of {name}")
        for opt in spec.options:
            missing = [n for n in opt.opts if n not in documented]
            if missing:
                errors.append(f"{name} {'/'.join(opt.opts)}: {', '.join(missing)} missing from its options table "
                              f"({', '.join(t.where for t in mine)})")  # fmt: skip
    return errors


def _all_tables() -> tuple[list[Table], list[str]]:
    tables, errors = [], []
    for path in doc_files():
        t, e = options_tables(path.read_text(), _rel(path))
        tables += t
        errors += e
    return tables, errors


def test_every_options_table_is_marked_with_its_command() -> None:
    assert _all_tables()[1] == []


def test_options_tables_match_every_commands_help_both_ways() -> None:
    assert check_options_tables(cli_options(), _all_tables()[0]) == []


@click.command("toy")
@click.argument("checkpoint")
@click.option("-o", "--out-dir")
@click.option("--amp/--no-amp", default=None)
@click.option("--quiet", is_flag=True)
def _toy(checkpoint: str, out_dir: str, amp: bool, quiet: bool) -> None:
    """A command to check the checker with."""


TOY_PAGE = """\
<!-- options: gantool -->
| option | meaning |
|---|---|
| `CHECKPOINT` | the checkpoint |
| `-o, --out-dir DIR` | where |
| `--amp/--no-amp` | bf16 `auto\\|on` |
| `--quiet` | no bar |
"""


def test_the_options_check_fails_on_a_missing_option_and_on_a_stale_row() -> None:
    commands = cli_options(_toy)
    assert set(commands) == {"gantool"}
    tables, errors = options_tables(TOY_PAGE, "p.md")
    assert errors == [] and check_options_tables(commands, tables) == []
    missing = TOY_PAGE.replace("| `--quiet` | no bar |\n", "")
    assert check_options_tables(commands, options_tables(missing, "p.md")[0]) == [
        "gantool --quiet: --quiet missing from its options table (p.md:1)"
    ]
    short = TOY_PAGE.replace("`-o, --out-dir DIR`", "`--out-dir DIR`")
    assert check_options_tables(commands, options_tables(short, "p.md")[0]) == [
        "gantool -o/--out-dir: -o missing from its options table (p.md:1)"
    ]
    stale = TOY_PAGE + "| `--old-flag` | gone |\n| plain words | nothing |\n"
    assert check_options_tables(commands, options_tables(stale, "p.md")[0]) == [
        "p.md:8: --old-flag is not an option of gantool",
        "p.md:8: the row '`--old-flag`' names no option or argument of gantool",
        "p.md:9: the row 'plain words' names no option or argument of gantool",
    ]
    unmarked = TOY_PAGE.split("\n", 1)[1]
    tables, errors = options_tables(unmarked, "p.md")
    assert tables == [] and errors == ["p.md:1: an options table without <!-- options: gantool CMD --> before it"]
    assert check_options_tables(commands, tables) == ["gantool: no options table (put <!-- options: gantool --> before one in docs/)"]


# ------------------------------------------------------------------------------ names and links

# Metadata keys of files exported by older versions, named in the docs as such.
LEGACY_METADATA_KEYS = {"gantool.exported_at"}


def python_name_resolves(name: str) -> bool:
    """``gantool.a.b.c``: the longest importable module prefix, then attributes."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def stale_python_names(text: str, source: str) -> list[str]:
    from gantool.core import artifacts

    keys = {v for k, v in vars(artifacts).items() if k.startswith("META_") and isinstance(v, str)}
    stale = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in re.finditer(r"`(gantool(?:\.[A-Za-z_]\w*)+)", line):
            name = m.group(1)
            if name not in keys | LEGACY_METADATA_KEYS and not python_name_resolves(name):
                stale.append(f"{source}:{n}: {name}")
    return stale


def _anchors(text: str) -> set[str]:
    anchors = set()
    for line in text.splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:  # GitHub's slugs: lower case, punctuation dropped, spaces to hyphens
            anchors.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def broken_links(path: Path) -> list[str]:
    """Relative links whose file, or whose #anchor in that file, does not exist."""
    text = path.read_text()
    text_no_code = re.sub(r"```.*?```", "", text, flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text_no_code):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{_rel(path)}: ]({target}): no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
            broken.append(f"{_rel(path)}: ]({target}): no heading #{anchor} in {_rel(dest)}")
    return broken


# Importing gantool.serving.ray_serve imports Ray Serve, whose config models use a Pydantic 1 idiom.
@pytest.mark.filterwarnings("ignore:Using extra keyword arguments on `Field`:DeprecationWarning:ray.serve")
def test_python_names_in_the_docs_exist() -> None:
    assert [s for p in doc_files() for s in stale_python_names(p.read_text(), _rel(p))] == []


def test_links_between_the_docs_point_at_files_and_headings_that_exist() -> None:
    assert [b for p in doc_files() for b in broken_links(p)] == []


def test_the_name_and_link_checks_catch_a_moved_module_and_a_dangling_anchor(tmp_path: Path) -> None:
    text = "Use `gantool.core.processing.poisson_blend`, not `gantool.processing.poisson_blend`; `gantool.precision`.\n"
    assert stale_python_names(text, "p.md") == ["p.md:1: gantool.processing.poisson_blend"]
    (tmp_path / "other.md").write_text("# Other\n\n## The run folder\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nSee [it](other.md#the-run-folder), [that](#the-run-folder) and [x](gone.md).\n")
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == [
        "](#the-run-folder): no heading #the-run-folder in " + _rel(page),
        "](gone.md): no such file",
    ]

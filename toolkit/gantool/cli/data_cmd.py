"""``gantool data``: pack training images into WebDataset shards, check a data set."""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any

import click

DATA_HELP_EPILOG = """\b
Examples:
  gantool data pack ~/photos -o shards/ --shard-size 500MB
  gantool data check shards/
  gantool data check "shards/train-{000000..000009}.tar"
  gantool data check train.txt --json
  gantool train --data shards/ ...
"""

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}  # fmt: skip


class ByteSize(click.ParamType):
    """A size such as ``500MB``, ``1.5GB``, ``256MiB`` or a plain byte count."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _UNITS:
            self.fail(f"{value!r} is not a size (examples: 500MB, 1GB, 256MiB, 100000000)", param, ctx)
        size = int(float(match.group(1)) * _UNITS[unit])
        if size < 1:
            self.fail(f"{value!r} must be at least one byte", param, ctx)
        return size


class OneLineErrors(click.Command):
    """Bad option values are one line (no usage block), like every other error (as ``gantool train``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise click.ClickException(e.format_message()) from None


quiet_option = click.option(
    "--quiet", is_flag=True, help="No progress bar (there is none where stderr is not a terminal)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.group(epilog=DATA_HELP_EPILOG)
def data() -> None:
    """Training data: pack images into WebDataset shards; check a folder, list or shard set."""


@data.command("pack", cls=OneLineErrors, epilog=DATA_HELP_EPILOG)
@click.argument("source", type=click.Path(exists=True))
@click.option(
    "-o", "--out", required=True, type=click.Path(file_okay=False), help="New (or empty) folder for the shards."
)
@click.option(
    "--shard-size", type=ByteSize(), default="500MB", show_default=True, help="Bytes per shard (500MB, 1GB, ...)."
)
@click.option("--shard-samples", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="At most this many images per shard.")  # fmt: skip
@click.option("--prefix", default="train", show_default=True, help="Shard names: PREFIX-000000.tar, ...")
@quiet_option
@json_option
def pack(source: str, out: str, shard_size: int, shard_samples: int, prefix: str, quiet: bool, as_json: bool) -> None:
    """Pack the images of SOURCE (a folder, recursive, or a list file) into tar shards.

    Each image is stored as it is (no re-encode) under a sequential key; OUT gets
    the shards and gantool-shards.json (counts, sizes, SHA-256 of each shard and
    of the set, the source's fingerprint). OUT appears whole or not at all; an
    existing non-empty folder is refused. Train on them with --data OUT.
    """
    from gantool.training.packing import pack_images

    manifest = pack_images(source, out, shard_size, shard_samples, prefix, progress=not quiet and not as_json)
    if as_json:
        click.echo(json.dumps({**manifest, "out": out}, indent=1))
        return
    skipped = manifest["skipped"]
    click.echo(
        f"packed {manifest['images']} image(s) into {len(manifest['shards'])} shard(s), "
        f"{_size(manifest['bytes'])}, in {manifest['seconds']:.1f} s: {out}"
    )
    if skipped["count"]:
        click.echo(f"left out {skipped['count']} file(s) that are not images (first: {skipped['first'][0]})", err=True)
    click.echo(f"train on them with: gantool train --data {shlex.quote(str(out))}")


@data.command("check", cls=OneLineErrors, epilog=DATA_HELP_EPILOG)
@click.argument("data_path", metavar="DATA")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Decoding threads.  [default: the CPUs]")
@quiet_option
@json_option
def check(data_path: str, threads: int | None, quiet: bool, as_json: bool) -> None:
    """Read and decode every image of DATA: a folder, a list file or shards (as --data takes them).

    Reports counts, sizes, unreadable images, a list's missing files, broken
    (truncated, damaged) shards and samples without an image. Exits 1 when any
    problem was found.
    """
    from gantool.training.packing import check_data

    report = check_data(data_path, progress=not quiet and not as_json, threads=threads)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        _echo_report(report)
    if not report.ok:
        sys.exit(1)


def _echo_report(report: Any) -> None:
    what = "sample(s)" if report.kind == "shards" else "image file(s)"
    shards = f" in {report.shards} shard(s)" if report.kind == "shards" else ""
    click.echo(f"{report.kind}: {report.data}")
    click.echo(f"  {report.entries} {what}{shards}, {_size(report.bytes)}, read in {report.seconds:.1f} s")
    if report.linked:
        click.echo(f"  {report.linked} through folder links")
    problems = [
        (report.unreadable, "unreadable image(s)", report.unreadable_first),
        (report.missing, "missing file(s) named by the list", report.missing_first),
        (len(report.broken_shards), "broken shard(s)", report.broken_shards),
    ]
    for count, label, first in problems:
        if count:
            click.echo(f"  {count} {label}:", err=True)
            for line in first:
                click.echo(f"    {line}", err=True)
            if count > len(first):
                click.echo(f"    ... and {count - len(first)} more", err=True)
    if report.without_image:
        click.echo(f"  {report.without_image} sample(s) without an image member (left out by training)")
    if report.entries == 0:
        click.echo("  no images", err=True)
    click.echo("ok" if report.ok else "problems found", err=not report.ok)


def _size(count: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"

"""What build-machine traces a model file carries, and the scrubbers that remove them.

Exporters annotate what they write: torch's ONNX exporter puts a Python stack
trace (absolute paths of the checkout and the virtualenv) on every node, and
``torch.jit.save`` adds a ``.debug_pkl`` beside each code file with the traced
source locations. Shipped models must not leak user names, folder layouts or
library paths, and two exports of the same weights should be byte-identical.

- :func:`find_machine_traces` scans any model file (ONNX, a zip archive such as
  TorchScript, ``.pt2`` or a ``torch.save`` file, safetensors, else raw bytes)
  for absolute paths and Python stack traces; ``gantool export`` uses it to
  assert a clean result, ``gantool info`` to warn.
- :func:`strip_onnx_debug_info` removes the exporter's ``metadata_props`` and
  ``doc_string`` annotations below the model level.
- :func:`strip_torchscript_debug_info` rewrites a TorchScript archive without
  its ``.debug_pkl`` entries (``torch.jit.load`` treats them as optional).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickletools
import re
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gantool.core.errors import ModelError, first_line
from gantool.core.fileio import atomic_write_bytes

_FILE_EXTENSIONS = (
    "py|pyc|pyx|pyi|so|dylib|dll|c|cc|cpp|cxx|h|hpp|cu|cuh|pt|pth|pt2|ckpt|bin|onnx|safetensors|json|toml|yaml|yml"
    "|txt|log|png|jpe?g|npz|npy|pkl|zip|tar|gz|sh|ipynb"
)
_NAME = r"[\w.+@~-]+"
_START = r"(?<![\w.~/\\-])"  # not inside a word or a relative path (ONNX names such as "Net/sub" stay clean)
# An absolute path: under a home folder (names the user), or ending in a file name with a known extension,
# or two folders deep under a typical data/build root; Windows drive paths likewise.
_ABSOLUTE_PATH = re.compile(
    rf"{_START}/(?:{_NAME}/)+{_NAME}\.(?:{_FILE_EXTENSIONS})\b"
    rf"|{_START}/(?:home|Users|root)/{_NAME}(?:/{_NAME})*"
    # /usr/include and /usr/lib (system headers a compiled library names) say nothing about the machine.
    rf"|{_START}/(?:tmp|var|private|opt|usr(?!/(?:include|lib)/)|mnt|media|srv|scratch|nix|Volumes|work|workspace|content|kaggle)"
    rf"(?:/{_NAME}){{2,}}"
    # Windows: separators single or JSON-escaped (C:\\Users\\... in a .pt2's model.json).
    r"|(?<![A-Za-z])[A-Za-z]:\\\\?(?:[^\\\s\"'<>|*?:\x00]+\\\\?)+[^\\\s\"'<>|*?:\x00]*",
)
_STACK_FRAME = re.compile(r'File \\?"[^"\n]{1,500}?\\?", line \d+')  # also JSON-escaped (torch.export's .pt2)
_EXAMPLE_CHARS = 100
# Tensor payloads inside torch zip archives are raw numbers, never text: TorchScript and torch.save store
# them as data/N, torch.export's .pt2 (and AOTInductor's) as data/weights/<name> and data/constants/<name>.
# Read as latin-1, random weight bytes match a path pattern about once per few MB, so they are skipped;
# the JSON configs beside them (model_weights_config.json, ...) are text and are read.
_TENSOR_ENTRY = re.compile(r"(?:^|/)(?:data/\d+|data/(?:weights|constants)/[^/]+(?<!\.json))$")
_NESTED_ZIP_DEPTH = 2  # .pt2 archives hold torch.save archives (data/sample_inputs/model.pt)
# ELF sections that hold no text: AOTInductor links the frozen weights into .lrodata (.ldata when mutated);
# code, symbol, relocation, hash and unwind tables are binary too. Every other section is read.
_ELF_BINARY_SECTIONS = frozenset({".lrodata", ".ldata", ".eh_frame", ".eh_frame_hdr", ".gcc_except_table"})
_ELF_BINARY_TYPES = frozenset({2, 4, 5, 8, 9, 11, 0x6FFFFFF6, 0x6FFFFFFE, 0x6FFFFFFF})  # SYMTAB RELA HASH NOBITS ...
_ELF_EXECUTABLE = 0x4
_RAW_CHUNK = 16 * 2**20


@dataclass
class _Finding:
    count: int
    kinds: set[str]
    example: str


def _home_pattern() -> re.Pattern[str] | None:
    home = str(Path.home()).rstrip("/\\")
    return re.compile(re.escape(home) + r"(?![\w.-])") if len(home) > 1 else None


def _scan_text(text: str) -> tuple[set[str], str] | None:
    """The kinds of trace in ``text`` (``absolute path``, ``stack trace``) and one example."""
    kinds, example = set(), ""
    frame = _STACK_FRAME.search(text)
    if frame:
        kinds.add("Python stack trace")
        example = frame.group(0)
    path = _ABSOLUTE_PATH.search(text)
    home = _home_pattern()
    home_match = home.search(text) if home else None
    if path or home_match:
        kinds.add("absolute path")
        example = example or (path or home_match).group(0)  # type: ignore[union-attr]
    return (kinds, example[:_EXAMPLE_CHARS]) if kinds else None


def _record(findings: dict[str, _Finding], where: str, text: str) -> None:
    hit = _scan_text(text)
    if hit is None:
        return
    kinds, example = hit
    found = findings.setdefault(where, _Finding(0, set(), example))
    found.count += 1
    found.kinds |= kinds


def _describe(findings: dict[str, _Finding], unit: str) -> list[str]:
    lines = []
    for where, found in findings.items():
        kinds = " and ".join(sorted(found.kinds, reverse=True))
        plural = unit if found.count == 1 else ("entries" if unit == "entry" else f"{unit}s")
        lines.append(f"{where}: {kinds} in {found.count} {plural} (e.g. {found.example})")
    return lines


# ------------------------------------------------------------------------------ ONNX


def _onnx_strings(message: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every text field below ``message`` as (field path, text); weights are skipped."""
    for field, value in message.ListFields():
        name = f"{where}.{field.name}" if where else field.name
        if field.type == field.TYPE_MESSAGE:
            for item in [value] if hasattr(value, "ListFields") else value:
                if item.DESCRIPTOR.name == "StringStringEntryProto":
                    yield f"{name}[{item.key}]", f"{item.key}\n{item.value}"
                else:
                    yield from _onnx_strings(item, name)
        elif field.type == field.TYPE_STRING:
            yield from ((name, text) for text in ([value] if isinstance(value, str) else value))
        elif field.type == field.TYPE_BYTES and message.DESCRIPTOR.name == "AttributeProto":
            # String attributes are bytes in ONNX; tensor bytes (raw_data) are weights, not text.
            for data in [value] if isinstance(value, bytes) else value:
                yield name, data.decode("latin-1")


def _onnx_traces(path: Path) -> list[str]:
    import onnx  # delays importing onnx until an ONNX file is scanned

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises its own DecodeError for corrupt files
        raise ModelError(f"{path} is not a readable ONNX model ({first_line(e)})") from None
    findings: dict[str, _Finding] = {}
    for where, text in _onnx_strings(model, ""):
        _record(findings, where, text)
    return _describe(findings, "field")


def strip_onnx_debug_info(model: Any) -> int:
    """Remove ``metadata_props`` and ``doc_string`` from everything below the ModelProto.

    That is nodes (also inside subgraphs), graphs, functions, inputs, outputs,
    value_info and initializers. The model's own metadata and doc string stay.
    Returns how many annotations were removed.
    """
    return sum(_strip_below(item) for item in _child_messages(model))


def _child_messages(message: Any) -> Iterator[Any]:
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            yield from [value] if hasattr(value, "ListFields") else value


def _strip_below(message: Any) -> int:
    if message.DESCRIPTOR.name == "StringStringEntryProto":
        return 0
    removed = sum(_strip_below(item) for item in _child_messages(message))
    fields = message.DESCRIPTOR.fields_by_name
    if "metadata_props" in fields and len(message.metadata_props):
        removed += len(message.metadata_props)
        message.ClearField("metadata_props")
    if "doc_string" in fields and message.doc_string:
        removed += 1
        message.ClearField("doc_string")
    return removed


# ------------------------------------------------------------------- zip archives


def _zip_traces(path: Path) -> list[str]:
    findings: dict[str, _Finding] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            _scan_archive(archive, "", findings, _NESTED_ZIP_DEPTH)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ModelError(f"{path} is not a readable zip archive ({first_line(e)})") from None
    return _describe(findings, "entry")


def _scan_archive(archive: zipfile.ZipFile, prefix: str, findings: dict[str, _Finding], depth: int) -> None:
    """Every entry but tensor payloads; an entry that is itself a zip archive is scanned the same way."""
    for info in archive.infolist():
        if info.is_dir() or _TENSOR_ENTRY.search(info.filename):
            continue
        inner = prefix + info.filename.split("/", 1)[-1]  # without the archive's root folder
        data = archive.read(info)
        if depth > 0 and data[:4] == b"PK\x03\x04":
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as nested:
                    _scan_archive(nested, f"{inner}/", findings, depth - 1)
                continue
            except (zipfile.BadZipFile, EOFError):
                pass  # looks like a zip but is not: read as bytes below
        where = "archive entries *.debug_pkl" if inner.endswith(".debug_pkl") else f"archive entry {inner}"
        for text in _entry_texts(inner, data):
            _record(findings, where, text)


def _elf_text_parts(data: bytes) -> list[bytes] | None:
    """The sections of a 64-bit little-endian ELF library that may hold text (None: not such a file).

    Weights (.lrodata), machine code, symbol and relocation tables are left out:
    their bytes are numbers, and read as latin-1 they match path patterns by chance.
    """
    if data[:6] != b"\x7fELF\x02\x01" or len(data) < 64:
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_at = headers[shstrndx][4]
    except (struct.error, IndexError):
        return None
    parts = []
    for name_offset, kind, flags, _, offset, size in headers:
        end = data.find(b"\0", names_at + name_offset)
        name = data[names_at + name_offset : end].decode("latin-1")
        if name in _ELF_BINARY_SECTIONS or kind in _ELF_BINARY_TYPES or flags & _ELF_EXECUTABLE or kind == 0:
            continue
        parts.append(data[offset : offset + size])
    return parts


def _entry_texts(name: str, data: bytes) -> Iterator[str]:
    """The text of one archive entry: each string of a pickle, the text sections of
    a compiled library, else the bytes as latin-1.

    A pickled string sits between binary opcodes, so scanning raw bytes would
    glue a path to the next opcode ("activation.py" + BINPUT "q"); pickletools
    walks the opcodes without running anything.
    """
    elf = _elf_text_parts(data)
    if elf is not None:
        yield from (part.decode("latin-1") for part in elf)
        return
    if name.endswith((".pkl", ".debug_pkl")):
        try:
            strings = [arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, (str, bytes))]
        except Exception:  # a damaged or foreign pickle: fall back to the raw bytes
            pass
        else:
            yield from (s if isinstance(s, str) else s.decode("latin-1") for s in strings)
            return
    yield data.decode("latin-1")


def strip_torchscript_debug_info(path: str | Path, root: str | None = None) -> int:
    """Rewrite the TorchScript archive at ``path`` without its ``.debug_pkl`` entries.

    ``torch.jit.save`` has no option to leave out the source-location records
    (``<code file>.debug_pkl``, which hold absolute paths of the traced Python
    files); ``torch.jit.load`` reads them only when present. ``root`` renames the
    archive's top folder (torch names it after the file being written, which is a
    temp name during an export). The rewrite is atomic; entries keep their order
    and compression, dates are fixed, and ``.data/serialization_id`` is derived
    from the kept contents so equal models give equal bytes. Returns how many
    entries were dropped.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            entries = [(info, archive.read(info)) for info in archive.infolist()]
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ModelError(f"{path} is not a readable TorchScript archive ({first_line(e)})") from None
    kept = [(info, data) for info, data in entries if not info.filename.endswith(".debug_pkl")]
    digest = hashlib.sha256()
    for info, data in kept:
        if not info.filename.endswith("/.data/serialization_id"):
            digest.update(info.filename.split("/", 1)[-1].encode() + b"\0" + data)
    serialization_id = str(int.from_bytes(digest.digest()[:16], "big")).zfill(40)[-40:].encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as out:
        for info, data in kept:
            _, sep, inner = info.filename.partition("/")
            name = f"{root}/{inner}" if root is not None and sep else info.filename
            if name.endswith("/.data/serialization_id"):
                data = serialization_id
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type = info.compress_type
            entry.external_attr = 0o644 << 16
            entry.create_system = 3
            # Align each record's data to 64 bytes as torch's writer does, so storages stay mmap-able.
            entry.extra = _alignment_padding(out.fp.tell() if out.fp else 0, len(name.encode()))
            out.writestr(entry, data)
    atomic_write_bytes(path, buffer.getvalue())
    return len(entries) - len(kept)


def _alignment_padding(offset: int, name_bytes: int, alignment: int = 64) -> bytes:
    """A zip extra field ('FB', as torch writes) that pads the local header so data starts aligned."""
    start = offset + 30 + name_bytes + 4  # local header, file name, the extra field's own header
    pad = -start % alignment
    return struct.pack("<HH", 0x4246, pad) + b"Z" * pad


# ----------------------------------------------------------------- other formats


def _safetensors_traces(path: Path) -> list[str]:
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(length, 100 * 2**20)))
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise ModelError(f"{path} is not a readable safetensors file ({first_line(e)})") from None
    findings: dict[str, _Finding] = {}
    for key, value in (header.get("__metadata__") or {}).items():
        _record(findings, f"safetensors metadata[{key}]", f"{key}\n{value}")
    for key in header:
        _record(findings, "safetensors tensor names", key)
    return _describe(findings, "value")


def _raw_traces(path: Path) -> list[str]:
    findings: dict[str, _Finding] = {}
    tail = ""
    with open(path, "rb") as f:
        while chunk := f.read(_RAW_CHUNK):
            text = tail + chunk.decode("latin-1")
            _record(findings, "file bytes", text)
            tail = text[-1024:]  # a trace cut at a chunk boundary is found in the next round
    for found in findings.values():
        found.count = 1  # overlapping chunks: report the file once
    return _describe(findings, "place")


def find_machine_traces(path: str | Path, name: str | None = None) -> list[str]:
    """Absolute paths and Python stack traces that ``path`` carries, one line per place found.

    ONNX files are walked field by field (weights skipped); zip archives
    (TorchScript, ``.pt2``, ``torch.save``) entry by entry: tensor payloads
    (``data/N``, ``data/weights/*``, ``data/constants/*``) and the weight and code
    sections of a compiled library are skipped, every text, JSON and pickle entry
    is read, nested archives likewise; safetensors files by their header;
    anything else byte by byte.
    The format follows the suffix of ``name`` (default: the file's own name; pass
    the final name when ``path`` is a temp file). An empty list means none was
    found. Raises ModelError for unreadable files.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    suffix = Path(name).suffix if name is not None else path.suffix
    if suffix == ".onnx":
        return _onnx_traces(path)
    if suffix == ".safetensors":
        return _safetensors_traces(path)
    if zipfile.is_zipfile(path):
        return _zip_traces(path)
    return _raw_traces(path)


def redact_paths(text: str) -> str:
    """``text`` with every absolute path replaced by ``<path>/`` plus its last part."""

    def last_part(match: re.Match[str]) -> str:
        name = re.split(r"[\\/]", match.group(0).rstrip("/\\"))[-1]
        return f"<path>/{name}"

    redacted = _ABSOLUTE_PATH.sub(last_part, text)
    home = _home_pattern()
    return home.sub("<home>", redacted) if home else redacted

"""Exports carry no trace of the machine that built them (gantool.export.provenance):
reproducible bytes from two working folders, --keep-debug-info, the scanner and
scrubbers on foreign files, and ``gantool info``'s warning."""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto, helper

from conftest import random_generator, write_checkpoint
from gantool.cli import cli
from gantool.core.config import ModelConfig
from gantool.core.errors import ModelError
from gantool.export.exporter import export_generator
from gantool.export.provenance import (
    find_machine_traces,
    redact_paths,
    strip_onnx_debug_info,
    strip_torchscript_debug_info,
)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning", "ignore:`torch.jit:FutureWarning")

TRACE = 'Traceback (most recent call last):\n  File "/home/alice/project/model.py", line 12, in forward\n    x = f(x)'
ONNX_OUTPUTS = ("generator.onnx", "generator_fp16.onnx")


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def start_export_in(folder: Path, env: dict[str, str], hash_seed: str = "0") -> subprocess.Popen[str]:
    """``gantool export last.pt`` started in a fresh process whose working folder is ``folder``
    (it writes ``folder/out``).

    ``hash_seed``: PYTHONHASHSEED, so set iteration orders differ between the two exports."""
    return subprocess.Popen(
        [sys.executable, "-m", "gantool", "export", "last.pt", "--fp16", "--onnx", "--pt2", "--torchscript", "--no-verify",
         "-o", "out"],
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env, PYTHONHASHSEED=hash_seed),
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_exports(checkpoint_factory, tmp_path_factory, subprocess_env):
    """The same checkpoint exported from two different working folders (different depths and names)."""
    checkpoint = checkpoint_factory("trained", seed=11, step=9, phase="joint")
    first = tmp_path_factory.mktemp("checkout_a")
    second = tmp_path_factory.mktemp("another_checkout") / "nested" / "deeper"
    second.mkdir(parents=True)
    for folder in (first, second):
        shutil.copy(checkpoint, folder / "last.pt")
    # Side by side: two processes that share nothing but the checkpoint's bytes (each export is
    # mostly single-threaded tracing, so on 2 cores this halves the wait).
    procs = [start_export_in(first, subprocess_env, "1"), start_export_in(second, subprocess_env, "2")]
    errors = [proc.communicate(timeout=600)[1] for proc in procs]  # both finish before any assert
    for proc, stderr in zip(procs, errors, strict=True):
        assert proc.returncode == 0, stderr
    return first / "out", second / "out"


@pytest.fixture(scope="module")
def debug_export(checkpoint_factory, tmp_path_factory):
    out = tmp_path_factory.mktemp("debug") / "out"
    result = invoke("export", checkpoint_factory("random", seed=12), "--keep-debug-info", "--no-verify", "-o", out)
    assert result.exit_code == 0, result.output
    return out


# ------------------------------------------------------------------ reproducible, clean exports


def test_same_checkpoint_from_two_folders_gives_identical_onnx_bytes(two_exports):
    first, second = two_exports
    for name in (*ONNX_OUTPUTS, "generator.safetensors", "generator.torchscript.pt", "generator.pt2"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_exports_from_other_folders_name_none_of_them(two_exports):
    for out in two_exports:
        folder = out.parent
        for path in out.iterdir():
            blobs = [path.read_bytes()]
            if zipfile.is_zipfile(path):
                with zipfile.ZipFile(path) as archive:
                    blobs += [archive.read(name) for name in archive.namelist()]
            for needle in (str(folder), str(folder.parent), str(Path.home()), 'File "/'):
                assert not any(needle.encode() in blob for blob in blobs), (path.name, needle)
            assert find_machine_traces(path) == [], path.name


# ------------------------------------------------------------------------ --keep-debug-info


def test_keep_debug_info_keeps_the_exporters_annotations(debug_export):
    model = onnx.load(str(debug_export / "generator.onnx"))
    keys = {prop.key for node in model.graph.node for prop in node.metadata_props}
    assert "pkg.torch.onnx.stack_trace" in keys
    assert b'File "/' in (debug_export / "generator.onnx").read_bytes()
    with zipfile.ZipFile(debug_export / "generator.torchscript.pt") as archive:
        assert any(name.endswith(".debug_pkl") for name in archive.namelist())
    onnx_traces = find_machine_traces(debug_export / "generator.onnx")
    assert any("pkg.torch.onnx.stack_trace" in line and "Python stack trace" in line for line in onnx_traces)
    assert any(".debug_pkl" in line for line in find_machine_traces(debug_export / "generator.torchscript.pt"))
    assert find_machine_traces(debug_export / "generator.safetensors") == []


def test_info_warns_about_a_model_that_carries_traces(debug_export):
    result = invoke("info", debug_export / "generator.onnx")
    assert result.exit_code == 0, result.output
    assert "Warning:" in result.output and "pkg.torch.onnx.stack_trace" in result.output
    assert "gantool.weights_sha256" in result.output  # the metadata is still shown
    result = invoke("info", debug_export / "generator.torchscript.pt", "--json")
    assert result.exit_code == 0, result.output
    assert any(".debug_pkl" in line for line in json.loads(result.stdout)["warnings"])


def test_export_help_lists_keep_debug_info():
    result = invoke("export", "--help")
    assert result.exit_code == 0 and "--keep-debug-info" in result.output


def test_export_fails_and_writes_nothing_when_a_file_stays_dirty(checkpoint_factory, tmp_path, monkeypatch):
    import gantool.export.formats

    monkeypatch.setattr(gantool.export.formats, "strip_onnx_debug_info", lambda model: 0)  # a scrubber that misses
    out = tmp_path / "out"
    with pytest.raises(ModelError, match="generator.onnx still carries build-machine traces"):
        export_generator(checkpoint_factory("random", seed=13), out, formats=["onnx"], verify=False)
    assert not out.exists() or list(out.iterdir()) == []


# ------------------------------------------------------------- the scanner on foreign files


def dirty_onnx(path: Path, with_gantool_metadata: bool = False) -> Path:
    """A tiny model with traces where other exporters put them: node and graph
    annotations, a doc string inside an If branch, a function, a value."""
    inner = helper.make_node("Identity", ["x"], ["y_then"], doc_string=TRACE)
    branch = helper.make_graph([inner], "then", [], [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, [1])])
    node = helper.make_node("Relu", ["x"], ["r"])
    node.metadata_props.add(key="source", value="/Users/bob/code/net.py:3")
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    if_node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph(
        [node, cond, if_node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )  # fmt: skip
    graph.metadata_props.add(key="built_in", value="C:\\Users\\carol\\work\\export.py")
    graph.input[0].doc_string = "from /tmp/build42/inputs/x"
    relu = helper.make_node("Relu", ["a"], ["b"])
    function = helper.make_function("local", "F", ["a"], ["b"], [relu], [helper.make_opsetid("", 18)])
    function.node[0].doc_string = TRACE
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, functions=[function], opset_imports=opsets)
    model.metadata_props.add(key="producer_note", value="made by hand")
    if with_gantool_metadata:
        model.metadata_props.add(key="gantool.version", value="0.0.0")
    onnx.save(model, str(path))
    return path


def test_scanner_finds_traces_in_a_foreign_onnx_everywhere(tmp_path):
    traces = find_machine_traces(dirty_onnx(tmp_path / "foreign.onnx"))
    text = "\n".join(traces)
    for where in (
        "graph.node.attribute.g.node.doc_string",
        "graph.node.metadata_props[source]",
        "graph.metadata_props[built_in]",
        "graph.input.doc_string",
        "functions.node.doc_string",
    ):
        assert where in text, (where, traces)
    assert "Python stack trace" in text and "/home/alice" in text


def test_strip_onnx_debug_info_cleans_nodes_graphs_functions_and_values(tmp_path):
    model = onnx.load(str(dirty_onnx(tmp_path / "foreign.onnx")))
    assert strip_onnx_debug_info(model) >= 6
    onnx.save(model, str(tmp_path / "clean.onnx"))
    assert find_machine_traces(tmp_path / "clean.onnx") == []
    assert [(p.key, p.value) for p in model.metadata_props] == [("producer_note", "made by hand")]  # kept
    onnx.checker.check_model(model)


def test_info_warns_about_a_foreign_model_it_cannot_describe(tmp_path):
    result = invoke("info", dirty_onnx(tmp_path / "foreign.onnx"))
    assert result.exit_code != 0 and "Traceback (most recent" not in result.output.split("Warning")[0]
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "no gantool metadata" in errors[0]
    assert "Warning:" in result.output and "/Users/bob/code/net.py" in result.output


def test_info_warns_about_a_foreign_model_with_gantool_metadata(tmp_path):
    result = invoke("info", dirty_onnx(tmp_path / "tagged.onnx", with_gantool_metadata=True))
    assert result.exit_code == 0, result.output
    assert "gantool.version: 0.0.0" in result.output and "Warning:" in result.output


def test_scanner_leaves_exporter_names_alone(tmp_path):
    # Node names and namespaces with slashes, the processing contract: no paths.
    node = helper.make_node("Relu", ["x"], ["/body/body.0/Conv_output_0"], name="/body/body.0/Relu")
    node.metadata_props.add(key="namespace", value="gantool.nn.networks.CompletionNetwork/sub: aten.sub.Tensor")
    node.metadata_props.add(key="note", value="mask: 1 = hole, values in [0, 1], N x 3 x H x W, a/b/c.py")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("/body/body.0/Conv_output_0", TensorProto.FLOAT, [1])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph), str(tmp_path / "names.onnx"))
    assert find_machine_traces(tmp_path / "names.onnx") == []


def test_scanner_reads_torchscript_safetensors_and_other_files(tmp_path):
    scripted = tmp_path / "relu.pt"
    torch.jit.save(torch.jit.script(torch.nn.Sequential(torch.nn.ReLU())), str(scripted))  # any source
    traces = find_machine_traces(scripted)
    assert traces and all("archive entr" in line for line in traces)

    program = tmp_path / "relu.pt2"  # torch.export keeps each node's stack trace in its JSON
    torch.export.save(torch.export.export(torch.nn.ReLU(), (torch.rand(2, 3),)), str(program))
    assert any("Python stack trace" in line for line in find_machine_traces(program))

    header = (
        b'{"__metadata__":{"origin":"/home/dave/runs/x/last.pt"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    )
    header += b" " * (-len(header) % 8)
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
    assert any("safetensors metadata[origin]" in line for line in find_machine_traces(weights))

    other = tmp_path / "model.bin"
    other.write_bytes(b"\x00\x01" * 100 + TRACE.encode() + b"\xff" * 100)
    assert any("Python stack trace" in line for line in find_machine_traces(other))
    plain = tmp_path / "plain.bin"
    plain.write_bytes(bytes(range(256)) * 8)
    assert find_machine_traces(plain) == []


def test_scanner_failure_paths(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        find_machine_traces(tmp_path / "missing.onnx")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 50)
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        find_machine_traces(corrupt)
    bad_header = tmp_path / "bad.safetensors"
    bad_header.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(ModelError, match="safetensors"):
        find_machine_traces(bad_header)
    with pytest.raises(ModelError, match="not a readable TorchScript archive"):
        strip_torchscript_debug_info(corrupt)
    assert corrupt.read_bytes() == b"\x08\x07garbage" * 50  # left untouched


def test_strip_torchscript_debug_info_keeps_a_loadable_equal_module(tmp_path):
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.ReLU()).eval()
    example = torch.rand(1, 3, 8, 8)
    path = tmp_path / "traced.pt"
    torch.jit.save(torch.jit.trace(module, example), str(path), _extra_files={"meta.json": "{}"})
    assert find_machine_traces(path)
    assert strip_torchscript_debug_info(path, root="traced") > 0
    assert find_machine_traces(path) == []
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        assert archive.testzip() is None
    assert {name.split("/")[0] for name in names} == {"traced"}
    files = {"meta.json": ""}
    loaded = torch.jit.load(str(path), _extra_files=files)
    assert files["meta.json"] == b"{}"
    with torch.no_grad():
        assert torch.equal(loaded(example), module(example))


def test_redact_paths_keeps_only_the_last_part():
    text = "CUDA failed: libcudnn.so.9 not found in /usr/lib/x86_64/libcudnn.so (see /home/eve/log.txt)"
    redacted = redact_paths(text)
    assert "/usr/lib" not in redacted and "/home/eve" not in redacted
    assert "<path>/libcudnn.so" in redacted and "<path>/log.txt" in redacted
    assert redact_paths("plain words, a/b relative") == "plain words, a/b relative"


def test_scanner_finds_pickled_paths_under_any_root(tmp_path):
    # A path in a pickle is followed by an opcode byte ("activation.py" + BINPUT "q"), and the
    # checkout may live anywhere (CI builds under /check/...). Found before: only under /work, /tmp...
    path = "/check/work/main/.ci-venv/lib/python3.11/site-packages/torch/nn/modules/activation.py"
    archive = tmp_path / "model.pt"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("model/code/__torch__/m.py.debug_pkl", pickle.dumps(("FORMAT", (path, 3)), protocol=2))
        out.writestr("model/data.pkl", pickle.dumps({"note": "no path here"}, protocol=2))
    traces = find_machine_traces(archive)
    assert len(traces) == 1 and "archive entries *.debug_pkl: absolute path" in traces[0], traces
    assert "activation.py" in traces[0]


# ------------------------------------------------------------ tensor payloads are never read as text


def _hostile_blob(rng, size: int) -> bytes:
    """Random bytes (as weights look to a text scanner) with a Windows-drive-path look-alike inside,
    the false positive random float32 bytes produce about once per few MB."""
    blob = bytearray(rng.bytes(size))
    letters = rng.integers(ord("a"), ord("z") + 1, 8).astype("uint8").tobytes()
    fake = letters[:1].upper() + b":\\" + letters[1:5] + b"\\" + letters[5:]
    at = int(rng.integers(0, size - len(fake)))
    blob[at : at + len(fake)] = fake
    return bytes(blob)


def _pt2_like(path: Path, rng, blobs: int, model_json: str = '{"graph": "clean"}') -> Path:
    """An archive laid out like torch.export's .pt2: weights, constants, their JSON configs, a nested
    torch.save archive of sample inputs, the program's JSON."""
    nested = io.BytesIO()
    torch.save({"image": torch.from_numpy(rng.random((1, 3, 32, 32), dtype=np.float32))}, nested)
    with zipfile.ZipFile(path, "w") as out:
        for i in range(blobs):
            out.writestr(f"archive/data/weights/weight_{i}", _hostile_blob(rng, int(rng.integers(64, 2048))))
            out.writestr(f"archive/data/constants/lifted_tensor_{i}", _hostile_blob(rng, 64))
        out.writestr("archive/data/weights/model_weights_config.json", json.dumps({"config": {"weight_0": {}}}))
        out.writestr("archive/data/constants/model_constants_config.json", "{}")
        out.writestr("archive/data/sample_inputs/model.pt", nested.getvalue())
        out.writestr("archive/models/model.json", model_json)
        out.writestr("archive/.data/serialization_id", "0" * 40)
    return path


def test_scanner_skips_pt2_weights_and_constants_but_reads_every_text_entry(tmp_path):
    from gantool.export.provenance import _scan_text

    rng = np.random.default_rng(20)
    assert _scan_text(_hostile_blob(rng, 1024).decode("latin-1")), "the payload must look like a path when read"
    clean = _pt2_like(tmp_path / "generator.pt2", rng, blobs=2000)  # 4000 payload entries, ~2.5 MB
    assert find_machine_traces(clean) == []
    planted = "C:\\Users\\alice\\project\\train.py"
    dirty = _pt2_like(tmp_path / "dirty.pt2", rng, blobs=50, model_json=json.dumps({"origin": planted}))
    traces = find_machine_traces(dirty)
    assert len(traces) == 1 and traces[0].startswith("archive entry models/model.json: absolute path"), traces
    with zipfile.ZipFile(tmp_path / "config.pt2", "w") as out:  # the JSON configs beside the payloads are read
        out.writestr("archive/data/weights/model_weights_config.json", json.dumps({"path": "/home/alice/w.bin"}))
    assert "data/weights/model_weights_config.json" in find_machine_traces(tmp_path / "config.pt2")[0]
    nested = io.BytesIO()
    torch.save({"note": "/home/alice/inputs/sample.png"}, nested)  # a pickle inside a nested archive
    with zipfile.ZipFile(tmp_path / "nested.pt2", "w") as out:
        out.writestr("archive/data/sample_inputs/model.pt", nested.getvalue())
    assert "archive entry data/sample_inputs/model.pt/data.pkl" in find_machine_traces(tmp_path / "nested.pt2")[0]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_scanner_reads_a_compiled_librarys_strings_but_not_its_weight_section(tmp_path):
    """AOTInductor links the frozen weights into the library's .lrodata section: skipped; a path in
    its strings (.rodata) is still found."""
    rng = np.random.default_rng(21)
    weights = ", ".join(str(b) for b in _hostile_blob(rng, 8192))

    def library(name: str, extra: str = "") -> Path:
        source = tmp_path / f"{name}.c"
        source.write_text(
            f'__attribute__((section(".lrodata"), used)) const unsigned char constants[] = {{{weights}}};\n'
            f"int kernel(int x) {{ return x * 3; }}\n{extra}"
        )
        built = tmp_path / f"{name}.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-o", built, source], check=True, capture_output=True, timeout=120)
        package = tmp_path / f"{name}.aoti.pt2"
        with zipfile.ZipFile(package, "w") as out:
            out.writestr("archive/data/aotinductor/model/model.wrapper.so", built.read_bytes())
        return package

    assert find_machine_traces(library("clean")) == []
    dirty = library("dirty", 'const char *where(void) { return "/home/alice/build/model.cpp"; }\n')
    traces = find_machine_traces(dirty)
    assert len(traces) == 1 and "model.wrapper.so: absolute path" in traces[0], traces


# ------------------------------------------------- full-width exports: real weights, several seeds

FULL_WIDTH = ModelConfig(width=64, disc_width=8, disc_fc=64, size=64, local_size=32)  # GLCIC's generator width
PT2_SEEDS = (1, 2, 3)


def _payloads(archive: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """The tensor payload entries of a .pt2 (named here independently of the scanner's own pattern)."""
    return [
        info for info in archive.infolist()
        if ("/data/weights/" in info.filename or "/data/constants/" in info.filename)
        and not info.filename.endswith(".json")
    ]  # fmt: skip


@pytest.mark.slow
def test_full_width_pt2_exports_of_several_seeds_scan_clean_and_a_planted_path_is_found(tmp_path):
    """#20: the scanner read raw float32 weights as text, and a Windows-path pattern matched random
    bytes about once per few MB, so full-width exports failed at random. Three seeds of real-size
    weights: the export (which scans its files) succeeds, every file scans clean, and read as text
    the payloads would have matched (so this test fails on the old scanner); a path planted in a
    text entry of the same archive is still found."""
    from gantool.export.provenance import _scan_text

    would_match, payload_bytes, payload_entries = 0, 0, 0
    for seed in PT2_SEEDS:
        run = tmp_path / f"seed-{seed}"
        checkpoint = write_checkpoint(run / "checkpoints" / "last.pt", random_generator(FULL_WIDTH, seed))
        result = export_generator(checkpoint, run / "export", formats=["pt2"], verify=False)
        for path in result.out_dir.iterdir():
            assert find_machine_traces(path) == [], (seed, path.name)
        with zipfile.ZipFile(result.out_dir / "generator.pt2") as archive:
            payloads = _payloads(archive)
            for info in payloads:
                data = archive.read(info)
                payload_bytes += len(data)
                would_match += _scan_text(data.decode("latin-1")) is not None
        payload_entries += len(payloads)
    assert payload_entries >= 3 * 30 and payload_bytes >= 3 * 2**20 * 10, (payload_entries, payload_bytes)
    # Deterministic for these seeds (CPU init and BatchNorm folding are exact): 3 of the 105 payloads
    # (73 MB) matched the Windows-path pattern here, about one per 25 MB.
    assert would_match >= 1, f"no payload looks like a path when read as text ({payload_bytes} bytes)"

    # A path planted in a text entry (the program's JSON) beside the same real weights is found.
    clean = tmp_path / f"seed-{PT2_SEEDS[0]}" / "export" / "generator.pt2"
    dirty = tmp_path / "dirty.pt2"
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(dirty, "w") as out:
        (program,) = [name for name in src.namelist() if name.endswith("models/model.json")]
        for info in src.infolist():
            data = src.read(info)
            if info.filename == program:
                data = data.replace(b"{", b'{"origin": "C:\\\\Users\\\\alice\\\\project\\\\train.py", ', 1)
            out.writestr(info, data)
    traces = find_machine_traces(dirty)
    assert len(traces) == 1 and traces[0].startswith("archive entry models/model.json: absolute path"), traces
    assert "alice" in traces[0]


AOTI_WIDTH = 64


@pytest.mark.slow
def test_a_full_width_aoti_package_scans_clean(tmp_path):
    """--aoti once at full width: inductor links the frozen weights into the package's library
    (its .lrodata section), which the scanner skips while it reads the library's strings; the
    package, and the .pt2 the export writes beside it, scan clean."""
    config = dataclasses.replace(FULL_WIDTH, width=AOTI_WIDTH)
    checkpoint = write_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", random_generator(config, seed=4))
    out = tmp_path / "run" / "export"
    result = export_generator(checkpoint, out, formats=["aoti"], aoti_device="cpu", verify=False)
    package = result.out_dir / "generator.aoti.pt2"
    for path in result.out_dir.iterdir():
        assert find_machine_traces(path) == [], path.name
    with zipfile.ZipFile(package) as archive:
        sizes = {info.filename: info.file_size for info in archive.infolist()}
    library = [name for name in sizes if name.endswith(".so")]
    conv_weights = sum(p.numel() for p in random_generator(config).parameters() if p.ndim == 4) * 4
    assert library and sum(sizes.values()) >= conv_weights, sizes  # the real-size weights are inside

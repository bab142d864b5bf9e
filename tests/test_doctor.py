"""gantool doctor: honest about what loads (a session per provider), flags broken
installs with a fix, and exits 0 whenever the CPU works."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import gantool.tools.doctor as doctor
from gantool.cli import cli
from gantool.runtime.providers import cuda_device_visible

NO_GPU = pytest.mark.skipif(cuda_device_visible(), reason="checks the report of a machine without a GPU")
GPU = pytest.mark.skipif(not cuda_device_visible(), reason="needs an NVIDIA GPU")


def test_probe_model_runs_on_the_cpu():
    import onnxruntime as ort

    session = ort.InferenceSession(doctor.probe_model_bytes(), providers=["CPUExecutionProvider"])
    out = session.run(["y"], {"x": np.array([[1.0, 2.0, 3.0, -1.0]], np.float32)})[0]
    np.testing.assert_array_equal(out, [[2.0, 3.0, 4.0, 0.0]])


def test_installed_versions_reads_distribution_metadata():
    import importlib.metadata

    found = doctor.installed_versions(("onnxruntime-gpu", "onnxruntime", "surely-not-a-package-xyz"))
    assert "surely-not-a-package-xyz" not in found
    for name, version in found.items():
        assert version == importlib.metadata.version(name)
    assert found, "onnxruntime or onnxruntime-gpu must be installed for these tests"


@NO_GPU
def test_cpu_machine_is_reported_honestly():
    import onnxruntime as ort

    report = doctor.diagnose()
    assert report.gpu_visible is False
    assert report.cpu_usable
    checks = {c.name: c for c in report.providers}
    assert checks["CPUExecutionProvider"].loadable and checks["CPUExecutionProvider"].ran
    assert checks["CPUExecutionProvider"].active_providers == ["CPUExecutionProvider"]
    assert report.onnxruntime["available_providers"] == ort.get_available_providers()
    if "CUDAExecutionProvider" in ort.get_available_providers():  # onnxruntime-gpu on a CPU machine
        cuda = checks["CUDAExecutionProvider"]
        assert not cuda.loadable and not cuda.ran
        assert cuda.active_providers == ["CPUExecutionProvider"]  # what really ran: the silent fallback
        assert "no NVIDIA GPU is visible" in cuda.cause
        infos = [f for f in report.findings if "CUDAExecutionProvider" in f.message]
        assert infos and all(f.level == "info" for f in infos)  # a missing GPU is not an error
    assert not any(f.level == "error" for f in report.findings)


def test_both_onnxruntime_packages_together_is_a_problem_with_a_fix(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(doctor, "installed_versions", lambda: {"onnxruntime": "1.20.0", "onnxruntime-gpu": "1.31.1"})
    report = doctor.diagnose(test_providers=False)
    clash = [f for f in report.findings if "installed together" in f.message]
    assert len(clash) == 1 and clash[0].level == "problem"
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in clash[0].fix
    assert report.cpu_usable  # a problem to fix, but the CPU path itself still works here


def test_unimportable_onnxruntime_is_an_error_and_exit_1(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(doctor, "onnxruntime_info", lambda: ({"importable": False, "error": "No module named 'onnxruntime'"}, None))
    monkeypatch.setattr(doctor, "installed_versions", lambda: {})
    report = doctor.diagnose()
    errors = [f for f in report.findings if f.level == "error"]
    assert errors and "pip install onnxruntime" in errors[0].fix
    assert not report.cpu_usable
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 1
    assert "usable on the CPU: NO" in result.output and "Traceback" not in result.output


def test_a_gpu_without_a_working_cuda_provider_is_a_problem(monkeypatch: pytest.MonkeyPatch):
    checks = [
        doctor.ProviderCheck("CUDAExecutionProvider", False, False, ["CPUExecutionProvider"], "libcudnn.so.9: not found"),
        doctor.ProviderCheck("CPUExecutionProvider", True, True, ["CPUExecutionProvider"]),
    ]
    info = {"importable": True, "version": "1.31.1", "packages": {"onnxruntime-gpu": "1.31.1"}}
    findings = doctor._ort_findings(info, checks, gpu=True, tested=True)
    assert [f.level for f in findings] == ["problem"]
    assert "libcudnn.so.9" in findings[0].message and "onnxruntime-gpu[cuda,cudnn]" in findings[0].fix
    # The same on a machine without a GPU is only information.
    assert [f.level for f in doctor._ort_findings(info, checks, gpu=False, tested=True)] == ["info"]


def test_cli_json_schema():
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["cpu_usable"] is True
    assert {"python", "platform", "gpu_visible", "torch", "onnxruntime", "providers", "findings"} <= set(data)
    assert data["torch"]["installed"] and data["torch"]["version"]
    for check in data["providers"]:
        assert set(check) == {"name", "loadable", "ran", "active_providers", "cause"}
    for finding in data["findings"]:
        assert finding["level"] in ("error", "problem", "info")


def test_console_entry_runs_doctor(subprocess_env):
    proc = subprocess.run([sys.executable, "-m", "gantool", "doctor"], capture_output=True, text=True,
                          env=subprocess_env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CPUExecutionProvider: loads and runs" in proc.stdout
    assert "usable on the CPU: yes" in proc.stdout


@GPU
def test_cuda_loads_on_a_gpu_machine():
    report = doctor.diagnose()
    checks = {c.name: c for c in report.providers}
    cuda = checks.get("CUDAExecutionProvider")
    assert cuda is not None, "onnxruntime-gpu is not installed"
    assert cuda.loadable and cuda.ran, cuda.cause


def test_openvino_is_reported_with_a_probe_run():
    from gantool.runtime.openvino import cpu_capabilities, openvino_available

    report = doctor.diagnose(test_providers=True)
    info = report.openvino
    if not openvino_available():
        assert info == {"installed": False}
        assert any("openvino is not installed" in f.message and f.level == "info" for f in report.findings)
        return
    assert info["installed"] and info["ran"] is True and info["capabilities"] == cpu_capabilities()
    lines = doctor.report_lines(report)
    assert any(line.startswith(f"openvino {info['version']}: CPU plugin capabilities") for line in lines)
    (line,) = [f.message for f in report.findings if "runs ONNX models on the CPU" in f.message]
    # What it says of --backend auto is what auto does (it said "auto runs it" while auto kept ONNX Runtime).
    from gantool.runtime.choice import auto_openvino

    if not cuda_device_visible():
        on_it = line.split(" on it")[0] if " on it" in line else ""
        for precision in ("fp32", "bf16", "int8"):
            assert (precision in on_it) == auto_openvino("cpu", precision), line
        assert ("fp32 on ONNX Runtime" in line) == (not auto_openvino("cpu", "fp32")), line
    assert report.to_dict()["openvino"]["ran"] is True
    untested = doctor.diagnose(test_providers=False).openvino
    assert "ran" not in untested and untested["installed"]

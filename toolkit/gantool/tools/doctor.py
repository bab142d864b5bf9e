"""``gantool doctor``: what torch and ONNX Runtime can really do on this machine.

ONNX Runtime lists execution providers it was *built* with
(``get_available_providers()``); whether one *loads* is only known by creating
a session and asking ``session.get_providers()``. The doctor does that with a
one-node model built in memory, for every available provider, runs it, and
says what to install to fix each problem found.

Findings have a level: ``error`` (gantool cannot run on the CPU: exit 1),
``problem`` (something is broken or misinstalled, the CPU still works) and
``info`` (expected on this machine, e.g. no GPU).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gantool.core.artifacts import default_model_dir
from gantool.core.constants import PRECISIONS
from gantool.core.errors import first_line
from gantool.runtime.providers import cuda_device_visible, try_provider

ORT_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-openvino",
    "onnxruntime-qnn",
    "onnxruntime-training",
    "ort-nightly",
    "ort-nightly-gpu",
)
# Providers that need a remote service or special hardware set-up to even open a session.
SKIPPED_PROVIDERS = {"AzureExecutionProvider": "a remote-inference provider, not a local device"}
TORCH_CUDA_INDEX = "https://download.pytorch.org/whl/cu130"


@dataclass
class Finding:
    level: str  # "error", "problem" or "info"
    message: str
    fix: str = ""


@dataclass
class ProviderCheck:
    name: str
    loadable: bool
    ran: bool  # the probe model produced the right answer
    active_providers: list[str]  # session.get_providers(): what really runs, in order
    cause: str = ""  # why it did not load


@dataclass
class DoctorReport:
    python: str
    platform: str
    gpu_visible: bool
    torch: dict[str, Any]
    onnxruntime: dict[str, Any]
    providers: list[ProviderCheck]
    findings: list[Finding] = field(default_factory=list)
    openvino: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_usable(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_usable"] = self.cpu_usable
        return data


# ------------------------------------------------------------------------------ probes


def installed_versions(names: tuple[str, ...] = ORT_DISTRIBUTIONS) -> dict[str, str]:
    """Installed distributions among ``names`` -> version (importlib.metadata)."""
    found = {}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError as e:
        return {"installed": False, "error": str(e)}
    info: dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,  # None on a CPU-only build
        "cudnn": None,
        "cuda_available": False,
        "devices": [],
        "threads": torch.get_num_threads(),
    }
    if torch.version.cuda is not None:
        with contextlib.suppress(Exception):  # a broken driver must not crash the doctor
            info["cuda_available"] = bool(torch.cuda.is_available())
            if info["cuda_available"]:
                info["cudnn"] = torch.backends.cudnn.version()
                info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def probe_model_bytes() -> bytes:
    """A one-node ONNX model, y = x + 1 (float32, 1 x 4), built in memory."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "gantool_doctor", [x], [y], [one])
    # IR 10 / opset 17: within what every supported onnxruntime (>= 1.20) reads.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def check_provider(name: str, model: bytes) -> ProviderCheck:
    """Open the probe model with ``name`` (then the CPU as ORT's fallback) and run it."""
    import numpy as np

    session, active, cause = try_provider(model, name)
    ran = False
    if session is not None and not cause:
        try:
            out = session.run(["y"], {"x": np.arange(4, dtype=np.float32)[None]})[0]
            ran = bool(np.array_equal(out, np.arange(1, 5, dtype=np.float32)[None]))
        except Exception as e:  # ORT raises its own types (Fail, RuntimeException, ...)
            cause = first_line(e)
    return ProviderCheck(name, not cause and bool(active), ran, active, cause)


def onnxruntime_info() -> tuple[dict[str, Any], Any]:
    try:
        import onnxruntime as ort
    except ImportError as e:
        return {"importable": False, "error": str(e)}, None
    return {
        "importable": True,
        "version": ort.__version__,
        "device": ort.get_device(),
        "available_providers": list(ort.get_available_providers()),
    }, ort


def openvino_info(model: bytes | None) -> dict[str, Any]:
    """OpenVINO: installed or not, its version, what its CPU plugin runs natively, and (with
    ``model``, the probe) whether it compiles and runs an ONNX model here."""
    from gantool.runtime import openvino

    if not openvino.openvino_available():
        return {"installed": False}
    data: dict[str, Any] = {"installed": True}
    try:
        data.update(version=openvino.openvino_version(), capabilities=openvino.cpu_capabilities())
        if model is not None:
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "probe.onnx"
                path.write_bytes(model)
                compiled = openvino.ov_core().compile_model(
                    str(path), openvino.OV_DEVICE, openvino.compile_config("fp32")
                )
                out = compiled.create_infer_request().infer({"x": np.array([[1.0, 2.0, 3.0, -1.0]], np.float32)})
                data["ran"] = bool(np.array_equal(next(iter(out.values())), [[2.0, 3.0, 4.0, 0.0]]))
    except Exception as e:  # a broken install: reported, never fatal (ONNX Runtime is the CPU fallback)
        data["error"] = first_line(e)
    return data


def _openvino_findings(info: dict[str, Any], gpu: bool) -> list[Finding]:
    if not info.get("installed"):
        return [
            Finding(
                "info",
                "openvino is not installed: the CPU runs ONNX Runtime (--backend openvino needs it)",
                "pip install openvino",
            )
        ]
    if "error" in info or info.get("ran") is False:
        why = info.get("error", "the probe model gave a wrong result")
        return [Finding("problem", f"openvino {info.get('version', '')} does not run here ({why}); "
                        "--backend auto falls back to ONNX Runtime", "pip install --force-reinstall openvino")]  # fmt: skip
    from gantool.runtime.choice import auto_openvino  # delayed: the runtimes' probes

    if gpu:
        where = "ONNX Runtime runs the GPU; OpenVINO the CPU with --provider cpu"
    else:
        picked = [p for p in PRECISIONS if p != "auto" and auto_openvino("cpu", p)]
        where = (f"--backend auto runs {' and '.join(picked)} on it, " if picked else "") + (
            "fp32 on ONNX Runtime, which OpenVINO was not measured to beat" if "fp32" not in picked else "fp32 too"
        )
    bf16 = "native bf16" if "BF16" in info.get("capabilities", []) else "no native bf16 (--precision bf16 refused)"
    return [Finding("info", f"openvino {info['version']} runs ONNX models on the CPU ({where}; {bf16})")]


# ----------------------------------------------------------------------------- doctor


def diagnose(test_providers: bool = True) -> DoctorReport:
    """Inspect torch and ONNX Runtime, open a session per available provider, and
    list the problems with their fixes."""
    gpu = cuda_device_visible()
    torch_data = torch_info()
    packages = installed_versions()
    ort_data, ort = onnxruntime_info()
    ort_data["packages"] = packages
    checks: list[ProviderCheck] = []
    findings: list[Finding] = []
    if ort is not None and test_providers:
        model = probe_model_bytes()
        for name in ort_data["available_providers"]:
            if name in SKIPPED_PROVIDERS:
                continue
            checks.append(check_provider(name, model))
    report = DoctorReport(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        gpu_visible=gpu,
        torch=torch_data,
        onnxruntime=ort_data,
        providers=checks,
        findings=findings,
    )
    findings.extend(_torch_findings(torch_data, gpu))
    findings.extend(_ort_findings(ort_data, checks, gpu, test_providers))
    report.openvino = openvino_info(probe_model_bytes() if test_providers else None)
    findings.extend(_openvino_findings(report.openvino, gpu))
    findings.extend(_model_findings())
    return report


def _gpu_ort_wheel() -> str:
    linux_or_windows = sys.platform.startswith(("linux", "win"))
    return (
        "onnxruntime-gpu" if linux_or_windows and platform.machine().lower() in ("x86_64", "amd64") else "onnxruntime"
    )


def _torch_findings(info: dict[str, Any], gpu: bool) -> list[Finding]:
    if not info["installed"]:
        return [Finding("error", f"torch is not importable ({info['error']})", "pip install torch")]
    if info["cuda_build"] is None:
        if gpu:
            return [
                Finding(
                    "problem",
                    f"an NVIDIA GPU is visible but torch {info['version']} is a CPU-only build",
                    f"pip install torch --index-url {TORCH_CUDA_INDEX}",
                )
            ]
        return [
            Finding(
                "info",
                f"torch {info['version']} is a CPU-only build and no NVIDIA GPU is visible: "
                "training and eager inference run on the CPU",
            )
        ]
    if not info["cuda_available"]:
        if gpu:
            return [
                Finding(
                    "problem",
                    f"torch {info['version']} was built for CUDA {info['cuda_build']} but finds no usable GPU",
                    "check the NVIDIA driver (nvidia-smi) and that it supports this CUDA version",
                )
            ]
        return [Finding("info", f"torch has CUDA {info['cuda_build']} support but no NVIDIA GPU is visible")]
    return []


def _ort_findings(info: dict[str, Any], checks: list[ProviderCheck], gpu: bool, tested: bool) -> list[Finding]:
    findings = []
    packages = info["packages"]
    wheel = _gpu_ort_wheel()
    if len(packages) > 1:
        names = " and ".join(packages)
        findings.append(
            Finding(
                "problem",
                f"{names} are installed together: they share the onnxruntime module and overwrite "
                "each other's files, so which one runs is an accident",
                f"pip uninstall -y {' '.join(packages)} && pip install {wheel}",
            )
        )
    if not info["importable"]:
        fix = (
            f"pip install {wheel}" if not packages else f"pip uninstall -y {' '.join(packages)} && pip install {wheel}"
        )
        findings.append(Finding("error", f"onnxruntime is not importable ({info['error']})", fix))
        return findings
    if not tested:
        return findings
    by_name = {c.name: c for c in checks}
    cpu = by_name.get("CPUExecutionProvider")
    if cpu is None or not cpu.ran:
        findings.append(
            Finding(
                "error",
                f"the ONNX Runtime CPU provider did not run a test model"
                f"{': ' + cpu.cause if cpu and cpu.cause else ''}",
                f"pip install --force-reinstall {wheel}",
            )
        )
    cuda = by_name.get("CUDAExecutionProvider")
    if cuda is None:
        if gpu:
            findings.append(
                Finding(
                    "problem",
                    f"an NVIDIA GPU is visible but onnxruntime {info['version']} has "
                    "no CUDA provider (a CPU-only build)",
                    f"pip uninstall -y {' '.join(packages) or 'onnxruntime'} && pip install onnxruntime-gpu",
                )
            )
    elif not cuda.loadable:
        if gpu:
            findings.append(
                Finding(
                    "problem",
                    f"CUDAExecutionProvider is available but does not load: {cuda.cause}",
                    'onnxruntime-gpu needs CUDA 13 and cuDNN 9: pip install "onnxruntime-gpu[cuda,cudnn]" '
                    f"or a CUDA build of torch (pip install torch --index-url {TORCH_CUDA_INDEX})",
                )
            )
        else:
            findings.append(
                Finding(
                    "info",
                    "CUDAExecutionProvider is listed by onnxruntime but not loadable: "
                    "no NVIDIA GPU is visible; gantool runs on the CPU",
                )
            )
    trt = by_name.get("TensorrtExecutionProvider")
    if trt is not None and not trt.loadable and gpu and cuda is not None and cuda.loadable:
        findings.append(
            Finding(
                "info",
                f"TensorrtExecutionProvider does not load ({trt.cause}); CUDA works, TensorRT is optional",
                "pip install tensorrt-cu13 (only for --provider tensorrt)",
            )
        )
    return findings


def _model_findings() -> list[Finding]:
    folder = default_model_dir()
    if folder is None:
        return [
            Finding(
                "problem",
                "no shipped model found in models/: `gantool inpaint` needs --model",
                "reinstall gantool, or export one and pass --model",
            )
        ]
    return [Finding("info", f"shipped model: {folder}")]


def report_lines(report: DoctorReport) -> list[str]:
    """A human-readable report, one fact per line."""
    t, o = report.torch, report.onnxruntime
    lines = [
        f"python {report.python} on {report.platform}; NVIDIA GPU visible: {'yes' if report.gpu_visible else 'no'}"
    ]
    if t["installed"]:
        cuda = f"CUDA {t['cuda_build']}" if t["cuda_build"] else "CPU-only build"
        cudnn = f", cuDNN {t['cudnn']}" if t["cudnn"] else ""
        devices = f", devices: {', '.join(t['devices'])}" if t["devices"] else ""
        lines.append(
            f"torch {t['version']} ({cuda}{cudnn}); torch.cuda.is_available(): {t['cuda_available']}"
            f"{devices}; {t['threads']} CPU threads"
        )
    else:
        lines.append("torch: not importable")
    packages = ", ".join(f"{k} {v}" for k, v in o["packages"].items()) or "none"
    lines.append(f"onnxruntime packages installed: {packages}")
    if o["importable"]:
        lines.append(
            f"onnxruntime {o['version']}: available providers (built in): {', '.join(o['available_providers'])}"
        )
        for check in report.providers:
            state = "loads and runs" if check.ran else ("loads" if check.loadable else "NOT loadable")
            why = f" ({check.cause})" if check.cause else ""
            lines.append(f"  {check.name}: {state}{why}")
    v = report.openvino
    if v.get("installed"):
        caps = ", ".join(v.get("capabilities", [])) or "unknown"
        ran = {True: "compiles and runs", False: "gives a WRONG result", None: "not tested"}[v.get("ran")]
        lines.append(f"openvino {v.get('version', '?')}: CPU plugin capabilities {caps}; probe model {ran}")
    else:
        lines.append("openvino: not installed")
    for finding in report.findings:
        lines.append(f"{finding.level}: {finding.message}")
        if finding.fix:
            lines.append(f"  fix: {finding.fix}")
    lines.append("usable on the CPU: yes" if report.cpu_usable else "usable on the CPU: NO")
    return lines

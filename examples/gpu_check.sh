#!/usr/bin/env bash
# The prepared GPU check: one script, one GPU, at most 8 minutes.
#
#   bash examples/gpu_check.sh                         # on a machine with a CUDA GPU
#   GPU_CHECK_DEVICE=cpu bash examples/gpu_check.sh    # dry run: same stages, tiny sizes, on the CPU
#
# Stages (each under `timeout`, each one's exit status recorded; a failing stage
# does not stop the others; stages that would start after the budget is spent
# are recorded as skipped):
#   install        a Python with torch, then `pip install -e ".[dev]"` (offline fallbacks below)
#   env            torch / CUDA / ONNX Runtime versions and devices
#   pytest_cuda    `pytest -k cuda`: every test named or marked cuda (eager/TorchScript/ONNX
#                  parity on CUDA, bf16 and torch.compile training on CUDA, ...)
#   train_bf16     a short `gantool train --amp` run (bf16 autocast) on the device
#   export         `gantool export` of that run's checkpoint (fp32 + fp16 ONNX, TorchScript)
#   ort_cuda       ONNX Runtime's CUDA provider really runs the export and matches the CPU;
#                  skipped when onnxruntime-gpu is not installed (see below)
#   formats        the formats of today on CUDA: `gantool export --pt2 --aoti --fp16` (AOTInductor
#                  compiled for this GPU), then aoti and pt2 in fp32, eager and pt2 in bf16, ORT fp16
#                  on CUDA and ORT on TensorRT, each against eager fp32 on the CPU (fp32 max abs
#                  <= 1e-3, bf16 >= 35 dB, fp16 >= 40 dB hole PSNR; known pixels exact). The ORT rows
#                  are recorded but optional: they need onnxruntime-gpu (and TensorRT). Skipped on the CPU.
#   bench_train    `gantool bench train --json` on the device
#   bench_inpaint  `gantool bench inpaint --json` on the device (skipped if the command is missing)
#   bench_ray      `gantool bench inpaint --ray` with 1 GPU against all GPUs (one actor per GPU);
#                  skipped on the CPU dry run and when Ray (the `ray` extra) is not installed
#
# Writes a JSON summary to $OUT/gpu_check.json when OUT is set, else ./gpu_check.json
# (GPU_CHECK_JSON overrides), and all stage logs to gpu_check.log beside it.
# Exit status: 0 when no stage failed or timed out (skips are fine), else 1.
#
# Environment:
#   GPU_CHECK_DEVICE    cuda (default) or cpu (dry run)
#   GPU_CHECK_BUDGET_S  seconds for all stages together (default 450; 8 minutes with margin)
#   GPU_CHECK_PYTHON    use this interpreter as it is: no venv, no install
#   GPU_CHECK_VENV      venv to create when python3 is not already a venv with torch ($GPU_CHECK_WORK/venv)
#   GPU_CHECK_WHEELS    folder of wheels for an offline install (default .whl), e.g. tomli-w
#   GPU_CHECK_SKIP      comma-separated stage names to skip
#   GPU_CHECK_WORK      scratch folder (default: a new temporary folder)
#
# Offline machines: `pip install -e ".[dev]"` needs PyPI. When torch, onnx, click, ... are
# already installed the package is installed with --no-deps and no network. Missing pure-Python
# dependencies (tomli-w is the usual one) can be carried as wheels in GPU_CHECK_WHEELS. The
# onnxruntime-gpu wheel usually cannot be: with only the CPU onnxruntime the ort_cuda stage is
# skipped, and the ONNX-CUDA pytest cases skip themselves.

set -uo pipefail

INVOKED_FROM=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2

DEVICE=${GPU_CHECK_DEVICE:-cuda}
case "$DEVICE" in cuda|cpu) ;; *) echo "GPU_CHECK_DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac
BUDGET=${GPU_CHECK_BUDGET_S:-450}
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "GPU_CHECK_BUDGET_S must be a number of seconds" >&2; exit 2; }
WORK=${GPU_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
mkdir -p "$WORK/logs" "$WORK/results"
if [[ -n "${GPU_CHECK_JSON:-}" ]]; then
    SUMMARY=$GPU_CHECK_JSON
elif [[ -n "${OUT:-}" ]]; then
    SUMMARY=$OUT/gpu_check.json
else
    SUMMARY=$INVOKED_FROM/gpu_check.json
fi
[[ "$SUMMARY" = /* ]] || SUMMARY=$INVOKED_FROM/$SUMMARY
mkdir -p "$(dirname "$SUMMARY")"
COMBINED_LOG="${SUMMARY%.json}.log"
STAGES_TSV=$WORK/stages.tsv
: >"$STAGES_TSV"
STARTED_AT=$(date -u +%Y-%m-%dT%H:%M:%SZ)
START_S=$(date +%s)
DEADLINE=$((START_S + BUDGET))
SUMMARY_PY=$(command -v python3 || command -v python || true)

# gantool is importable from the source tree even when the editable install fails.
export PYTHONPATH="$REPO/toolkit${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 DEVICE WORK REPO

if [[ "$DEVICE" == cpu ]]; then
    TRAIN_ARGS="--size 32 --local-size 16 --width 4 --disc-width 2 --disc-fc 8 --batch-size 4
                --steps-g 2 --steps-d 1 --steps-joint 2 --workers 0 --log-every 1"
    BENCH_TRAIN_ARGS="--size 32 --local-size 16 --batch-size 2 --width 4 --steps 1 --no-reference"
    BENCH_INPAINT_ARGS="--sizes 32 --batch 1 --repeats 1 --warmup 0 --e2e-images 0 --no-crop-check"
else
    TRAIN_ARGS="--size 128 --local-size 64 --width 32 --disc-width 16 --disc-fc 256 --batch-size 16
                --steps-g 40 --steps-d 20 --steps-joint 40 --workers 2 --log-every 10"
    BENCH_TRAIN_ARGS="--steps 10"
    BENCH_INPAINT_ARGS="--sizes 256,512 --batch 1,8 --repeats 5 --e2e-images 16"
fi
export TRAIN_ARGS BENCH_TRAIN_ARGS BENCH_INPAINT_ARGS

# ------------------------------------------------------------------ bookkeeping

write_summary() {
    [[ -n "$SUMMARY_PY" ]] || { echo "no python3 to write $SUMMARY" >&2; return 1; }
    "$SUMMARY_PY" - "$STAGES_TSV" "$SUMMARY" "$WORK" "$DEVICE" "$BUDGET" "$STARTED_AT" "$START_S" "$REPO" "${PY:-}" <<'PYEOF'
import json, os, sys, time, xml.etree.ElementTree as ET
tsv, dest, work, device, budget, started_at, start_s, repo, python = sys.argv[1:10]
stages = []
for line in open(tsv, encoding="utf-8", errors="replace"):
    name, status, rc, millis, limit, reason = (line.rstrip("\n").split("\t") + [""] * 6)[:6]
    stage = {"name": name, "status": status, "exit_code": int(rc), "seconds": int(millis) / 1000,
             "limit_s": int(limit), "reason": reason or None}
    result = os.path.join(work, "results", name + ".json")
    if os.path.exists(result):
        try:
            with open(result, encoding="utf-8") as f:
                stage["result"] = json.load(f)
        except ValueError as e:
            stage["result_error"] = f"{result} is not JSON: {e}"
    junit = os.path.join(work, "results", name + ".xml")
    if os.path.exists(junit):
        try:
            root = ET.parse(junit).getroot()
            suite = root if root.tag == "testsuite" else root.find("testsuite")
            stage["tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        except (ET.ParseError, AttributeError, ValueError) as e:
            stage["tests_error"] = str(e)
    log = os.path.join(work, "logs", name + ".log")
    if os.path.exists(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            stage["log_tail"] = f.read()[-1500:]
    stages.append(stage)
counts = {s: sum(1 for st in stages if st["status"] == s) for s in ("pass", "fail", "timeout", "skip")}
commit = None
try:
    head = open(os.path.join(repo, ".git", "HEAD")).read().strip()
    commit = open(os.path.join(repo, ".git", head[5:])).read().strip() if head.startswith("ref: ") else head
except OSError:
    pass
summary = {
    "schema": "gantool-gpu-check/1", "device": device, "dry_run": device == "cpu",
    "started_at": started_at, "elapsed_s": round(time.time() - int(start_s), 1), "budget_s": int(budget),
    "python": python or None, "git_commit": commit, "work_dir": work,
    "counts": counts, "ok": counts["fail"] == 0 and counts["timeout"] == 0, "stages": stages,
}
tmp = dest + ".tmp"
with open(tmp, "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
os.replace(tmp, dest)  # a reader never sees a half-written summary
PYEOF
}

record() {  # name status rc milliseconds limit reason
    local reason=${6//$'\t'/ }
    reason=${reason//$'\n'/ }
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$reason" >>"$STAGES_TSV"
    printf '[gpu_check] %-14s %-7s rc=%-3s %6s ms  %s\n' "$1" "$2" "$3" "$4" "$reason" >&2
    write_summary
}

skipped_by_user() {
    [[ ",${GPU_CHECK_SKIP:-}," == *",$1,"* ]]
}

# run_stage NAME CAP_SECONDS FUNCTION: FUNCTION runs in a child bash under `timeout`
# (which signals the whole process group). Exit 77 with a last line "SKIP: why" = skipped.
run_stage() {
    local name=$1 cap=$2 fn=$3
    if skipped_by_user "$name"; then
        record "$name" skip 0 0 0 "listed in GPU_CHECK_SKIP"
        return
    fi
    local remaining=$((DEADLINE - $(date +%s)))
    if ((remaining < 5)); then
        record "$name" skip 0 0 0 "budget spent (GPU_CHECK_BUDGET_S=$BUDGET)"
        return
    fi
    local limit=$((cap < remaining ? cap : remaining))
    local log=$WORK/logs/$name.log
    local t0 t1 rc status reason=""
    t0=$(date +%s%N)
    timeout --kill-after=10 "$limit" bash -c "$fn" >"$log" 2>&1
    rc=$?
    t1=$(date +%s%N)
    case $rc in
        0) status=pass ;;
        77) status=skip; reason=$(grep '^SKIP: ' "$log" | tail -n 1 | cut -c7-) ;;
        124|137) status=timeout; reason="stopped after ${limit}s" ;;
        *) status=fail; reason=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-300) ;;
    esac
    {
        echo "===== $name: $status (rc=$rc)"
        cat "$log"
    } >>"$COMBINED_LOG"
    record "$name" "$status" "$rc" "$(((t1 - t0) / 1000000))" "$limit" "$reason"
}

# --------------------------------------------------------------------- stages
# Each is a function exported to the child bash; $PY is the chosen interpreter.

stage_install() {
    echo "python: $PY"
    "$PY" -c 'import sys; print(sys.version)' || exit 1
    local method editable=true
    if "$PY" -c 'import torch, onnx, onnxscript, click, PIL, numpy, tqdm, safetensors, tomli_w, pytest' 2>/dev/null; then
        method="dependencies were installed: editable install without network"
        "$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation -e . || editable=false
    elif "$PY" -m pip install --quiet --retries 0 --timeout 15 -e ".[dev]"; then
        method="installed from the package index"
    else
        local wheels=${GPU_CHECK_WHEELS:-.whl}
        method="no package index: offline install, wheels from $wheels"
        if compgen -G "$wheels/*.whl" >/dev/null; then
            "$PY" -m pip install --quiet --no-index --no-deps "$wheels"/*.whl || echo "some wheels in $wheels did not install"
        fi
        "$PY" -m pip install --quiet --no-index --no-deps --no-build-isolation -e . || editable=false
    fi
    # An old setuptools (< 77) cannot build this pyproject; PYTHONPATH=toolkit still imports gantool.
    [[ $editable == true ]] || echo "editable install failed: gantool runs from PYTHONPATH=$REPO/toolkit"
    printf '{"method": "%s", "editable_install": %s}\n' "$method" "$editable" >"$WORK/results/install.json"
    echo "$method"
    "$PY" -c 'import gantool.training.loop, gantool.cli, gantool.export.exporter; print("gantool imports")'
}

stage_env() {
    set -e
    command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi: not found"
    "$PY" - <<'PYEOF'
import json, os, platform, sys
import torch
info = {"python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count()}
if torch.cuda.is_available():
    info.update(gpu=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                bf16=torch.cuda.is_bf16_supported(),
                memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
try:
    import onnxruntime as ort
    info["onnxruntime"] = ort.__version__
    info["onnxruntime_build_providers"] = ort.get_available_providers()  # what is built in, not what runs
except Exception as e:
    info["onnxruntime"] = f"not importable: {e}"
from gantool.training.loop import amp_supported
info["gantool_amp_supported"] = amp_supported(torch.device(os.environ["DEVICE"]))
with open(os.path.join(os.environ["WORK"], "results", "env.json"), "w") as f:
    json.dump(info, f, indent=2)
print(json.dumps(info, indent=2))
if os.environ["DEVICE"] == "cuda" and not info["cuda_available"]:
    sys.exit("torch sees no CUDA device")
PYEOF
}

stage_pytest_cuda() {
    # -k matches test names and marker names, so "cuda" selects both.
    "$PY" -m pytest -q -k cuda -p no:cacheprovider --junitxml="$WORK/results/pytest_cuda.xml" tests
}

stage_train_bf16() {
    set -e
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of words
    "$PY" -m gantool train --data synthetic --device "$DEVICE" --amp --out "$WORK/run" $TRAIN_ARGS \
        --sample-every 1000 --checkpoint-every 1000 --quiet
    "$PY" - <<'PYEOF'
import json, math, os, sys
run = os.path.join(os.environ["WORK"], "run")
records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
steps = [r for r in records if "images_per_s" in r]
losses = {k: v for r in steps for k, v in r.items() if k.startswith("loss_")}
result = {"steps": steps[-1]["step"], "last": steps[-1], "validation": [r for r in records if "val_psnr" in r][-1:],
          "finite": all(math.isfinite(v) for r in steps for k, v in r.items() if k.startswith("loss_"))}
with open(os.path.join(os.environ["WORK"], "results", "train_bf16.json"), "w") as f:
    json.dump(result, f, indent=2)
print(json.dumps(result))
if not result["finite"]:
    sys.exit("non-finite losses in the bf16 run")
PYEOF
}

stage_export() {
    set -e
    [[ -f "$WORK/run/checkpoints/last.pt" ]] || { echo "SKIP: no checkpoint (train_bf16 did not finish)"; exit 77; }
    "$PY" -m gantool export "$WORK/run/checkpoints/last.pt" -o "$WORK/export" --fp16 --no-cuda
    ls -l "$WORK/export"
}

stage_ort_cuda() {
    # onnxruntime-gpu lists its CUDA provider even without a GPU, and then falls back to the CPU.
    [[ "$DEVICE" == cuda ]] || { echo "SKIP: dry run on the CPU"; exit 77; }
    [[ -f "$WORK/export/generator.onnx" ]] || { echo "SKIP: no exported model (export did not finish)"; exit 77; }
    "$PY" - <<'PYEOF'
import json, os, sys
import numpy as np
try:
    import onnxruntime as ort
except ImportError as e:
    print(f"SKIP: onnxruntime is not importable ({e})")
    sys.exit(77)
if "CUDAExecutionProvider" not in ort.get_available_providers():
    print(f"SKIP: onnxruntime {ort.__version__} has no CUDA provider (onnxruntime-gpu is not installed)")
    sys.exit(77)
ort.preload_dlls()  # CUDA/cuDNN from the nvidia wheels or torch, before the first CUDA session
export = os.path.join(os.environ["WORK"], "export")
rng = np.random.default_rng(0)
image = rng.random((2, 3, 64, 96), dtype=np.float32)
mask = np.zeros((2, 1, 64, 96), np.float32)
mask[:, :, 16:40, 24:60] = 1
result, worst = {}, 0.0
for name, atol in (("generator.onnx", 1e-3), ("generator_fp16.onnx", 2e-2)):
    path = os.path.join(export, name)
    if not os.path.exists(path):
        continue
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    gpu = ort.InferenceSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    ran_on = gpu.get_providers()  # the truth: CUDA may have fallen back to the CPU silently
    feeds = {"image": image, "mask": mask}
    diff = float(np.abs(gpu.run(None, feeds)[0] - cpu.run(None, feeds)[0]).max())
    result[name] = {"providers": ran_on, "max_abs_diff_vs_cpu": diff, "atol": atol}
    if ran_on[0] != "CUDAExecutionProvider" or diff > atol:
        worst = float("inf")
with open(os.path.join(os.environ["WORK"], "results", "ort_cuda.json"), "w") as f:
    json.dump(result, f, indent=2)
print(json.dumps(result, indent=2))
sys.exit("CUDA provider fell back or disagrees with the CPU" if worst else 0)
PYEOF
}

stage_formats() {
    [[ "$DEVICE" == cuda ]] || { echo "SKIP: dry run on the CPU"; exit 77; }
    [[ -f "$WORK/run/checkpoints/last.pt" ]] || { echo "SKIP: no checkpoint (train_bf16 did not finish)"; exit 77; }
    set -e
    # On a GPU, --aoti compiles for CUDA (the export's own parity sweep runs the CPU formats).
    "$PY" -m gantool export "$WORK/run/checkpoints/last.pt" -o "$WORK/export_formats" --onnx --fp16 --pt2 --aoti \
        --no-cuda
    "$PY" - <<'PYEOF'
import json, math, os, sys
import numpy as np
from gantool.export.parity import compare, report_to_json
from gantool.runtime.backends import load_backend
folder = os.path.join(os.environ["WORK"], "export_formats")
rng = np.random.default_rng(0)
image = rng.random((2, 3, 64, 96), dtype=np.float32)
mask = np.zeros((2, 1, 64, 96), np.float32)
mask[:, :, 16:40, 24:60] = 1
reference = load_backend(folder, "cpu", "eager", "fp32").run(image, mask)
checks = {  # name: backend, provider, precision, gate, optional (needs onnxruntime-gpu / TensorRT)
    "aoti-cuda": ("aoti", "cuda", "fp32", ("max_abs", 1e-3), False),
    "pt2-cuda": ("pt2", "cuda", "fp32", ("max_abs", 1e-3), False),
    "eager-bf16-cuda": ("eager", "cuda", "bf16", ("psnr_hole", 35.0), False),
    "pt2-bf16-cuda": ("pt2", "cuda", "bf16", ("psnr_hole", 35.0), False),
    "onnx-fp16-cuda": ("onnx", "cuda", "fp16", ("psnr_hole", 40.0), True),
    "onnx-tensorrt": ("onnx", "tensorrt", "fp32", ("max_abs", 1e-3), True),
}
results, failed = {}, []
for name, (backend, provider, precision, (kind, limit), optional) in checks.items():
    try:
        runner = load_backend(folder, provider, backend, precision)
        out = runner.run(image, mask)
    except Exception as e:  # record the one-line cause; a required format failing fails the stage
        results[name] = {"error": (str(e).splitlines() or [type(e).__name__])[0], "optional": optional}
        if not optional:
            failed.append(name)
        continue
    row = compare(out, reference, image, mask)
    value = row["max_abs"] if kind == "max_abs" else row["psnr_hole_uint8"]
    passed = row["known_exact"] and (value <= limit if kind == "max_abs" else value >= limit)
    results[name] = {"provider": runner.provider, "precision": runner.precision, "gate": f"{kind} {limit:g}",
                     **row, "passed": passed}
    if not passed:
        failed.append(name)
with open(os.path.join(os.environ["WORK"], "results", "formats.json"), "w") as f:
    json.dump(report_to_json(results), f, indent=2)
print(json.dumps(report_to_json(results), indent=2))
sys.exit(f"formats failing on CUDA: {', '.join(failed)}" if failed else 0)
PYEOF
}

stage_bench_train() {
    set -e
    # shellcheck disable=SC2086
    "$PY" -m gantool bench train --device "$DEVICE" --json $BENCH_TRAIN_ARGS >"$WORK/results/bench_train.json"
    cat "$WORK/results/bench_train.json"
}

stage_bench_inpaint() {
    set -e
    if ! "$PY" -m gantool bench inpaint --help >/dev/null 2>&1; then
        echo "SKIP: gantool bench inpaint is not available in this build"
        exit 77
    fi
    local model=() backends=eager,eager:bf16,torchscript provider=$DEVICE
    if [[ ! -f models/generator.onnx && -d "$WORK/export" ]]; then
        model=("$WORK/export")  # no shipped model: time this check's own export
    fi
    if [[ "$DEVICE" == cpu ]]; then
        backends=eager
    elif "$PY" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' 2>/dev/null; then
        backends=eager,eager:bf16,torchscript,onnx,onnx:fp16
    fi
    if [[ "$DEVICE" == cuda && -f "$WORK/export_formats/generator.aoti.pt2" ]]; then
        model=("$WORK/export_formats")  # the formats stage's export: pt2 and the CUDA AOTI package too
        backends=$backends,pt2,pt2:bf16,aoti
    fi
    # shellcheck disable=SC2086
    "$PY" -m gantool bench inpaint "${model[@]}" --providers "$provider" --backends "$backends" --json \
        $BENCH_INPAINT_ARGS >"$WORK/results/bench_inpaint.json"
    cat "$WORK/results/bench_inpaint.json"
}

stage_bench_ray() {
    [[ "$DEVICE" == cuda ]] || { echo "SKIP: dry run on the CPU"; exit 77; }
    "$PY" -c 'import ray.data' 2>/dev/null || { echo "SKIP: ray is not installed (the ray extra)"; exit 77; }
    set -e
    local gpus results=$WORK/results
    gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
    "$PY" -m gantool bench inpaint --ray --providers cuda --actors 1 --e2e-images 96 --json >"$results/ray_1.json"
    if ((gpus > 1)); then
        "$PY" -m gantool bench inpaint --ray --providers cuda --actors "$gpus" --e2e-images $((96 * gpus)) \
            --json >"$results/ray_all.json"
    fi
    "$PY" - "$gpus" <<'PYEOF'
import json, os, sys
results = os.path.join(os.environ["WORK"], "results")
gpus = int(sys.argv[1])
one = json.load(open(os.path.join(results, "ray_1.json")))
every = json.load(open(os.path.join(results, "ray_all.json"))) if gpus > 1 else None
out = {"gpus": gpus, "one_gpu": one, "all_gpus": every,
       "scaling": every["ray"]["images_per_s"] / one["ray"]["images_per_s"] if every else None}
with open(os.path.join(results, "bench_ray.json"), "w") as f:
    json.dump(out, f, indent=2)
print(f"1 GPU: {one['ray']['images_per_s']:.1f} images/s (local pipeline {one['local']['images_per_s']:.1f})")
if every:
    print(f"{gpus} GPUs: {every['ray']['images_per_s']:.1f} images/s, {out['scaling']:.2f}x one GPU")
PYEOF
}

export -f stage_install stage_env stage_pytest_cuda stage_train_bf16 stage_export stage_ort_cuda \
    stage_formats stage_bench_train stage_bench_inpaint stage_bench_ray

# ------------------------------------------------------------------- choose a Python

if [[ -n "${GPU_CHECK_PYTHON:-}" ]]; then
    PY=$GPU_CHECK_PYTHON
    INSTALL=no
elif python3 -c 'import sys, torch; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
    PY=$(python3 -c 'import sys; print(sys.executable)')  # already a venv with torch (e.g. CUDA torch): use it
    INSTALL=yes
else
    VENV=${GPU_CHECK_VENV:-$WORK/venv}
    # --system-site-packages: a system-wide CUDA torch stays visible
    [[ -x "$VENV/bin/python" ]] || python3 -m venv --system-site-packages "$VENV" >"$WORK/logs/venv.log" 2>&1
    PY=$VENV/bin/python
    INSTALL=yes
fi
export PY
echo "[gpu_check] device=$DEVICE budget=${BUDGET}s python=$PY work=$WORK summary=$SUMMARY" >&2
: >"$COMBINED_LOG"

if [[ "$INSTALL" == yes ]]; then
    run_stage install 180 stage_install
else
    record install skip 0 0 0 "GPU_CHECK_PYTHON=$PY is used as it is"
fi
run_stage env 60 stage_env
run_stage pytest_cuda 240 stage_pytest_cuda
run_stage train_bf16 120 stage_train_bf16
run_stage export 120 stage_export
run_stage ort_cuda 60 stage_ort_cuda
run_stage formats 180 stage_formats
run_stage bench_train 120 stage_bench_train
run_stage bench_inpaint 150 stage_bench_inpaint
run_stage bench_ray 150 stage_bench_ray

write_summary || exit 1
echo "[gpu_check] summary: $SUMMARY" >&2
if [[ -n "$SUMMARY_PY" ]]; then
    "$SUMMARY_PY" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$SUMMARY"
fi

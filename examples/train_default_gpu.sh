#!/usr/bin/env bash
# Train the default model (models/README.md) on a CUDA GPU for a fixed wall-clock budget, and
# hand back a checkpoint that resumes anywhere. One script, one call on a lent GPU machine:
#
#   bash examples/train_default_gpu.sh [DATA]              # DATA: data/photos/train (make_default_data.py)
#   TRAIN_GPU_DEVICE=cpu bash examples/train_default_gpu.sh DATA   # dry run: the same steps, tiny sizes, on the CPU
#
# Why: on the CPU the default model saw 5,800 steps of 8 crops and learned next to nothing beyond
# its fill (models/README.md, "What the network adds"); what is left to try is scale. This runs
# examples/default_photos_gpu.toml (batch 64, reconstruction phase first) under `timeout -s INT`:
# the budget's SIGINT makes gantool write a consistent checkpoint, as Ctrl-C does.
#
# Writes into $OUT (the device tool's folder; else TRAIN_GPU_OUT, else ./gpu_train), at most 8 files,
# none over 15 MB, as the device tool brings them back:
#   last.pt.part00 ...   the run's checkpoints/last.pt split into 15 MB parts; here:
#                          cat last.pt.part* > last.pt && sha256sum last.pt   (train_gpu.json has the sum)
#   train_gpu.json       device, budget, steps and phase reached, images/s, the validation curve, sha256
#   metrics.jsonl        the run's log; sample.png its last sample grid
# Then, on any machine: `gantool export last.pt --onnx --int8 --calib data/photos/train -o EXPORT`,
# `python examples/eval_default.py EXPORT --data data/photos/heldout --seeds 0 1 2`, or continue it:
# `gantool train --resume last.pt --data data/photos/train --allow-data-change --workers 1`.
#
# Environment:
#   TRAIN_GPU_DEVICE    cuda (default) or cpu (the dry run)
#   TRAIN_GPU_BUDGET_S  seconds of training before the SIGINT (default 420: a 10-minute call with its start)
#   TRAIN_GPU_WHEELS    wheels to install when a dependency is missing (default .whl; tomli-w, usually)
#   TRAIN_GPU_ARGS      more `gantool train` options, after the config's (the dry run sets its own)
#   TRAIN_GPU_PYTHON    the interpreter (default: python3 on PATH, the one that holds torch there)

set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
INVOKED_FROM=$(pwd)
DATA=${1:-data/photos/train}
[[ "$DATA" = /* ]] || DATA=$INVOKED_FROM/$DATA
DEVICE=${TRAIN_GPU_DEVICE:-cuda}
BUDGET=${TRAIN_GPU_BUDGET_S:-420}
DEST=${OUT:-${TRAIN_GPU_OUT:-$INVOKED_FROM/gpu_train}}
[[ "$DEST" = /* ]] || DEST=$INVOKED_FROM/$DEST
WHEELS=${TRAIN_GPU_WHEELS:-$REPO/.whl}
case "$DEVICE" in cuda|cpu) ;; *) echo "TRAIN_GPU_DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "TRAIN_GPU_BUDGET_S must be a number of seconds" >&2; exit 2; }
[[ -d "$DATA" ]] || { echo "no data folder $DATA: run examples/make_default_data.py first" >&2; exit 2; }
mkdir -p "$DEST"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_train.XXXXXX")
PY=${TRAIN_GPU_PYTHON:-$(command -v python3 || command -v python)}

# gantool from the source tree; a missing pure-Python dependency from carried wheels.
export PYTHONPATH="$REPO/toolkit${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$PY" -c 'import torch, numpy, PIL, tqdm, safetensors, tomli_w, click' 2>/dev/null; then
    compgen -G "$WHEELS/*.whl" >/dev/null || { echo "dependencies missing and no wheels in $WHEELS" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl
    export PYTHONPATH="$PYTHONPATH:$WORK/site"
fi
if [[ "$DEVICE" == cuda ]]; then
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device")'
    EXTRA=${TRAIN_GPU_ARGS:-}
else
    EXTRA=${TRAIN_GPU_ARGS:---size 32 --local-size 16 --width 4 --disc-width 4 --disc-fc 8 --batch-size 4 --workers 1 --checkpoint-every 5 --sample-every 5 --log-every 1 --val-images 1}
fi

RUN=$WORK/run
START=$(date +%s)
set +e
# shellcheck disable=SC2086  # EXTRA is a list of words
timeout -s INT --kill-after=60 "$BUDGET" "$PY" -m gantool train --config "$REPO/examples/default_photos_gpu.toml" \
    --data "$DATA" --device "$DEVICE" --out "$RUN" --quiet $EXTRA
RC=$?
set -e
ELAPSED=$(($(date +%s) - START))
# 124: the budget's SIGINT arrived and gantool stopped with a checkpoint (as it does with exit 130).
case $RC in 0|124|130) ;; *) echo "gantool train failed (exit $RC)" >&2; exit "$RC" ;; esac
CHECKPOINT=$RUN/checkpoints/last.pt
[[ -f "$CHECKPOINT" ]] || { echo "no checkpoint written in ${ELAPSED}s (raise TRAIN_GPU_BUDGET_S)" >&2; exit 1; }

rm -f "$DEST"/last.pt.part*
split -b 15000000 -d "$CHECKPOINT" "$DEST/last.pt.part"
cp "$RUN/metrics.jsonl" "$DEST/metrics.jsonl"
SAMPLE=$(find "$RUN/samples" -name 'step_*.png' 2>/dev/null | sort -t_ -k2 -n | tail -n 1)
[[ -z "$SAMPLE" ]] || cp "$SAMPLE" "$DEST/sample.png"
"$PY" - "$RUN" "$DEST/train_gpu.json" "$DEVICE" "$BUDGET" "$ELAPSED" "$RC" <<'PYEOF'
import hashlib, json, os, statistics, sys
import torch
run, dest, device, budget, elapsed, rc = sys.argv[1:7]
checkpoint = os.path.join(run, "checkpoints", "last.pt")
with open(checkpoint, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
steps = [r for r in records if "images_per_s" in r]
summary = {
    "schema": "gantool-gpu-train/1", "device": device,
    "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "torch": torch.__version__,
    "budget_s": int(budget), "elapsed_s": int(elapsed), "train_exit_code": int(rc),
    "step": int(state["step"]), "phase": state["phase"], "checkpoint_sha256": digest,
    "checkpoint_bytes": os.path.getsize(checkpoint),
    "images_per_s_median": statistics.median(r["images_per_s"] for r in steps) if steps else None,
    "validation": [{k: r[k] for k in ("step", "val_psnr", "val_psnr_hole") if k in r}
                   for r in records if "val_psnr" in r],
}
with open(dest, "w") as f:
    json.dump(summary, f, indent=2)
print(json.dumps({k: v for k, v in summary.items() if k != "validation"}))
PYEOF
rm -rf "$WORK"

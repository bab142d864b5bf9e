#!/usr/bin/env bash
# Full-width exports in every format, for several seeds (#20: the .pt2 trace scanner once failed
# at random on real-size weights). Each seed trains one step of a full-width (--width 64) network,
# then exports --onnx --pt2 --aoti --int8. A one-step model is nearly random, so its int8 copy
# cannot meet the default quality gate: the gate is lowered here, and only here.
#   bash examples/export_seeds.sh [OUT_DIR] [SEEDS...]    (default: /tmp/export-seeds, seeds 1-5)
set -euo pipefail
out=${1:-/tmp/export-seeds}
shift || true
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3 4 5)
mkdir -p "$out"
for seed in "${seeds[@]}"; do
    run="$out/seed-$seed"
    rm -rf "$run"
    start=$(date +%s)
    gantool train --data synthetic --seed "$seed" --size 64 --local-size 32 --width 64 --disc-width 8 \
        --steps-g 1 --steps-d 0 --steps-joint 0 --batch-size 2 --workers 0 --quiet --out "$run"
    gantool export "$run/checkpoints/last.pt" --onnx --pt2 --aoti --int8 --int8-min-psnr 1 \
        -o "$run/export" > "$run/export.log" 2>&1 || { echo "seed $seed: export FAILED"; tail -3 "$run/export.log"; exit 1; }
    echo "seed $seed: export ok in $(( $(date +%s) - start )) s: $(ls "$run/export" | tr '\n' ' ')"
done

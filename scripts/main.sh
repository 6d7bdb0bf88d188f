#!/usr/bin/env bash
# The main job, from a fresh clone with only Python 3.10+:
#   set up .venv -> train the digits CNN -> export .bin (fp32, int8) and ONNX (int8)
#   -> run the edge engine on a few test images -> compare every export with the training model.
# Everything lands in runs/digits_cnn/ (override with RUN=...). About 2 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh
pocket_venv all main
RUN=${RUN:-runs/digits_cnn}
pocket="$VENV/bin/pocket"
mkdir -p "$RUN"
start=$(date +%s)

echo "== 1/5 train" >&2
# --force: the main job reruns into the same folder on purpose (pocket refuses otherwise).
"$pocket" train examples/digits_cnn.toml --out "$RUN" --force
"$pocket" plot "$RUN" -o "$RUN/plot.png"

echo "== 2/5 export" >&2
"$pocket" export "$RUN/best.ckpt" -o "$RUN/model.bin" --json > "$RUN/export-fp32.json"
"$pocket" export "$RUN/best.ckpt" -o "$RUN/model.int8.bin" --int8 --json > "$RUN/export-int8.json"
"$pocket" export "$RUN/best.ckpt" -o "$RUN/model.int8.onnx" --int8 --json \
  > "$RUN/export-onnx.json"

echo "== 3/5 a few test images as PNG files" >&2
"$VENV/bin/python" scripts/digits_samples.py "$RUN/samples" 6

echo "== 4/5 infer on the edge engine" >&2
"$pocket" infer "$RUN/model.int8.bin" "$RUN/samples" --top-k 2
"$pocket" infer "$RUN/model.int8.bin" "$RUN/samples/$(ls "$RUN/samples" | head -n 1)" \
  --bench 200 --threads 1 --batch-size 1 --json > "$RUN/infer-int8.json"
"$pocket" infer "$RUN/model.bin" "$RUN/samples/$(ls "$RUN/samples" | head -n 1)" \
  --bench 200 --threads 1 --batch-size 1 --json > "$RUN/infer-fp32.json"

echo "== 5/5 compare with the training model (test split)" >&2
"$pocket" compare "$RUN/best.ckpt" --bin "$RUN/model.bin" --json > "$RUN/compare-fp32.json" || {
  "$pocket" compare "$RUN/best.ckpt" --bin "$RUN/model.bin"; exit 1; }
"$pocket" compare "$RUN/best.ckpt" --bin "$RUN/model.int8.bin" --onnx "$RUN/model.int8.onnx" \
  --json > "$RUN/compare-int8.json" || {
  "$pocket" compare "$RUN/best.ckpt" --bin "$RUN/model.int8.bin" --onnx "$RUN/model.int8.onnx"
  exit 1; }

"$VENV/bin/python" scripts/summary.py "$RUN" "$(( $(date +%s) - start ))"

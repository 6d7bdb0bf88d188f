#!/usr/bin/env bash
# One prepared run for a machine with an NVIDIA GPU (CuPy and, for the comparison, PyTorch
# installed; no internet needed). Every step has its own timeout and a failing step does not
# stop the next; the timeouts add up to 440 s (under 8 minutes). Results go to $OUT:
#   gpu_tests.xml          the gpu-marked suite on real CuPy (JUnit XML, no -x)
#   digits.json            digits fp32/fp16 on cuda vs the same run on the CPU (first 20 losses)
#   steps_*.json           vgg/resnet at batch 128 and 256: steady-state ms/step (CUDA events,
#                          after warm-up) and peak GPU memory, pocket vs PyTorch + cuDNN, TF32
#                          off on both (GPU_CHECK_TF32=1 allows it on both)
#   budget.json            vgg under a 1 GiB budget: its measured peak must stay under it
#   gpu_check.json/.md     everything in one JSON and one Markdown table
#   run: OUT=/some/folder bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pocket_gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/pocket_numba}
export POCKET_GPU_SIM=0  # real CuPy only: a missing GPU must show, not fall back to the stand-in
py=${PYTHON:-python3}
tf32=()
[ "${GPU_CHECK_TF32:-0}" = 1 ] && tf32=(--tf32)
step() {  # step NAME SECONDS CMD...: run with a timeout, log to $OUT/NAME.log, note the exit
  local name=$1 secs=$2
  shift 2
  echo "== $name (timeout ${secs}s)" >&2
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc" | tee -a "$OUT/summary.txt" >&2
}

step env 10 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
  $py -c 'import cupy, numpy; print(\"cupy\", cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(), \"numpy\", numpy.__version__)'; \
  $py -c 'import torch; print(\"torch\", torch.__version__, torch.backends.cudnn.version())'"
step gpu_tests 140 $py -m pytest -m "gpu or cuda" -q -p no:cacheprovider -o addopts="" \
  --junitxml="$OUT/gpu_tests.xml" tests
step digits 75 $py bench/gpu_check.py digits --out "$OUT"
step steps_pocket 80 $py bench/gpu_check.py steps --framework pocket --out "$OUT" "${tf32[@]}"
step steps_torch 50 $py bench/gpu_check.py steps --framework torch --out "$OUT" "${tf32[@]}"
step steps_pocket_savers 40 $py bench/gpu_check.py steps --framework pocket --savers \
  --batches 256 --precisions fp32 --out "$OUT" "${tf32[@]}"
step budget 40 $py bench/gpu_check.py budget --budget 1GiB --out "$OUT"
step report 5 $py bench/gpu_check.py report --out "$OUT"
cat "$OUT/gpu_check.md" 2>/dev/null

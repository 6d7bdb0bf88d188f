#!/usr/bin/env bash
# One prepared run for a session that is lent an NVIDIA GPU (the workplace's `device` tool):
# the gpu-marked tests, the digits CNN on the GPU in fp32 and fp16, and the cnn_cifar reference
# model (vgg) under a 4 GiB budget, as on a consumer card. Uses the machine's own python3
# (CuPy, NumPy, Numba, onnxruntime preinstalled there); logs and JSON go to $OUT.
#   run: bash scripts/gpu_check.sh      (timeout_s ~420; about 5 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pocket_gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/pocket_numba
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
$py -c "import cupy, numpy; print('cupy', cupy.__version__, 'devices', \
cupy.cuda.runtime.getDeviceCount(), 'numpy', numpy.__version__)" | tee -a "$OUT/gpu.txt"

echo "== gpu tests" >&2
timeout 200 $py -m pytest -m gpu -q -p no:cacheprovider -x tests/train 2>&1 | tail -40 \
  | tee "$OUT/gpu_tests.log"

echo "== digits on the GPU, fp32 and fp16" >&2
for p in fp32 fp16; do
  timeout 120 $py -m pocket.cli train examples/digits_cnn.toml --device cuda --precision $p \
    --out "/tmp/pocket_gpu_digits_$p" --force --json > "$OUT/digits_$p.json" 2> "$OUT/digits_$p.err"
  echo "digits $p exit $?" | tee -a "$OUT/summary.txt"
done

echo "== vgg (cnn_cifar) at batch 256 under a 4 GiB budget, synthetic CIFAR-shaped data" >&2
$py - <<'PY'
import numpy as np
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (4096, 32, 32, 3), dtype=np.uint8)
y = rng.integers(0, 10, 4096)
np.savez("/tmp/pocket_gpu_cifar.npz", x=x, y=y)
open("/tmp/pocket_gpu_vgg.toml", "w").write(
    '[data]\nsource = "npz:/tmp/pocket_gpu_cifar.npz"\n[model]\nname = "vgg"\n'
    '[train]\nepochs = 2\nbatch_size = 256\noptimizer = "sgd"\nlr = 0.05\n')
PY
timeout 240 $py -m pocket.cli train /tmp/pocket_gpu_vgg.toml --device cuda --memory-budget 4GiB \
  --out /tmp/pocket_gpu_vgg --force --json > "$OUT/vgg_budget.json" 2> "$OUT/vgg_budget.err"
echo "vgg budget exit $?" | tee -a "$OUT/summary.txt"
$py - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("digits_fp32", "digits_fp16", "vgg_budget"):
    p = out / f"{name}.json"
    try:
        r = json.loads(p.read_text())
    except Exception as e:  # noqa: BLE001 - a failed run leaves no JSON; say so and go on
        print(f"{name}: no result ({type(e).__name__}); see {name}.err")
        continue
    steps = max(r["steps"], 1)
    print(f"{name}: {r['seconds']}s for {r['steps']} steps ({1000 * r['seconds'] / steps:.1f} ms/step), "
          f"test {r['test']}, peak tracked {r['memory']['total']['peak'] / 2**20:.1f} MiB, "
          f"GPU pool {r['gpu_pool']}, plan {r['plan']}")
PY

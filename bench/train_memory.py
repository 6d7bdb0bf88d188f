"""Peak training memory: pocket vs PyTorch CPU at the same batch, memory savers off and on.

    python bench/train_memory.py --models cnn_mnist,cnn_cifar --batch 32 --steps 2

"on" means activation checkpointing in about sqrt(layers) segments for both frameworks
(torch.utils.checkpoint.checkpoint_sequential) plus, for pocket, fp16 storage of saved
activations (PyTorch has no CPU equivalent) and heap memory handed back to the OS as the
trainer does with a saver on. Each measurement runs in a fresh subprocess: one tiny warm-up
step, then the peak RSS growth over that baseline (/proc/self/status VmHWM, reset through
clear_refs), and for pocket also our tracker's total and activation peaks. A step is
forward + cross entropy + backward + SGD(momentum). Writes bench/results/train_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import (  # noqa: E402
    MODELS,
    _status_bytes,
    build_pocket,
    build_torch,
    worker_env,
    write_results,
)


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def worker(framework: str, model: str, batch: int, steps: int, savers: bool) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + MODELS[model]).astype(np.float32)
    y = rng.integers(0, 10, batch)
    if framework == "pocket":
        from pocket.train import functional as F
        from pocket.train import kernels_cpu, optim  # noqa: F401 - load the JIT cache here
        from pocket.train.memory import get_tracker
        from pocket.train.recompute import checkpoint_sequential
        from pocket.train.tensor import Tensor, saved_activations_fp16

        if savers:
            from pocket.train.backend import return_freed_host_memory

            return_freed_host_memory()  # as the trainer does when a saver is on
        net = build_pocket(model)
        segments = round(math.sqrt(len(net))) if savers else 0
        opt = optim.SGD(net, lr=0.01, momentum=0.9)

        def step(xt, y):
            with saved_activations_fp16(savers):
                loss = F.cross_entropy(checkpoint_sequential(net, xt, segments), y)
                net.zero_grad()
                loss.backward()
            opt.step()

        xt, warm = Tensor(x), (Tensor(x[:2]), y[:2])
    else:
        import torch
        from torch.utils.checkpoint import checkpoint_sequential as torch_ckpt

        net = build_torch(model)
        segments = round(math.sqrt(len(net)))
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

        def step(xt, yt):
            out = (torch_ckpt(net, segments, xt, use_reentrant=False) if savers else net(xt))
            loss = torch.nn.functional.cross_entropy(out, yt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        xt, y = torch.from_numpy(x), torch.from_numpy(y)
        warm = (xt[:2], y[:2])

    # NOTE: one tiny step first, for both frameworks: kernels load (JIT cache, oneDNN) and the
    # optimizer state exists. Then the high-water mark is reset, so the delta is the training
    # memory of the batch rather than start-up costs.
    step(*warm)
    base = _status_bytes("VmRSS")
    _reset_peak_rss()
    for _ in range(steps):
        step(xt, y)
    out = {"peak_rss_delta": _status_bytes("VmHWM") - base}
    if framework == "pocket":
        t = get_tracker()
        out.update(tracker_peak=t.total_peak, tracker_activations_peak=t.peak["activations"])
    return out


def run_one(framework, model, batch, steps, threads, savers) -> dict:
    env = worker_env(threads)
    cmd = [sys.executable, __file__, "--worker", framework, "--models", model,
           "--batch", str(batch), "--steps", str(steps)] + (["--savers"] if savers else [])
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"{framework} {model} b{batch} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cnn_mnist,cnn_cifar")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--savers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["pocket", "torch"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.models, a.batch, a.steps, a.savers)))
        return
    try:
        import torch  # noqa: F401

        frameworks = ["pocket", "torch"]
    except ImportError:
        frameworks = ["pocket"]
    rows = []
    for model in a.models.split(","):
        for savers in (False, True):
            row = {"model": model, "batch": a.batch, "savers": "on" if savers else "off"}
            for fw in frameworks:
                r = run_one(fw, model, a.batch, a.steps, a.threads, savers)
                row[f"{fw}_peak_mib"] = r["peak_rss_delta"] / 2**20
                if fw == "pocket":
                    row["pocket_tracker_mib"] = r["tracker_peak"] / 2**20
                    row["pocket_activations_mib"] = r["tracker_activations_peak"] / 2**20
            if "torch_peak_mib" in row:
                row["mem_ratio"] = row["pocket_peak_mib"] / max(row["torch_peak_mib"], 1e-9)
                # DESIGN §10's target: pocket with savers against PyTorch's default (no savers)
                default = rows[-1] if savers else row
                row["vs_torch_default"] = row["pocket_peak_mib"] / max(default["torch_peak_mib"],
                                                                       1e-9)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    write_results("train_memory", rows,
                  ["model", "batch", "savers", "pocket_peak_mib", "torch_peak_mib", "mem_ratio",
                   "vs_torch_default", "pocket_tracker_mib", "pocket_activations_mib"])


if __name__ == "__main__":
    main()

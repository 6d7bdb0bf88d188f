"""Training step time and peak memory: pocket vs PyTorch CPU on three reference models.

    python bench/train_step.py --models cnn_mnist --batches 64 --repeats 3 --steps 5

Each (framework, model, batch, repeat) runs in a fresh subprocess with the same thread count
for BLAS, Numba and torch; a step is forward + cross entropy + backward + SGD(momentum) step.
Reports the median step time over repeats and the peak RSS growth over the process's baseline
(our tracker's peak too, for pocket), and the 1-minute load average before and after each case:
a load above the thread count means other processes shared the cores, and the ratio is noisy.
Writes bench/results/train_step.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"mlp": (1, 28, 28), "cnn_mnist": (1, 28, 28), "cnn_cifar": (3, 32, 32)}
CIFAR_CHANNELS = (64, 64, 128, 128, 256, 256, 256, 256)


def _status_bytes(field: str) -> int:
    """VmRSS / VmHWM of this process (Linux); ru_maxrss would carry the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build_pocket(name: str):
    from pocket.train import nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn_mnist":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    layers, c = [], 3
    for i, o in enumerate(CIFAR_CHANNELS):
        layers += [nn.Conv2d(c, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
        if i in (1, 3, 5):
            layers.append(nn.MaxPool2d(2))
        c = o
    layers += [nn.GlobalAvgPool2d(), nn.Flatten(), nn.Linear(256, 10)]
    return nn.Sequential(*layers)


def build_torch(name: str):
    from torch import nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn_mnist":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    layers, c = [], 3
    for i, o in enumerate(CIFAR_CHANNELS):
        layers += [nn.Conv2d(c, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
        if i in (1, 3, 5):
            layers.append(nn.MaxPool2d(2))
        c = o
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10)]
    return nn.Sequential(*layers)


def worker(framework: str, model: str, batch: int, steps: int, threads: int,
           profile: bool) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + MODELS[model]).astype(np.float32)
    y = rng.integers(0, 10, batch)
    times = []
    if framework == "pocket":
        from pocket.train import functional as F
        from pocket.train import kernels_cpu, optim  # noqa: F401 - load the JIT cache here
        from pocket.train.memory import get_tracker
        from pocket.train.tensor import Tensor

        base = _status_bytes("VmRSS")
        net = build_pocket(model)
        opt = optim.SGD(net, lr=0.01, momentum=0.9)
        xt = Tensor(x)

        def step():
            loss = F.cross_entropy(net(xt), y)
            net.zero_grad()
            loss.backward()
            opt.step()
    else:
        import torch

        torch.set_num_threads(threads)
        base = _status_bytes("VmRSS")
        net = build_torch(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)

        def step():
            loss = torch.nn.functional.cross_entropy(net(xt), yt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    step()  # warm-up: JIT caches, allocator, first-touch
    if profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if profile:
        pr.disable()
        pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    out = {"step_s": statistics.median(times), "peak_rss_delta": _status_bytes("VmHWM") - base}
    if framework == "pocket":
        out["tracker_peak"] = get_tracker().total_peak
    return out


def worker_env(threads: int) -> dict:
    """The environment of a measuring subprocess: every thread pool at `threads`, pocket importable."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_one(framework, model, batch, steps, threads, profile=False) -> dict:
    env = worker_env(threads)
    cmd = [sys.executable, __file__, "--worker", framework, "--models", model,
           "--batches", str(batch), "--steps", str(steps), "--threads", str(threads)]
    if profile:
        cmd.append("--profile")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"{framework} {model} b{batch} failed:\n{res.stderr}")
    if profile:
        sys.stderr.write(res.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn_mnist,cnn_cifar")
    ap.add_argument("--batches", default="64,128")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile one pocket run per case")
    ap.add_argument("--worker", choices=["pocket", "torch"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        r = worker(a.worker, a.models, int(a.batches), a.steps, a.threads, a.profile)
        print(json.dumps(r))
        return
    try:
        import torch  # noqa: F401

        frameworks = ["pocket"] if a.no_torch else ["pocket", "torch"]
    except ImportError:
        frameworks = ["pocket"]
    rows = []
    for model in a.models.split(","):
        for batch in (int(b) for b in a.batches.split(",")):
            row = {"model": model, "batch": batch, "threads": a.threads,
                   "load_before": os.getloadavg()[0]}
            # NOTE: repeats alternate the frameworks (p, t, p, t, ...) so a burst of load from
            # other processes lands on both sides of the ratio, not on one framework's block.
            runs_by_fw = {fw: [] for fw in frameworks}
            for _ in range(a.repeats):
                for fw in frameworks:
                    runs_by_fw[fw].append(run_one(fw, model, batch, a.steps, a.threads))
            row["load_after"] = os.getloadavg()[0]
            for fw, runs in runs_by_fw.items():
                row[f"{fw}_step_ms"] = 1e3 * statistics.median(r["step_s"] for r in runs)
                row[f"{fw}_best_ms"] = 1e3 * min(r["step_s"] for r in runs)
                row[f"{fw}_peak_mib"] = statistics.median(r["peak_rss_delta"] for r in runs) / 2**20
                if fw == "pocket":
                    row["pocket_tracker_peak_mib"] = runs[0]["tracker_peak"] / 2**20
            if "torch_step_ms" in row:
                row["time_ratio"] = row["pocket_step_ms"] / row["torch_step_ms"]
                # the fastest repeat of each: the least disturbed by other load
                row["best_ratio"] = row["pocket_best_ms"] / row["torch_best_ms"]
                row["mem_ratio"] = row["pocket_peak_mib"] / max(row["torch_peak_mib"], 1e-9)
            if a.profile:
                run_one("pocket", model, batch, a.steps, a.threads, profile=True)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    write_results("train_step", rows,
                  ["model", "batch", "pocket_step_ms", "torch_step_ms", "time_ratio", "best_ratio",
                   "pocket_peak_mib", "torch_peak_mib", "mem_ratio", "pocket_tracker_peak_mib",
                   "load_before", "load_after"])


def write_results(name: str, rows: list[dict], cols: list[str]) -> None:
    """bench/results/NAME.json (every field) and NAME.md (a table of `cols`), and print it."""
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))
                 for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    (out_dir / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

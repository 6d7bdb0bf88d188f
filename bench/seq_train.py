"""Training step time and peak memory of the sequence zoo models (tcn, ssm, transformer):
pocket vs the same models written in plain torch.nn.

    python bench/seq_train.py                                  # all three, 1 thread
    python bench/seq_train.py --models ssm --repeats 3 --steps 5 --profile

Sizes as the examples train them: `tcn` and `ssm` as examples/co2_tcn.toml and co2_ssm.toml
(a 104-week window of one series -> a 52-week forecast, batch 32, MSE), `transformer` at
digits_vit.toml's width (16 tokens of 4 features, dim 64, 2 blocks, 4 heads, MLP x2, batch 64,
cross entropy). AdamW on both sides. The torch twins mirror pocket's layers one for one (the S4D
layer as the same FFT long convolution with pocket's parameterisation, its kernel in complex128
as pocket's), and the bench refuses a pair whose parameter counts differ.

The measuring follows bench/train_step.py (its worker pattern and result writer): one fresh
subprocess per (framework, model, repeat), every thread pool at --threads, frameworks
alternating; median step time, peak RSS growth, pocket's tracker peak.
Writes bench/results/seq_train.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step as ts  # noqa: E402  (bench/train_step.py: _status_bytes, worker_env, write_results)

MODELS = {
    "tcn": {"input": (1, 104), "outputs": 52, "batch": 32, "loss": "mse",
            "kw": {"channels": [32, 32, 32, 32, 32], "kernel": 3}},
    "ssm": {"input": (104, 1), "outputs": 52, "batch": 32, "loss": "mse",
            "kw": {"d_model": 32, "d_state": 16, "depth": 2}},
    "transformer": {"input": (16, 4), "outputs": 10, "batch": 64, "loss": "ce",
                    "kw": {"dim": 64, "depth": 2, "heads": 4, "mlp_ratio": 2.0}},
}
LR, WEIGHT_DECAY = 2e-3, 1e-4


def build_pocket(name: str):
    from pocket.train import models

    spec = MODELS[name]
    return models.ZOO[name](spec["input"], spec["outputs"], rng=np.random.default_rng(0),
                            **spec["kw"])


# --------------------------------------------------------------------------- torch twins


def build_torch(name: str):
    import torch
    from torch import nn

    spec = MODELS[name]
    kw = spec["kw"]

    class CausalConv1d(nn.Conv1d):
        def forward(self, x):
            pad = (self.kernel_size[0] - 1) * self.dilation[0]
            return super().forward(nn.functional.pad(x, (pad, 0)))

    class TemporalBlock(nn.Module):
        def __init__(self, c_in, c_out, k, d):
            super().__init__()
            self.conv1 = CausalConv1d(c_in, c_out, k, dilation=d)
            self.conv2 = CausalConv1d(c_out, c_out, k, dilation=d)
            self.shortcut = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else None

        def forward(self, x):
            y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
            return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))

    class MeanOver(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim

        def forward(self, x):
            return x.mean(dim=self.dim)

    class S4D(nn.Module):
        """pocket.train.nn_ssm.S4D's parameters and its FFT long convolution (unidirectional)."""

        def __init__(self, h, s):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.log_dt = nn.Parameter(torch.empty(h).uniform_(math.log(1e-3), math.log(1e-1),
                                                               generator=g))
            self.log_a_re = nn.Parameter(torch.full((h, s), math.log(0.5)))
            self.a_im = nn.Parameter(math.pi * torch.arange(s, dtype=torch.float32).repeat(h, 1))
            self.b_re = nn.Parameter(torch.ones(h, s))
            self.b_im = nn.Parameter(torch.zeros(h, s))
            self.c_re = nn.Parameter(torch.randn(1, h, s, generator=g) * math.sqrt(0.5))
            self.c_im = nn.Parameter(torch.randn(1, h, s, generator=g) * math.sqrt(0.5))
            self.d = nn.Parameter(torch.randn(h, generator=g))

        def forward(self, u):  # (N, L, H)
            length = u.shape[1]
            f = torch.float64
            dt = self.log_dt.to(f).exp()[:, None]
            a = torch.complex(-self.log_a_re.to(f).exp(), self.a_im.to(f))
            z = dt * a
            w = torch.complex(self.c_re.to(f), self.c_im.to(f))[0] * (
                (z.exp() - 1.0) / a * torch.complex(self.b_re.to(f), self.b_im.to(f)))
            steps = torch.arange(length, dtype=f)
            k = 2.0 * torch.einsum("hs,hsl->hl", w, torch.exp(z[:, :, None] * steps)).real
            n = 2 * length
            kf = torch.fft.rfft(k.to(u.dtype).T, n=n, dim=0)
            y = torch.fft.irfft(torch.fft.rfft(u, n=n, dim=1) * kf, n=n, dim=1)[:, :length]
            return y + u * self.d

    class SSMBlock(nn.Module):
        def __init__(self, h, s):
            super().__init__()
            self.norm, self.ssm, self.out = nn.LayerNorm(h), S4D(h, s), nn.Linear(h, 2 * h)

        def forward(self, x):
            y = self.out(nn.functional.gelu(self.ssm(self.norm(x))))
            return x + nn.functional.glu(y, dim=-1)

    class Attention(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

        def forward(self, x):
            n, length, e = x.shape

            def split(t):
                return t.reshape(n, length, self.heads, e // self.heads).transpose(1, 2)

            y = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)),
                                                           split(self.v(x)))
            return self.o(y.transpose(1, 2).reshape(n, length, e))

    class EncoderBlock(nn.Module):
        def __init__(self, dim, heads, hidden):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim)
            self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class Positions(nn.Module):
        def __init__(self, length, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(length, dim) * 0.02)

        def forward(self, x):
            return x + self.weight

    if name == "tcn":
        layers, c = [], spec["input"][0]
        for i, o in enumerate(kw["channels"]):
            layers.append(TemporalBlock(c, o, kw["kernel"], 2**i))
            c = o
        return nn.Sequential(*layers, MeanOver(2), nn.Linear(c, spec["outputs"]))
    if name == "ssm":
        (length, feats), h = spec["input"], kw["d_model"]
        return nn.Sequential(nn.Linear(feats, h),
                             *(SSMBlock(h, kw["d_state"]) for _ in range(kw["depth"])),
                             nn.LayerNorm(h), nn.Flatten(), nn.Linear(length * h, spec["outputs"]))
    (length, feats), dim = spec["input"], kw["dim"]
    hidden = int(round(dim * kw["mlp_ratio"]))
    return nn.Sequential(nn.Linear(feats, dim), Positions(length, dim),
                         *(EncoderBlock(dim, kw["heads"], hidden) for _ in range(kw["depth"])),
                         nn.LayerNorm(dim), MeanOver(1), nn.Linear(dim, spec["outputs"]))


def param_counts(name: str) -> tuple[int, int]:
    p = sum(int(np.prod(t.shape)) for t in build_pocket(name).parameters())
    t = sum(t.numel() for t in build_torch(name).parameters())
    return p, t


def same_function(name: str) -> tuple[float, float]:
    """pocket's weights copied into the torch twin (the two list their parameters in the same
    order and shapes): the largest relative differences of the outputs and of the gradients
    after one loss and backward, so a twin that computes something else cannot pass as one."""
    import torch

    from pocket.train import functional as F
    from pocket.train.tensor import Tensor

    net, twin = build_pocket(name).train(), build_torch(name).train()
    pairs = list(zip(net.parameters(), twin.parameters(), strict=True))
    with torch.no_grad():
        for a, b in pairs:
            b.copy_(torch.from_numpy(np.ascontiguousarray(a.data)))
    x, y = _data(name)
    mse = MODELS[name]["loss"] == "mse"
    out = net(Tensor(x))
    loss = F.mse_loss(out, Tensor(y)) if mse else F.cross_entropy(out, y)
    net.zero_grad()
    loss.backward()
    t_out = twin(torch.from_numpy(x))
    loss_fn = torch.nn.functional.mse_loss if mse else torch.nn.functional.cross_entropy
    loss_fn(t_out, torch.from_numpy(y)).backward()

    def rel(u, v) -> float:
        return float(np.abs(u - v).max() / max(np.abs(v).max(), 1e-30))

    d_out = rel(np.asarray(out.data), t_out.detach().numpy())
    # NOTE: against the largest gradient of all, not each parameter's own: a key projection's
    # bias has a zero gradient in exact arithmetic (softmax ignores a shift shared by a query's
    # scores), so both sides hold rounding noise of ~1e-10 there
    scale = max(float(np.abs(b.grad.numpy()).max()) for _, b in pairs)
    d_grad = max(float(np.abs(np.asarray(a.grad) - b.grad.numpy()).max()) for a, b in pairs) / scale
    return d_out, d_grad


# --------------------------------------------------------------------------- measuring


def _data(name: str):
    spec = MODELS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((spec["batch"], *spec["input"])).astype(np.float32)
    if spec["loss"] == "mse":
        y = rng.standard_normal((spec["batch"], spec["outputs"])).astype(np.float32)
    else:
        y = rng.integers(0, spec["outputs"], spec["batch"])
    return x, y


def worker(framework: str, name: str, steps: int, threads: int, profile: bool) -> dict:
    x, y = _data(name)
    mse = MODELS[name]["loss"] == "mse"
    if framework == "pocket":
        from pocket.train import functional as F
        from pocket.train import kernels_cpu, optim  # noqa: F401 - load the JIT cache here
        from pocket.train.memory import get_tracker
        from pocket.train.tensor import Tensor

        base = ts._status_bytes("VmRSS")
        net = build_pocket(name).train()
        opt = optim.AdamW(net, lr=LR, weight_decay=WEIGHT_DECAY)
        xt = Tensor(x)
        yt = Tensor(y) if mse else y

        def step():
            out = net(xt)
            loss = F.mse_loss(out, yt) if mse else F.cross_entropy(out, yt)
            net.zero_grad()
            loss.backward()
            opt.step()
    else:
        import torch

        torch.set_num_threads(threads)
        base = ts._status_bytes("VmRSS")
        net = build_torch(name).train()
        opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        loss_fn = torch.nn.functional.mse_loss if mse else torch.nn.functional.cross_entropy

        def step():
            loss = loss_fn(net(xt), yt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    step()  # warm-up: JIT caches, allocator, first-touch
    step()
    if profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if profile:
        pr.disable()
        pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    out = {"step_s": statistics.median(times), "peak_rss_delta": ts._status_bytes("VmHWM") - base}
    if framework == "pocket":
        out["tracker_peak"] = get_tracker().total_peak
    return out


def run_one(framework: str, name: str, steps: int, threads: int, profile: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--worker", framework, "--models", name,
           "--steps", str(steps), "--threads", str(threads)] + (["--profile"] if profile else [])
    res = subprocess.run(cmd, env=ts.worker_env(threads), capture_output=True, text=True,
                         check=False)
    if res.returncode:
        raise RuntimeError(f"{framework} {name} failed:\n{res.stderr}")
    if profile:
        sys.stderr.write(res.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1])



def _fail(message: str) -> None:
    """Bad input: one `Error:` line on stderr, exit 3 (the project's rule)."""
    print(f"Error: {message}", file=sys.stderr)
    raise SystemExit(3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tcn,ssm,transformer")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="cProfile one pocket run per model")
    ap.add_argument("--worker", choices=["pocket", "torch"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.models, a.steps, a.threads, a.profile)))
        return
    rows = []
    for name in a.models.split(","):
        p_params, t_params = param_counts(name)
        if p_params != t_params:
            _fail(f"{name}: pocket has {p_params} parameters, the torch twin "
                             f"{t_params}; the two models differ")
        d_out, d_grad = same_function(name)
        if max(d_out, d_grad) > 1e-3:
            _fail(f"{name}: with the same weights the torch twin's outputs "
                             f"differ by {d_out:.1e} and its gradients by {d_grad:.1e} (relative)")
        row = {"model": name, "batch": MODELS[name]["batch"], "threads": a.threads,
               "params": p_params, "twin_out_rel_diff": d_out, "twin_grad_rel_diff": d_grad,
               "load_before": os.getloadavg()[0]}
        runs = {"pocket": [], "torch": []}
        for _ in range(a.repeats):
            for fw in runs:  # alternating, so a burst of load lands on both sides
                runs[fw].append(run_one(fw, name, a.steps, a.threads))
        row["load_after"] = os.getloadavg()[0]
        for fw, rs in runs.items():
            row[f"{fw}_step_ms"] = 1e3 * statistics.median(r["step_s"] for r in rs)
            row[f"{fw}_best_ms"] = 1e3 * min(r["step_s"] for r in rs)
            row[f"{fw}_peak_mib"] = statistics.median(r["peak_rss_delta"] for r in rs) / 2**20
        row["pocket_tracker_peak_mib"] = runs["pocket"][0]["tracker_peak"] / 2**20
        row["time_ratio"] = row["pocket_step_ms"] / row["torch_step_ms"]
        row["best_ratio"] = row["pocket_best_ms"] / row["torch_best_ms"]
        row["mem_ratio"] = row["pocket_peak_mib"] / max(row["torch_peak_mib"], 1e-9)
        if a.profile:
            run_one("pocket", name, a.steps, a.threads, profile=True)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    ts.write_results("seq_train", rows,
                     ["model", "batch", "params", "pocket_step_ms", "torch_step_ms", "time_ratio",
                      "best_ratio", "pocket_peak_mib", "torch_peak_mib", "mem_ratio",
                      "pocket_tracker_peak_mib", "load_before", "load_after"])


if __name__ == "__main__":
    main()

"""Training step of the digits spiking CNN (examples/digits_snn.toml's `snn`): pocket against
the same model in PyTorch, written the usual way (a Python loop over time steps, the spike a
custom autograd Function with the sigmoid surrogate, the reset not detached, as pocket's).

    python bench/spiking_train.py [--steps-t 12] [--batch 64] [--rounds 5]

Both start from the same weights (pocket's, copied) and the same batch; the first loss must
agree (a check that the two compute the same thing). Each round times one AdamW step of each
(interleaved), the table shows medians. Memory: pocket's tracked peak of saved activations,
and the bytes PyTorch saves for backward (summed through saved_tensors_hooks), the same
quantity. Writes bench/results/spiking_train.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def _torch_model(pocket_model, steps: int):
    import torch

    class Spike(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.save_for_backward(x)
            ctx.alpha = alpha
            return (x >= 0).to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            sg = torch.sigmoid(ctx.alpha * x)
            return g * ctx.alpha * sg * (1 - sg), None

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.syn = torch.nn.ModuleList()
            self.meta = []
            for m in list(pocket_model.children())[1:]:
                s = m.syn
                if hasattr(s, "kernel_size"):
                    layer = torch.nn.Conv2d(s.in_channels, s.out_channels, s.kernel_size,
                                            s.stride, s.padding)
                else:
                    layer = torch.nn.Linear(s.in_features, s.out_features)
                with torch.no_grad():
                    layer.weight.copy_(torch.from_numpy(np.asarray(s.weight.data)))
                    layer.bias.copy_(torch.from_numpy(np.asarray(s.bias.data)))
                self.syn.append(layer)
                self.meta.append((float(m.decay[0]), float(m.threshold[0]), m.param, m.output))

        def forward(self, x):
            n = x.shape[0]
            x = x.unsqueeze(1).expand(n, steps, *x.shape[1:])
            for layer, (beta, thr, alpha, out) in zip(self.syn, self.meta):
                folded = x.reshape(n * steps, *x.shape[2:])
                if isinstance(layer, torch.nn.Linear):
                    folded = folded.reshape(n * steps, -1)
                cur = layer(folded).reshape(n, steps, *layer(folded[:1]).shape[1:])
                v = torch.zeros_like(cur[:, 0])
                spikes = []
                for t in range(steps):
                    u = beta * v + cur[:, t]
                    s = Spike.apply(u - thr, alpha)
                    v = u - s * thr
                    spikes.append(s)
                x = torch.stack(spikes, 1)
                if out == "count":
                    return x.sum(1)
            return x

    return Net()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps-t", type=int, default=12)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from pocket.train import functional as F
    from pocket.train import models, optim
    from pocket.train.memory import tracking
    from pocket.train.tensor import Tensor

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    with tracking() as tracker:
        pm = models.ZOO["snn"]((1, 8, 8), 10, steps=args.steps_t, rng=np.random.default_rng(0))
        tm = _torch_model(pm, args.steps_t)
        popt = optim.AdamW(pm, lr=1e-3)
        topt = torch.optim.AdamW(tm.parameters(), lr=1e-3)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        saved = [0]

        def pack(t):
            saved[0] += t.numel() * t.element_size()
            return t

        def pocket_step():
            loss = F.cross_entropy(pm(Tensor(x)), y)
            loss.backward()
            popt.step()
            popt.zero_grad()
            return float(loss.data)

        def torch_step():
            saved[0] = 0
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = torch.nn.functional.cross_entropy(tm(xt), yt)
            loss.backward()
            topt.step()
            topt.zero_grad()
            return float(loss.detach())

        first = (pocket_step(), torch_step())
        times: dict[str, list[float]] = {"pocket": [], "torch": []}
        for _ in range(args.rounds):
            for name, fn in (("pocket", pocket_step), ("torch", torch_step)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        act_peak = tracker.peak["activations"]
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"T": args.steps_t, "batch": args.batch, "threads": args.threads,
              "first_loss": {"pocket": first[0], "torch": first[1]},
              "step_ms": {k: 1e3 * v for k, v in med.items()},
              "ratio": med["pocket"] / med["torch"],
              "saved_bytes": {"pocket": act_peak, "torch": saved[0]}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "spiking_train.json").write_text(json.dumps(result, indent=2))
    md = ["| T | batch | pocket step ms | torch step ms | pocket / torch | saved for backward: "
          "pocket | torch |", "|---|---|---|---|---|---|---|",
          f"| {args.steps_t} | {args.batch} | {result['step_ms']['pocket']:.1f} | "
          f"{result['step_ms']['torch']:.1f} | {result['ratio']:.2f}x | "
          f"{act_peak / 2**20:.2f} MiB | {saved[0] / 2**20:.2f} MiB |",
          "", f"first loss: pocket {first[0]:.6f}, torch {first[1]:.6f}"]
    (RESULTS / "spiking_train.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

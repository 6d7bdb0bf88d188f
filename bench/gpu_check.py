"""The measuring parts of scripts/gpu_check.sh: one step each, one JSON per step under --out.

    python bench/gpu_check.py digits --out OUT              # fp32+fp16 on cuda vs the CPU run
    python bench/gpu_check.py steps --framework pocket --out OUT [--models vgg,resnet]
    python bench/gpu_check.py steps --framework torch --out OUT
    python bench/gpu_check.py budget --out OUT --budget 1GiB
    python bench/gpu_check.py report --out OUT              # gpu_check.json + gpu_check.md

`steps` times steady-state training steps (warm-up steps first, so compiles and the cuDNN /
pool warm-up are out; then CUDA events around the timed steps) of the vgg and resnet reference
models on CIFAR-shaped data, with the peak GPU memory of the timed steps (pocket: a pool memory
hook; PyTorch: max_memory_allocated), in fp32 and fp16 (PyTorch: autocast + GradScaler, the
same mixed precision), with TF32 pinned the same on both (off unless --tf32). Every step is
forward + cross entropy + backward + SGD(momentum 0.9) update. `--device cpu` runs the same
code on the CPU (what the tests run without a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("vgg", "resnet")
PRECISIONS = ("fp32", "fp16")
TARGETS = {"accuracy_points": 0.5, "step_ratio": 1.25, "memory_ratio": 0.6}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=["digits", "steps", "budget", "report"])
    ap.add_argument("--out", required=True, type=Path, help="folder for the JSON results")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--framework", choices=["pocket", "torch"], default="pocket")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="128,256")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, dest="n_steps")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--channels", default=None,
                    help="vgg channels, comma separated (default: the reference model's)")
    ap.add_argument("--budget", default="1GiB")
    ap.add_argument("--epochs", type=int, default=None, help="digits epochs (default: config)")
    ap.add_argument("--losses", type=int, default=20, help="first N step losses compared")
    ap.add_argument("--limit", type=int, default=None, help="digits: use only N samples")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 on both frameworks")
    ap.add_argument("--savers", action="store_true",
                    help="pocket: fp16 saved activations + activation checkpointing")
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    bad = sorted(set(args.models) - set(MODELS))
    if bad:
        ap.error(f"unknown model(s) {bad}; choose from {', '.join(MODELS)}")
    args.precisions = [p for p in args.precisions.split(",") if p]
    if sorted(set(args.precisions) - set(PRECISIONS)):
        ap.error(f"precisions are {', '.join(PRECISIONS)}")
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
        args.channels = [int(c) for c in args.channels.split(",")] if args.channels else None
    except ValueError:
        ap.error("--batches and --channels take comma-separated integers")
    if not args.batches or min(args.batches) < 1 or args.n_steps < 1 or args.warmup < 0:
        ap.error("batches and --steps must be at least 1, --warmup at least 0")
    return args


def write_json(out: Path, name: str, obj: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


# ----------------------------------------------------------------------------- digits


def _digits_run(device: str, precision: str, epochs, n_losses: int, out: Path,
                limit=None) -> dict:
    from pocket.train.config import load_config
    from pocket.train.trainer import Trainer

    overrides = {"device": device, "precision": precision, "out": str(out / f"digits_{device}_"
                                                                          f"{precision}")}
    if epochs:
        overrides["epochs"] = epochs
    cfg = load_config(ROOT / "examples" / "digits_cnn.toml", overrides)
    if limit:
        cfg["data"]["limit"] = limit
    tr = Trainer(cfg, quiet=True)
    losses: list[float] = []
    step = tr.train_step

    def recording_step(xb, yb):
        loss, correct = step(xb, yb)
        if len(losses) < n_losses:
            losses.append(float(loss))
        return loss, correct

    tr.train_step = recording_step
    t0 = time.perf_counter()
    r = tr.fit(force=True)
    return {"device": device, "precision": precision, "seconds": time.perf_counter() - t0,
            "steps": r["steps"], "test": r["test"], "losses": losses,
            "skipped_steps": r["final"].get("skipped_steps", 0)}


def compare_losses(ref: list[float], got: list[float]) -> dict:
    n = min(len(ref), len(got))
    if n == 0:
        return {"n": 0, "max_abs": None, "max_rel": None}
    a, b = np.asarray(ref[:n]), np.asarray(got[:n])
    diff = np.abs(a - b)
    return {"n": n, "max_abs": float(diff.max()),
            "max_rel": float((diff / np.maximum(np.abs(a), 1e-12)).max())}


def digits(args) -> dict:
    cpu = _digits_run("cpu", "fp32", args.epochs, args.losses, args.out / "reference", args.limit)
    result = {"reference_cpu_fp32": cpu}
    for p in args.precisions:
        key = f"{args.device.replace(':', '')}_{p}"
        try:
            run = _digits_run(args.device, p, args.epochs, args.losses, args.out, args.limit)
        except Exception as e:  # noqa: BLE001 - the report says which run failed and why
            result[key] = {"error": f"{type(e).__name__}: {e}"}
            continue
        run["losses_vs_cpu"] = compare_losses(cpu["losses"], run["losses"])
        acc, ref = run["test"].get("accuracy"), cpu["test"].get("accuracy")
        if acc is not None and ref is not None:
            run["accuracy_points_vs_cpu"] = 100 * (acc - ref)
        result[key] = run
    return result


# ----------------------------------------------------------------------------- step times


def build_torch(name: str, num_outputs: int = 10, channels=None):
    """PyTorch twins of pocket.train.models.vgg / resnet (same layers, same order)."""
    from torch import nn

    if name == "vgg":
        layers, c = [], 3
        for i, o in enumerate(channels or [64, 64, 128, 128, 256, 256, 256, 256]):
            layers += [nn.Conv2d(c, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
            if i in (1, 3, 5):
                layers.append(nn.MaxPool2d(2))
            c = o
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_outputs))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                        nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return (self.body(x) + self.short(x)).relu()

    layers = [nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for s, c in enumerate([16, 32, 64]):
        layers.append(Block(cin, c, 2 if s > 0 else 1))
        cin = c
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_outputs))


def _data(batch: int, hw: int):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((batch, 3, hw, hw)).astype(np.float32),
            rng.integers(0, 10, batch))


def pocket_steps(model: str, batch: int, precision: str, args) -> dict:
    from pocket.train import backend, models, optim
    from pocket.train import functional as F
    from pocket.train.amp import LossScaler, MixedPrecision
    from pocket.train.memory import get_tracker
    from pocket.train.tensor import Tensor

    device = backend.get_device(args.device)
    backend.use_device(device)
    xp = device.xp
    rng = np.random.default_rng(0)
    kw = {"channels": args.channels} if model == "vgg" and args.channels else {}
    net = getattr(models, model)((3, args.image_size, args.image_size), 10, rng=rng, **kw)
    net.to(device)
    amp = MixedPrecision(net, precision)
    scaler = LossScaler(enabled=precision == "fp16")
    opt = optim.SGD(amp.master_params(), 0.01, momentum=0.9)
    xh, yh = _data(batch, args.image_size)
    x, y = backend.to_device(xh, device), backend.to_device(yh, device)

    segments = max(2, round(math.sqrt(len(net)))) if args.savers else 0

    def forward(t):
        if not segments:
            return net(t)
        from pocket.train.recompute import checkpoint_sequential
        from pocket.train.tensor import saved_activations_fp16

        with saved_activations_fp16(precision == "fp32"):
            return checkpoint_sequential(net, t, segments)

    def step():
        # an fp16 overflow is the loss scaler's business, not a warning
        with (np.errstate(over="ignore", invalid="ignore") if precision == "fp16"
              else contextlib.nullcontext()):
            _step()

    def _step():
        amp.before_step()
        out = forward(Tensor(amp.cast_input(x)))
        loss = F.cross_entropy(F.astype(out, np.float32), y)
        scaler.scale_loss(loss).backward()
        flag = amp.grads_to_master(scaler.scale, sync=False)
        bad = not math.isfinite(float(flag))  # the step's one host sync
        if not scaler.update(bad):
            opt.step(nonfinite=False)
        opt.zero_grad()
        amp.zero_model_grads()

    for _ in range(args.warmup):
        step()
    tracker = get_tracker()
    tracker.reset_peak()
    if xp is np:
        t0 = time.perf_counter()
        for _ in range(args.n_steps):
            step()
        ms = (time.perf_counter() - t0) * 1e3 / args.n_steps
        peak = tracker.total_peak
    else:
        peak_hook = backend.GpuPeak(device)
        try:
            start, end = xp.cuda.Event(), xp.cuda.Event()
            start.record()
            for _ in range(args.n_steps):
                step()
            end.record()
            end.synchronize()
            ms = xp.cuda.get_elapsed_time(start, end) / args.n_steps
            peak = peak_hook.peak
        finally:
            peak_hook.close()
    return {"framework": "pocket", "model": model, "batch": batch, "precision": precision,
            "savers": bool(args.savers), "ms_per_step": ms, "peak_bytes": int(peak),
            "tracked_peak_bytes": tracker.total_peak}


def torch_steps(model: str, batch: int, precision: str, args) -> dict:
    import torch

    cuda = args.device.startswith("cuda")
    dev = torch.device(args.device if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    net = build_torch(model, channels=args.channels if model == "vgg" else None).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    half = precision == "fp16"
    scaler = torch.amp.GradScaler(dev.type, enabled=half)
    xh, yh = _data(batch, args.image_size)
    x, y = torch.from_numpy(xh).to(dev), torch.from_numpy(yh).to(dev)

    def step():
        with torch.autocast(dev.type, dtype=torch.float16 if cuda else torch.bfloat16,
                            enabled=half):
            loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.n_steps):
            step()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / args.n_steps
        peak = torch.cuda.max_memory_allocated(dev)
    else:
        t0 = time.perf_counter()
        for _ in range(args.n_steps):
            step()
        ms = (time.perf_counter() - t0) * 1e3 / args.n_steps
        peak = 0
    return {"framework": "torch", "model": model, "batch": batch, "precision": precision,
            "ms_per_step": ms, "peak_bytes": int(peak), "tf32": args.tf32}


def steps(args) -> dict:
    fn = pocket_steps if args.framework == "pocket" else torch_steps
    rows = []
    for model in args.models:
        for batch in args.batches:
            for precision in args.precisions:
                try:
                    rows.append(fn(model, batch, precision, args))
                except Exception as e:  # noqa: BLE001 - one failed case must not hide the rest
                    rows.append({"framework": args.framework, "model": model, "batch": batch,
                                 "precision": precision, "error": f"{type(e).__name__}: {e}"})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"framework": args.framework, "device": args.device, "tf32": args.tf32, "rows": rows}


# ----------------------------------------------------------------------------- budget


def budget(args) -> dict:
    from pocket.train.config import load_config, parse_size
    from pocket.train.trainer import Trainer

    rng = np.random.default_rng(0)
    data = args.out / "cifar_synthetic.npz"
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(data, x=rng.integers(0, 256, (2048, 32, 32, 3), dtype=np.uint8),
             y=rng.integers(0, 10, 2048))
    cfg_path = args.out / "vgg_budget.toml"
    cfg_path.write_text(f'[data]\nsource = "npz:{data}"\nprefetch = 2\n[model]\nname = "vgg"\n'
                        '[train]\nepochs = 1\nbatch_size = 256\noptimizer = "sgd"\nlr = 0.05\n')
    cfg = load_config(cfg_path, {"device": args.device, "memory_budget": args.budget,
                                 "out": str(args.out / "vgg_budget_run")})
    limit = parse_size(args.budget)
    r = Trainer(cfg, quiet=True).fit(force=True)
    peak = (r.get("gpu_memory") or {}).get("peak_bytes") or r["memory"]["total"]["peak"]
    from pocket.train import backend

    overhead = backend.GPU_CONTEXT_RESERVE + backend.GPU_LIBRARY_RESERVE
    return {"budget_bytes": limit, "pool_peak_bytes": peak, "with_context_bytes": peak + overhead,
            "fits": peak + overhead <= limit, "plan": r["plan"], "steps": r["steps"],
            "seconds": r["seconds"]}


# ----------------------------------------------------------------------------- report


def _load(out: Path, name: str):
    try:
        return json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def combine(out: Path) -> dict:
    res = {"digits": _load(out, "digits"), "budget": _load(out, "budget"), "steps": []}
    pocket, torch = _load(out, "steps_pocket"), _load(out, "steps_torch")
    savers = _load(out, "steps_pocket_savers")
    theirs = {(r["model"], r["batch"], r["precision"]): r
              for r in (torch or {}).get("rows", []) if "error" not in r}
    for r in (pocket or {}).get("rows", []) + (savers or {}).get("rows", []):
        row = dict(r)
        t = theirs.get((r["model"], r["batch"], r["precision"]))
        if t and "error" not in r:
            row["torch_ms_per_step"] = t["ms_per_step"]
            row["torch_peak_bytes"] = t["peak_bytes"]
            row["step_ratio"] = r["ms_per_step"] / max(t["ms_per_step"], 1e-9)
            row["memory_ratio"] = (r["peak_bytes"] / t["peak_bytes"]) if t["peak_bytes"] else None
        res["steps"].append(row)
    tests = out / "gpu_tests.xml"
    if tests.exists():
        import xml.etree.ElementTree as ET

        root = ET.parse(tests).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        if suite is not None:
            res["gpu_tests"] = {k: int(suite.get(k, 0))
                                for k in ("tests", "failures", "errors", "skipped")}
    res["targets"] = TARGETS
    return res


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(res: dict) -> str:
    lines = ["# pocket GPU check", ""]
    t = res.get("gpu_tests")
    if t:
        lines += [f"gpu tests: {t['tests']} run, {t['failures']} failed, {t['errors']} errors, "
                  f"{t['skipped']} skipped", ""]
    d = res.get("digits")
    if d:
        lines += ["| digits run | test accuracy | vs CPU (points) | first losses max abs diff |",
                  "|---|---|---|---|"]
        for key, r in d.items():
            if "error" in r:
                lines.append(f"| {key} | error: {r['error']} | | |")
                continue
            acc = r["test"].get("accuracy")
            lines.append(f"| {key} | {_f(acc and 100 * acc, '{:.2f}%')} | "
                         f"{_f(r.get('accuracy_points_vs_cpu'), '{:+.2f}')} | "
                         f"{_f((r.get('losses_vs_cpu') or {}).get('max_abs'), '{:.2e}')} |")
        lines.append("")
    if res.get("steps"):
        lines += ["| model | batch | precision | savers | pocket ms/step | torch ms/step | ratio | "
                  "pocket peak MiB | torch peak MiB | mem ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["steps"]:
            if "error" in r:
                lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | "
                             f"{'on' if r.get('savers') else 'off'} | error: {r['error']} "
                             "| | | | | |")
                continue
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['precision']} | "
                f"{'on' if r.get('savers') else 'off'} | {_f(r['ms_per_step'])} | "
                f"{_f(r.get('torch_ms_per_step'))} | {_f(r.get('step_ratio'))} | "
                f"{_mib(r['peak_bytes'])} | {_mib(r.get('torch_peak_bytes'))} | "
                f"{_f(r.get('memory_ratio'))} |")
        lines.append("")
    b = res.get("budget")
    if b:
        lines += [f"budget {_mib(b['budget_bytes'])} MiB: pool peak {_mib(b['pool_peak_bytes'])} "
                  f"MiB, with CUDA context and workspaces {_mib(b['with_context_bytes'])} MiB: "
                  f"{'fits' if b['fits'] else 'DOES NOT FIT'}", ""]
    tg = res.get("targets", TARGETS)
    lines.append(f"targets: accuracy within {tg['accuracy_points']} points of the CPU run, step "
                 f"ratio <= {tg['step_ratio']}, memory ratio <= {tg['memory_ratio']} (savers on)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.step == "report":
        res = combine(args.out)
        write_json(args.out, "gpu_check", res)
        (args.out / "gpu_check.md").write_text(markdown(res))
        print(markdown(res))
        return 0
    if args.step == "digits":
        write_json(args.out, "digits", digits(args))
    elif args.step == "steps":
        name = f"steps_{args.framework}" + ("_savers" if args.savers else "")
        write_json(args.out, name, steps(args))
    else:
        write_json(args.out, "budget", budget(args))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

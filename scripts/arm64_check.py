"""Check that pocket.infer gives the same results on 64-bit ARM (Raspberry Pi 4/5) as on x86-64.

    python scripts/arm64_check.py make DIR                      # x86, full pocket install
    arm64-env python scripts/arm64_check.py verify DIR          # emulated Cortex-A72 (Pi 4)
    PI=pi5 arm64-env python scripts/arm64_check.py verify DIR   # emulated Cortex-A76 (Pi 5)

`make` builds small models with random weights (a CNN with BN + maxpool + linear head, a ResNet
with residual adds and stride-2 stages, and the edge zoo at 32x32 and small widths: MobileNetV2,
MobileNetV3-Small, EfficientNet-B0-style MBConv, ShuffleNetV2, SqueezeNet, plus a depthwise
3x3/5x5 stack that keeps every depthwise conv int8), writes training checkpoints, exports each
to fp32 and int8 `.bin` with `pocket.export.app.export`, runs `pocket.infer.Engine` on fixed
inputs at several batch sizes and saves the inputs and outputs to DIR (one .npz a model,
precision and batch), with a manifest.json.

`verify` needs only numpy + numba (it imports `pocket.infer` and `pocket.formats`, never the
trainer or the exporter). It loads the same `.bin` files, runs the same inputs, and checks:

- per node, on this machine: every value the graph computes is exposed as an extra graph
  output (an in-memory copy of the graph with more outputs; the engine keeps those buffers
  alive and skips fusions across them), and each node's output is compared with
  pocket.formats.reference's op run on the engine's own inputs of that node: int8 outputs bit
  for bit, float32 ones within 1e-4 relative. This is the check that holds whatever the
  machine's float32 rounding: a 1-ulp difference upstream cannot fail it.
- against x86: fp32 models' final outputs within 1e-5 relative (|a - b| <= 1e-5 * max|b|) of
  x86's. int8 models: every int8 value whose inputs are all int8 (back to the quantized graph
  input) must equal x86's bit for bit; an int8 value downstream of a float32 layer (the fp32
  layers of a mixed int8 model) can differ by a code where the two machines' float32 sums
  round differently before a quantize: those are counted and reported, not failed on, and so is
  the final output of such a model (within 1e-5 when it is pure int8). The plain model (with
  the fused paths) must give the same final output as the tapped one.
- as a second opinion on the same machine, the whole graph against pocket.formats.reference
  (fp32 and pure int8 models; 1e-4 relative).
- coverage: the routes table (Engine.routes()) and the prepared steps must show the depthwise
  routes at the padded-plane geometries (3x3 and 5x5, stride 1 and 2: kernels_dw's padded
  planes, or on ARM kernels_dwcl's channels innermost, all of int8 and float32's small maps),
  and every vectorized activation of kernels_fp32.act_run (relu, clip, hardswish, hardsigmoid,
  sigmoid, silu) on a float32 layer; a shortfall fails the run.

The Numba cache is a fresh temporary folder unless `--cache DIR` is given (so x86's cache, or an
earlier ARM run's, is never reused). `--models a,b` checks only those. Exit status 0: all
matched; 1: a mismatch; 2: an error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BATCHES = (1, 7, 20)  # 20 >= 16 takes the int8 linear's float32-GEMM route, 1 and 7 the int8 dot
FP32_RTOL = 1e-5
REF_RTOL = 1e-4  # engine vs the NumPy reference interpreter (different summation order)
SEED = 1234
# Run from a checkout: the repository root (this file's parent's parent) is importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# 32x32 keeps four map sizes (32, 16, 8, 4) in the edge models: their depthwise convs get
# interiors (the vector loops) as well as borders, at stride 1 and 2
EDGE = (3, 32, 32)
# name: (zoo model or a builder below, input shape, outputs, kwargs)
MODELS = {
    "cnn": ("cnn", (3, 16, 16), 10, {"channels": [4, 8], "hidden": [16]}),
    "resnet": ("resnet", (3, 8, 8), 5, {"channels": [4, 8, 8]}),
    # 64 channels into a 3x3 conv on 16x16: the fp32 engine's Winograd path (64 tiles a call)
    "wide": ("cnn", (3, 16, 16), 10, {"channels": [64, 64], "hidden": [16]}),
    # relu6, 3x3 depthwise at stride 1 and 2 (fp32 and int8), residual adds
    "mnv2": ("mobilenet_v2", EDGE, 5, {"width_mult": 0.25}),
    # hardswish, hardsigmoid SE gates and their broadcast mul, 5x5 depthwise (float32 in int8:
    # hardswish keeps them so)
    "mnv3": ("mobilenet_v3_small", EDGE, 5, {"width_mult": 0.25}),
    # SiLU, sigmoid SE gates, 5x5 depthwise at stride 1 and 2
    "effnet": ("efficientnet_b0", EDGE, 5, {"width_mult": 0.25, "depth_mult": 0.34}),
    # channel split (slice), concat, channel shuffle
    "shufnet": ("shufflenet_v2", EDGE, 5, {"width_mult": 0.5}),
    # fire modules (concat of a 1x1 and a 3x3 expand), 3x3/2 max pools
    "sqznet": ("squeezenet", EDGE, 5, {"width_mult": 0.25}),
    # int8 5x5 depthwise at stride 1 and 2 (the zoo's carry hardswish or SiLU: float32 there)
    "dwstack": ("dw_stack", (3, 24, 24), 5, {}),
}
# What the run as a whole must reach (see _coverage): the padded-plane depthwise kernels,
# (dtype, "kxk/stride"), and the activations act_run vectorizes, on float32 layers.
DW_NEEDED = {(d, g) for d in ("f32", "i8") for g in ("3x3/1", "3x3/2", "5x5/1", "5x5/2")}
ACT_NEEDED = {"relu", "clip", "hardswish", "hardsigmoid", "sigmoid", "silu"}


def dw_stack(input_shape, num_outputs, *, rng=None):
    """1x1 conv, then depthwise 5x5/1 (ReLU), 5x5/2 (ReLU6) and 3x3/2 (none), GAP, linear:
    every depthwise conv here fuses its activation in int8."""
    from pocket.train import nn
    from pocket.train.nn_vision import ReLU6

    c = 16
    return nn.Sequential(
        nn.Conv2d(input_shape[0], c, 1, rng=rng), nn.ReLU(),
        nn.Conv2d(c, c, 5, 1, 2, groups=c, rng=rng), nn.ReLU(),
        nn.Conv2d(c, c, 5, 2, 2, groups=c, rng=rng), ReLU6(),
        nn.Conv2d(c, c, 3, 2, 1, groups=c, rng=rng),
        nn.GlobalAvgPool2d(), nn.Flatten(), nn.Linear(c, num_outputs, rng=rng))


# --------------------------------------------------------------------------- helpers


def _inputs(shape, batch: int, model: str) -> np.ndarray:
    rng = np.random.default_rng([SEED, batch, sum(map(ord, model))])
    return rng.standard_normal((batch, *shape)).astype(np.float32)


def _with_taps(container) -> list[str]:
    """The container's graph with every computed value also a graph output (in memory)."""
    from pocket.formats.ir import Graph

    g = container.graph
    taps = [v for n in g.nodes for v in n.outputs if v not in g.outputs]
    container.graph = Graph(dict(g.inputs), [*g.outputs, *taps], list(g.nodes), dict(g.params),
                            dict(g.metadata))
    container.graph.validate()
    return taps


# float32 ops whose result depends on the order of a sum (a machine's BLAS, its vector width,
# FMA contraction): the same inputs can round differently on another machine
_ORDER_DEPENDENT = {"conv2d", "linear", "global_avgpool", "avgpool2d", "batchnorm", "softmax",
                    "layernorm", "matmul"}


def _exact_values(graph) -> set[str]:
    """The values that must be equal bit for bit on any machine: those with no float32 sum of
    machine-dependent order upstream (an int8 layer's sum is exact integer arithmetic, and its
    float32 output one rounding of acc * m, as are add, mul, relu, quantize...). A value
    downstream of a float32 conv/linear/pool sum is not: that sum may round differently, and a
    quantize after it then moves a code."""
    infos = graph.validate()
    exact = set(graph.inputs) | set(graph.params)
    for n in graph.nodes:
        order = n.op in _ORDER_DEPENDENT and n.attrs.get("x_scale") is None and any(
            infos[o].dtype == "f32" for o in n.outputs)
        if not order and all(i in exact for i in n.inputs):
            exact.update(n.outputs)
    return exact - set(graph.inputs) - set(graph.params)


def _rel(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    err = float(np.abs(a64 - b64).max(initial=0.0))
    scale = float(np.abs(b64).max(initial=0.0))
    return err, err / scale if scale else err


def _per_node(c, env: dict[str, np.ndarray], where: str) -> tuple[int, float, list[str]]:
    """Each node of the container's graph against formats.reference's op on the engine's own
    inputs of that node (env: every value, the tapped run's): int8 outputs bit for bit, float
    ones within REF_RTOL. -> (nodes checked, worst float relative error, failures)."""
    from pocket.formats import ops, reference  # noqa: F401 - importing it registers the ops

    failures, worst, checked = [], 0.0, 0
    for node in c.graph.nodes:
        args = [env[i] if i in env else np.asarray(c.tensors[i]) for i in node.inputs]
        kw = {}
        # as formats.reference.run: an int8 layer, or an int8 weight under a float input
        weight_i8 = len(args) > 1 and args[1].dtype == np.int8
        if (ops.OPS[node.op].int8 == ops.INT8_LAYER
                and node.attrs.get("x_scale") is not None) or weight_i8:
            qp = c.quant(node.inputs[1])
            kw["w_scale"] = None if qp is None else np.asarray(qp["scale"], np.float32)
        want = np.asarray(ops.impl("reference", node.op)(node.attrs, *args, **kw))
        got = env[node.outputs[0]]
        checked += 1
        if got.shape != want.shape or got.dtype != want.dtype:
            failures.append(f"{where} node {node.name} ({node.op}): engine {got.shape} "
                            f"{got.dtype}, reference {want.shape} {want.dtype}")
        elif got.dtype.kind in "iu":
            if not np.array_equal(got, want):
                bad = int(np.count_nonzero(got != want))
                failures.append(f"{where} node {node.name} ({node.op}): int8 differs from the "
                                f"reference at {bad} of {got.size} (max |diff| "
                                f"{np.abs(got.astype(int) - want.astype(int)).max()})")
        else:
            _, rel = _rel(got, want)
            worst = max(worst, rel)
            if not rel <= REF_RTOL:
                failures.append(f"{where} node {node.name} ({node.op}): relative error {rel:.3g}"
                                f" against the reference > {REF_RTOL:g}")
    return checked, worst, failures


def _coverage(eng) -> tuple[set, set, dict]:
    """(padded depthwise kernels reached as (dtype, "kxk/s"), activations of float32 layers,
    route counts) of a planned engine, from its routes table."""
    from pocket.infer import kernels_dw as kd

    dw, acts, counts = set(), set(), {}
    by_name = {n.name: n for n in eng.graph.nodes}
    for r in eng.routes():
        counts[r["route"]] = counts.get(r["route"], 0) + 1
        geo = r["geometry"]
        if r["route"].startswith("conv_depthwise"):
            (kh, kw), (sh, sw), (dh, dw_) = geo["kernel"], geo["stride"], geo["dilation"]
            if kd.padded_fast(kh, kw, sh, sw, dh, dw_):
                dw.add((r["dtype"], f"{kh}x{kw}/{sh}"))
        if r["dtype"] == "f32":
            acts.add(by_name[r["node"]].attrs.get("activation", "none"))
    infos = eng.graph.validate()
    for n in eng.graph.nodes:  # stand-alone activations (kernels_fp32.unary: act_run too)
        if n.op in ACT_NEEDED and infos[n.outputs[0]].dtype == "f32":
            acts.add(n.op)
    return dw, acts, counts


def _check_run(path: Path, name: str, kind: str, batches, where_prefix: str = ""):
    """Tapped and plain engines on every batch, the per-node check, and coverage.
    -> (per batch {value: array} of the tapped run, per batch plain final outputs, the
    tapped graph's exact int8 values, summary dict, failures)."""
    from pocket.formats.container import read_container
    from pocket.infer import Engine

    failures: list[str] = []
    tapped, plain = {}, {}
    summary = {"nodes": 0, "worst_node_rel": 0.0}
    with read_container(path, expect_kind="model") as c:
        exact = _exact_values(c.graph)
        finals = list(c.graph.outputs)
        with Engine(c, max_batch=max(batches)) as eng:
            summary["dw"], summary["acts"], summary["routes"] = _coverage(eng)
            for b in batches:
                plain[b] = {o: np.array(v) for o, v in
                            eng.run_all(_inputs_of(name, b), copy=True).items()}
        _with_taps(c)
        with Engine(c, max_batch=max(batches)) as eng:
            for b in batches:
                x = _inputs_of(name, b)
                env = {k: np.array(v) for k, v in eng.run_all(x, copy=True).items()}
                env[next(iter(c.graph.inputs))] = x
                where = f"{where_prefix}{name} {kind} b{b}"
                n, worst, fails = _per_node(c, env, where)
                summary["nodes"] += n
                summary["worst_node_rel"] = max(summary["worst_node_rel"], worst)
                failures += fails
                for o in finals:
                    if not np.array_equal(plain[b][o], env[o]):
                        _, rel = _rel(plain[b][o], env[o])
                        # fusions change float32 rounding, never int8 codes
                        if plain[b][o].dtype.kind in "iu" or not rel <= FP32_RTOL:
                            failures.append(f"{where} '{o}': plain model differs from the "
                                            f"tapped one (relative {rel:.3g})")
                tapped[b] = env
    return tapped, plain, exact, finals, summary, failures


_X: dict = {}  # the inputs, by (model, batch): make draws them, verify loads them


def _inputs_of(name: str, b: int) -> np.ndarray:
    return _X[name, b]


def _machine() -> dict:
    import numba

    info = {"machine": platform.machine(), "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__,
            "numba_cpu_name": numba.config.CPU_NAME or "host",
            "qemu_cpu": os.environ.get("QEMU_CPU", "-")}
    try:
        import llvmlite.binding as ll

        info["llvm_host_cpu"] = ll.get_host_cpu_name()
    except Exception as e:  # noqa: BLE001 - only informative
        info["llvm_host_cpu"] = f"? ({e})"
    try:
        text = Path("/proc/cpuinfo").read_text()
        names = [ln.split(":", 1)[1].strip() for ln in text.splitlines()
                 if ln.lower().startswith(("model name", "cpu part"))]
        info["proc_cpuinfo"] = names[0] if names else "?"
    except OSError:
        info["proc_cpuinfo"] = "?"
    return info


def _summary_line(name: str, kind: str, s: dict, seconds: float) -> str:
    routes = ", ".join(f"{k} {v}" for k, v in sorted(s["routes"].items()))
    dw = " ".join(sorted(g for d, g in s["dw"] if d == ("i8" if kind == "int8" else "f32")))
    return (f"  routes: {routes}; padded depthwise: {dw or '-'}; f32 activations: "
            f"{', '.join(sorted(s['acts'])) or '-'}; {s['nodes']} node checks, worst float "
            f"{s['worst_node_rel']:.2e}; {seconds:.1f} s")


def _coverage_failures(dw: set, acts: set) -> list[str]:
    out = []
    if DW_NEEDED - dw:
        out.append("coverage: padded depthwise kernels not reached: "
                   + ", ".join(f"{d} {g}" for d, g in sorted(DW_NEEDED - dw)))
    if ACT_NEEDED - acts:
        out.append("coverage: act_run activations not reached on a float32 layer: "
                   + ", ".join(sorted(ACT_NEEDED - acts)))
    return out


def _pick(names: str | None) -> list[str]:
    if not names:
        return list(MODELS)
    picked = [n for n in names.split(",") if n]
    unknown = [n for n in picked if n not in MODELS]
    if unknown:
        raise SystemExit(f"Error: unknown model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(MODELS)}")
    return picked


# --------------------------------------------------------------------------- make (x86)


def _build(name: str):
    from pocket.train import models

    zoo, shape, n_out, kwargs = MODELS[name]
    rng = np.random.default_rng([SEED, sum(map(ord, name))])
    build = dw_stack if zoo == "dw_stack" else models.ZOO.get(zoo) or getattr(models, zoo)
    return build(shape, n_out, rng=rng, **kwargs), rng


def make(out_dir: Path, names: list[str]) -> int:
    from pocket.export.app import export
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"made_on": _machine(), "batches": list(BATCHES), "models": {}}
    failures: list[str] = []
    for name in names:
        t0 = time.perf_counter()
        shape = MODELS[name][1]
        model, rng = _build(name)
        model.eval()
        graph, params = trace(model, shape, {"task": "classification"})
        # Non-trivial BN statistics and affine, so the folded weights are not the conv's.
        for node in graph.nodes:
            if node.op == "batchnorm":
                w, b, mean, var = node.inputs[1:]
                c = params[w].shape
                params[w] = rng.uniform(0.5, 1.5, c).astype(np.float32)
                params[b] = (0.1 * rng.standard_normal(c)).astype(np.float32)
                params[mean] = (0.2 * rng.standard_normal(c)).astype(np.float32)
                params[var] = rng.uniform(0.5, 2.0, c).astype(np.float32)
        calib = rng.standard_normal((64, *shape)).astype(np.float32)
        ckpt = out_dir / f"{name}.ckpt"
        save_checkpoint(ckpt, graph=graph, state=params, optimizer_state={},
                        meta={"note": "arm64_check random weights"}, calib_x=calib)
        entry: dict = {"input_shape": list(shape), "ops": sorted({n.op for n in graph.nodes})}
        for b in BATCHES:
            _X[name, b] = _inputs(shape, b, name)
            np.save(out_dir / f"{name}.x.b{b}.npy", _X[name, b])
        for kind, int8 in (("fp32", False), ("int8", True)):
            bin_path = out_dir / f"{name}.{kind}.bin"
            # A huge layer-error bound: random weights, and the point is the int8 arithmetic.
            rep = export(ckpt, bin_path, int8=int8, max_layer_error=1e9 if int8 else None)
            info: dict = {"bin": bin_path.name, "size": rep["size"], "outputs": {}}
            if int8:
                info["int8_layers"] = [r["name"] for r in rep["layers"] if r["int8"]]
                info["fp32_layers"] = rep["layers_fp32"]
            t1 = time.perf_counter()
            tapped, plain, exact, finals, summ, fails = _check_run(bin_path, name, kind, BATCHES,
                                                                   "x86: ")
            failures += fails
            info["exact_int8"] = sum(1 for v in exact if v in tapped[BATCHES[0]]
                                     and tapped[BATCHES[0]][v].dtype.kind in "iu")
            for b in BATCHES:
                keep = {o: plain[b][o] for o in finals}
                keep.update((v, tapped[b][v]) for v in tapped[b]
                            if v not in keep and tapped[b][v].dtype.kind in "iu")
                names_b = sorted(keep)
                np.savez(out_dir / f"{name}.{kind}.b{b}.npz",
                         **{f"t{i}": keep[v] for i, v in enumerate(names_b)})
                info["outputs"][f"b{b}"] = {
                    v: {"key": f"t{i}", "dtype": str(keep[v].dtype), "final": v in finals,
                        "exact": v in exact} for i, v in enumerate(names_b)}
            entry[kind] = info
            print(f"{name} {kind}:" + _summary_line(name, kind, summ,
                                                    time.perf_counter() - t1)[1:])
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        manifest["models"][name] = entry
        n8 = len(entry["int8"]["int8_layers"])
        print(f"{name}: ops {', '.join(entry['ops'])}; int8 layers {n8} "
              f"(fp32: {len(entry['int8']['fp32_layers'])}); "
              f"{entry['int8']['exact_int8']} int8 values exact across machines; "
              f"{entry['seconds']} s")
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {out_dir} ({len(list(out_dir.iterdir()))} files) on {platform.machine()}")
    if failures:
        print(f"FAIL on x86 itself: {len(failures)} mismatch(es):")
        for f in failures[:40]:
            print("  " + f)
        return 1
    return 0


# --------------------------------------------------------------------------- verify (ARM)


def verify(in_dir: Path, names: list[str] | None) -> int:
    manifest = json.loads((in_dir / "manifest.json").read_text())
    t_import = time.perf_counter()
    import numba

    import pocket.infer  # noqa: F401 - the edge import itself is part of the check

    heavy = [m for m in ("onnx", "onnxruntime", "click", "cupy", "torch", "pocket.train",
                         "pocket.export", "pocket.cli") if m in sys.modules]
    t_import = time.perf_counter() - t_import
    info = _machine()
    from pocket.infer import kernels_sdot

    # the ARM dotprod int8 kernels (routes/conv_sdot.py): on a Pi 5, never on a Pi 4 (SIGILL)
    info["int8_sdot"] = kernels_sdot.AVAILABLE
    print("this side: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    print("x86 side: " + ", ".join(f"{k}={v}" for k, v in manifest["made_on"].items()))
    print(f"NUMBA_CACHE_DIR={os.environ.get('NUMBA_CACHE_DIR')}; import pocket.infer "
          f"{t_import:.1f} s; heavy modules loaded: {', '.join(heavy) or 'none'}")
    names = [n for n in (names or manifest["models"]) if n in manifest["models"]]
    batches = manifest["batches"]
    failures: list[str] = []
    dw_all, acts_all = set(), set()
    for name in names:
        entry = manifest["models"][name]
        for b in batches:
            _X[name, b] = np.load(in_dir / f"{name}.x.b{b}.npy")
        for kind in ("fp32", "int8"):
            info_k = entry[kind]
            t0 = time.perf_counter()
            tapped, plain, _, finals, summ, fails = _check_run(in_dir / info_k["bin"], name,
                                                               kind, batches)
            failures += fails
            dw_all |= summ["dw"]
            acts_all |= summ["acts"]
            worst_rel, worst_ref, exact_final, pure = 0.0, 0.0, True, True
            n_exact, n_exact_bad, n_loose, loose_diff = 0, 0, 0, 0
            for b in batches:
                want = info_k["outputs"][f"b{b}"]
                saved = np.load(in_dir / f"{name}.{kind}.b{b}.npz")
                pure &= all(m["exact"] for m in want.values())
                for o, meta in want.items():
                    exp = saved[meta["key"]]
                    got = plain[b][o] if meta["final"] else tapped[b].get(o)
                    where = f"{name} {kind} b{b} '{o}'"
                    if got is None or got.shape != exp.shape or got.dtype != exp.dtype:
                        failures.append(f"{where}: missing or wrong shape/dtype "
                                        f"({None if got is None else (got.shape, got.dtype)})")
                        continue
                    if got.dtype.kind in "iu":
                        same = np.array_equal(got, exp)
                        if meta["exact"]:
                            n_exact += 1
                            if not same:
                                n_exact_bad += 1
                                bad = int(np.count_nonzero(got != exp))
                                failures.append(
                                    f"{where}: int8 values differ from x86 at {bad} of "
                                    f"{got.size} (max |diff| "
                                    f"{np.abs(got.astype(int) - exp.astype(int)).max()})")
                        else:
                            n_loose += 1
                            loose_diff += int(np.count_nonzero(got != exp))
                        continue
                    _, rel = _rel(got, exp)
                    worst_rel = max(worst_rel, rel)
                    exact_final &= bool(np.array_equal(got, exp))
                    strict = kind == "fp32" or pure
                    if strict and not rel <= FP32_RTOL:
                        failures.append(f"{where}: relative error {rel:.3g} > {FP32_RTOL:g}")
                if kind == "fp32" or pure:
                    ref = _whole_reference(in_dir / info_k["bin"], _X[name, b])
                    for o in finals:
                        _, rref = _rel(plain[b][o], ref[o])
                        worst_ref = max(worst_ref, rref)
                        if not rref <= REF_RTOL:
                            failures.append(f"{name} {kind} b{b} '{o}': vs reference "
                                            f"{rref:.3g} > {REF_RTOL:g}")
            line = (f"{name:8s} {kind}: final output max rel err vs x86 {worst_rel:.2e} "
                    f"({'bit-exact' if exact_final else 'not bit-exact'}"
                    f"{'' if kind == 'fp32' or pure else ', downstream of float32 sums: reported only'})")
            if kind == "fp32" or pure:
                line += f", vs reference {worst_ref:.2e}"
            if kind == "int8":
                line += (f"; {n_exact} exact int8 tensors (all batches) vs x86 "
                         f"{'MISMATCH at ' + str(n_exact_bad) if n_exact_bad else 'bit-exact'}")
                if n_loose:
                    line += (f"; {n_loose} downstream of float32 layers: {loose_diff} "
                             f"values differ")
            print(line)
            print(_summary_line(name, kind, summ, time.perf_counter() - t0))
    if set(names) == set(MODELS):
        failures += _coverage_failures(dw_all, acts_all)
    try:
        print(f"numba threading layer: {numba.threading_layer()}, threads {numba.get_num_threads()}")
    except ValueError as e:
        print(f"numba threading layer: ? ({e})")
    if failures:
        print(f"FAIL: {len(failures)} mismatch(es):")
        for f in failures[:40]:
            print("  " + f)
        return 1
    print(f"OK: all outputs match x86 on {info['machine']} ({info['numba_cpu_name']})")
    return 0


def _whole_reference(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    from pocket.formats.container import read_container
    from pocket.formats.reference import run_container

    with read_container(path, expect_kind="model") as c:
        return {k: np.array(v) for k, v in run_container(c, x).items()}


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="x86: build models, export, run, save")
    m.add_argument("dir", type=Path)
    v = sub.add_parser("verify", help="ARM: rerun and compare with the saved outputs")
    v.add_argument("dir", type=Path)
    for a in (m, v):
        a.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)}")
    v.add_argument("--cache", type=Path, default=None,
                   help="NUMBA_CACHE_DIR to use (default: a fresh temporary folder)")
    args = p.parse_args(argv)
    if args.cmd == "make":
        return make(args.dir, _pick(args.models))
    names = _pick(args.models) if args.models else None
    # Before Numba is imported: its cache folder is read at import time.
    if args.cache is not None:
        os.environ["NUMBA_CACHE_DIR"] = str(args.cache)
        return verify(args.dir, names)
    with tempfile.TemporaryDirectory(prefix="arm64-check-numba-") as tmp:
        os.environ["NUMBA_CACHE_DIR"] = tmp
        return verify(args.dir, names)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - report, then a distinct exit status
        import traceback

        traceback.print_exc()
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)

"""Check that pocket.infer gives the same results on 64-bit ARM (Raspberry Pi 4/5) as on x86-64.

    python scripts/arm64_check.py make DIR                      # x86, full pocket install
    arm64-env python scripts/arm64_check.py verify DIR          # emulated Cortex-A72 (Pi 4)
    PI=pi5 arm64-env python scripts/arm64_check.py verify DIR   # emulated Cortex-A76 (Pi 5)

`make` builds small models with random weights (a CNN with BN + maxpool + linear head, and a
ResNet with residual adds and stride-2 stages), writes training checkpoints, exports each to
fp32 and int8 `.bin` with `pocket.export.app.export`, runs `pocket.infer.Engine` on fixed inputs
at several batch sizes and saves the inputs and outputs to DIR as .npy, with a manifest.json.

`verify` needs only numpy + numba (it imports `pocket.infer` and `pocket.formats`, never the
trainer or the exporter). It loads the same `.bin` files, runs the same inputs, and compares:

- fp32 models: every output within 1e-5 relative (|a - b| <= 1e-5 * max|b|) of x86's;
- int8 models: every int8 value the graph computes is exposed as an extra graph output (an
  in-memory copy of the graph with more outputs; the engine then keeps those buffers alive and
  skips the conv+maxpool fusion for them) and must equal x86's bit for bit; the model's final
  output (float32 logits from an int8 linear) is checked with the 1e-5 tolerance and reported
  as bit-exact or not. The plain model (with the fused paths) is run as well.
- as a second opinion on the same machine, the engine against pocket.formats.reference.

The Numba cache is a fresh temporary folder unless `--cache DIR` is given (so x86's cache, or an
earlier ARM run's, is never reused). Exit status 0: all matched; 1: a mismatch; 2: an error.
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

# name: (zoo model, input shape, outputs, kwargs)
MODELS = {
    "cnn": ("cnn", (3, 16, 16), 10, {"channels": [4, 8], "hidden": [16]}),
    "resnet": ("resnet", (3, 8, 8), 5, {"channels": [4, 8, 8]}),
    # 64 channels into a 3x3 conv on 16x16: the fp32 engine's Winograd path (64 tiles a call)
    "wide": ("cnn", (3, 16, 16), 10, {"channels": [64, 64], "hidden": [16]}),
}


# --------------------------------------------------------------------------- helpers


def _key(model: str, kind: str, batch: int, out: str) -> str:
    safe = out.replace("/", "_").replace(":", "_").replace(".", "_")
    return f"{model}.{kind}.b{batch}.{safe}"


def _inputs(shape, batch: int, model: str) -> np.ndarray:
    rng = np.random.default_rng([SEED, batch, sum(map(ord, model))])
    return rng.standard_normal((batch, *shape)).astype(np.float32)


def _with_taps(container):
    """The container's graph with every computed int8 value also a graph output (in memory)."""
    from pocket.formats.ir import Graph

    g = container.graph
    infos = g.validate()
    taps = [v for n in g.nodes for v in n.outputs
            if infos[v].dtype in ("i8", "u8") and v not in g.outputs]
    container.graph = Graph(dict(g.inputs), [*g.outputs, *taps], list(g.nodes), dict(g.params),
                            dict(g.metadata))
    container.graph.validate()
    return taps


def _run_engine(path: Path, x: np.ndarray, taps: bool) -> dict[str, np.ndarray]:
    from pocket.formats.container import read_container
    from pocket.infer import Engine

    c = read_container(path, expect_kind="model")
    try:
        if taps:
            _with_taps(c)
        with Engine(c) as eng:
            return {k: np.array(v) for k, v in eng.run_all(x, copy=True).items()}
    finally:
        c.close()


def _run_reference(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    from pocket.formats.container import read_container
    from pocket.formats.reference import run_container

    with read_container(path, expect_kind="model") as c:
        return {k: np.array(v) for k, v in run_container(c, x, keep_all=True).items()}


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


# --------------------------------------------------------------------------- make (x86)


def make(out_dir: Path) -> int:
    from pocket.export.app import export
    from pocket.train import models
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"made_on": _machine(), "batches": list(BATCHES), "models": {}}
    for name, (zoo, shape, n_out, kwargs) in MODELS.items():
        t0 = time.perf_counter()
        rng = np.random.default_rng([SEED, sum(map(ord, name))])
        model = getattr(models, zoo)(shape, n_out, rng=rng, **kwargs)
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
        for kind, int8 in (("fp32", False), ("int8", True)):
            bin_path = out_dir / f"{name}.{kind}.bin"
            # A huge layer-error bound: random weights, and the point is the int8 arithmetic.
            rep = export(ckpt, bin_path, int8=int8, max_layer_error=1e9 if int8 else None)
            info: dict = {"bin": bin_path.name, "size": rep["size"], "outputs": {}}
            if int8:
                info["int8_layers"] = [r["name"] for r in rep["layers"] if r["int8"]]
                info["fp32_layers"] = rep["layers_fp32"]
            for b in BATCHES:
                x = _inputs(shape, b, name)
                np.save(out_dir / f"{name}.x.b{b}.npy", x)
                outs = _run_engine(bin_path, x, taps=int8)
                plain = _run_engine(bin_path, x, taps=False)
                for o, a in plain.items():
                    if not np.array_equal(a, outs[o]):
                        print(f"note: {name} {kind} b{b}: output '{o}' differs with taps "
                              f"(max abs {np.abs(a - outs[o]).max():.3g})")
                info["outputs"][f"b{b}"] = {}
                for o, a in outs.items():
                    k = _key(name, kind, b, o)
                    np.save(out_dir / f"{k}.npy", a)
                    info["outputs"][f"b{b}"][o] = {"file": f"{k}.npy", "dtype": str(a.dtype),
                                                   "shape": list(a.shape)}
            entry[kind] = info
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        manifest["models"][name] = entry
        n8 = len(entry["int8"]["int8_layers"])
        taps = len(entry["int8"]["outputs"][f"b{BATCHES[0]}"]) - 1
        print(f"{name}: ops {', '.join(entry['ops'])}; int8 layers {n8} "
              f"(fp32: {', '.join(entry['int8']['fp32_layers']) or 'none'}); "
              f"{taps} int8 intermediate values tapped; {entry['seconds']} s")
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {out_dir} ({len(list(out_dir.iterdir()))} files) on {platform.machine()}")
    return 0


# --------------------------------------------------------------------------- verify (ARM)


def _rel(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    err = float(np.abs(a64 - b64).max(initial=0.0))
    scale = float(np.abs(b64).max(initial=0.0))
    return err, err / scale if scale else err


def verify(in_dir: Path) -> int:
    manifest = json.loads((in_dir / "manifest.json").read_text())
    t_import = time.perf_counter()
    import numba

    import pocket.infer  # noqa: F401 - the edge import itself is part of the check

    heavy = [m for m in ("onnx", "onnxruntime", "click", "cupy", "torch", "pocket.train",
                         "pocket.export", "pocket.cli") if m in sys.modules]
    t_import = time.perf_counter() - t_import
    info = _machine()
    print("this side: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    print("x86 side: " + ", ".join(f"{k}={v}" for k, v in manifest["made_on"].items()))
    print(f"NUMBA_CACHE_DIR={os.environ.get('NUMBA_CACHE_DIR')}; import pocket.infer "
          f"{t_import:.1f} s; heavy modules loaded: {', '.join(heavy) or 'none'}")
    failures: list[str] = []
    for name, entry in manifest["models"].items():
        for kind in ("fp32", "int8"):
            info_k = entry[kind]
            bin_path = in_dir / info_k["bin"]
            t0 = time.perf_counter()
            worst_rel, worst_ref, exact_final, n_taps, taps_ok = 0.0, 0.0, True, 0, True
            for b in manifest["batches"]:
                x = np.load(in_dir / f"{name}.x.b{b}.npy")
                outs = _run_engine(bin_path, x, taps=kind == "int8")
                plain = _run_engine(bin_path, x, taps=False)
                ref = _run_reference(bin_path, x)
                want = info_k["outputs"][f"b{b}"]
                for o, meta in want.items():
                    exp = np.load(in_dir / meta["file"])
                    got = outs.get(o)
                    where = f"{name} {kind} b{b} '{o}'"
                    if got is None or got.shape != exp.shape or got.dtype != exp.dtype:
                        failures.append(f"{where}: missing or wrong shape/dtype "
                                        f"({None if got is None else (got.shape, got.dtype)})")
                        continue
                    final = o in plain
                    if final and not np.array_equal(plain[o], got):
                        failures.append(f"{where}: plain model differs from the tapped one")
                    if got.dtype.kind in "iu":
                        n_taps += 1
                        if not np.array_equal(got, exp):
                            taps_ok = False
                            bad = int(np.count_nonzero(got != exp))
                            failures.append(f"{where}: int8 values differ from x86 at {bad} of "
                                            f"{got.size} (max |diff| "
                                            f"{np.abs(got.astype(int) - exp.astype(int)).max()})")
                        if not np.array_equal(got, ref[o]):
                            failures.append(f"{where}: int8 values differ from the reference")
                        continue
                    _, rel = _rel(got, exp)
                    worst_rel = max(worst_rel, rel)
                    exact_final &= bool(np.array_equal(got, exp))
                    if not rel <= FP32_RTOL:
                        failures.append(f"{where}: relative error {rel:.3g} > {FP32_RTOL:g}")
                    _, rref = _rel(got, ref[o])
                    worst_ref = max(worst_ref, rref)
                    if not rref <= REF_RTOL:
                        failures.append(f"{where}: vs reference {rref:.3g} > {REF_RTOL:g}")
            line = (f"{name:7s} {kind}: final output max rel err vs x86 {worst_rel:.2e} "
                    f"({'bit-exact' if exact_final else 'not bit-exact'}), vs reference "
                    f"{worst_ref:.2e}")
            if kind == "int8":
                line += (f"; {n_taps} int8 tensors (all batches) "
                         f"{'bit-exact' if taps_ok else 'MISMATCH'}")
            print(f"{line}; {time.perf_counter() - t0:.1f} s")
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


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("make", help="x86: build models, export, run, save").add_argument("dir", type=Path)
    v = sub.add_parser("verify", help="ARM: rerun and compare with the saved outputs")
    v.add_argument("dir", type=Path)
    v.add_argument("--cache", type=Path, default=None,
                   help="NUMBA_CACHE_DIR to use (default: a fresh temporary folder)")
    args = p.parse_args(argv)
    if args.cmd == "make":
        return make(args.dir)
    # Before Numba is imported: its cache folder is read at import time.
    if args.cache is not None:
        os.environ["NUMBA_CACHE_DIR"] = str(args.cache)
        return verify(args.dir)
    with tempfile.TemporaryDirectory(prefix="arm64-check-numba-") as tmp:
        os.environ["NUMBA_CACHE_DIR"] = tmp
        return verify(args.dir)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - report, then a distinct exit status
        import traceback

        traceback.print_exc()
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)

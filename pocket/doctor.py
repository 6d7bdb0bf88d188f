"""`pocket doctor`: what this machine offers pocket, and what to do about what it lacks.

`doctor(model)` returns a JSON-able dict (the fields are documented in README.md, "pocket
doctor"); `render(report)` is its text form. Nothing here needs an extra: each probe that finds
a package missing says so instead of failing. One line of advice per problem found.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import re
import sys
from pathlib import Path

from pocket import __version__

# x86 /proc/cpuinfo flags and ARM Features that decide the engine's routes or its speed
X86_FEATURES = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni")
ARM_FEATURES = ("asimd", "asimddp", "asimdhp", "fphp", "i8mm", "sve", "bf16")


# --------------------------------------------------------------------------- CPU

def _cpuinfo(text: str | None = None) -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo (plus ARM's global ones)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in info:
            info[key.strip()] = value.strip()
    return info


def cpu_report(cpuinfo_text: str | None = None, machine: str | None = None) -> dict:
    machine = (machine or platform.machine()).lower()
    info = _cpuinfo(cpuinfo_text)
    arm = machine in ("aarch64", "arm64") or machine.startswith("armv")
    flags = set((info.get("Features") if arm else info.get("flags", "")).split()) if info else set()
    wanted = ARM_FEATURES if arm else X86_FEATURES
    model = (info.get("model name") or info.get("Model") or info.get("Hardware")
             or platform.processor() or "unknown")
    if arm and "CPU part" in info and model == "unknown":
        model = f"ARM CPU part {info['CPU part']}"
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return {"arch": machine, "model": model, "cores": os.cpu_count() or 1, "usable_cores": usable,
            "features": {f: f in flags for f in wanted}, "known": bool(flags)}


# --------------------------------------------------------------------------- engine, Numba

def engine_report() -> dict:
    """The route families the engine's planner will pick on this host (see infer/engine.py)."""
    from pocket.infer import kernels_fma, kernels_sdot, kernels_smull, kernels_tile, kernels_vnni

    int8 = ("vnni" if kernels_vnni.AVAILABLE else "sdot" if kernels_sdot.AVAILABLE else
            "smull" if kernels_smull.AVAILABLE else "portable")
    fp32 = "avx512-fma" if kernels_fma.AVAILABLE else "blas"
    return {"int8_route": int8, "fp32_route": fp32,
            "int8_detail": ("AVX-512 VNNI vpdpbusd kernels" if int8 == "vnni" else
                            "ARM dotprod sdot kernels (convs of groups 1, linears), portable ones elsewhere"
                            if int8 == "sdot" else
                            "ARM NEON smull/sadalp kernels (convs of groups 1), portable ones elsewhere"
                            if int8 == "smull" else
                            "float32 BLAS GEMMs of the int8 codes and portable Numba kernels"),
            "fp32_detail": ("AVX-512 FMA GEMM tiles" if fp32 == "avx512-fma" else
                            "portable GEMM tiles (1x1 and small convs), NumPy's BLAS GEMMs and "
                            "portable Numba kernels" if kernels_tile.AVAILABLE else
                            "NumPy's BLAS GEMMs and portable Numba kernels"),
            "switches": {k: os.environ[k] for k in ("POCKET_INT8_VNNI", "POCKET_INT8_SDOT", "POCKET_FP32_FMA",
                                                    "POCKET_FP32_TILE")
                         if k in os.environ}}


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def numba_report() -> dict:
    import llvmlite
    import numba

    from pocket.infer import kernels_fp32

    dispatcher = next((v for v in vars(kernels_fp32).values()
                       if getattr(v, "_cache", None) is not None
                       and hasattr(v._cache, "_cache_path")), None)
    # NOTE: Numba picks the folder per source file (next to it when writable, else a user-wide
    # one, or under NUMBA_CACHE_DIR); kernels_fp32's is where the engine's kernels go
    folder = Path(dispatcher._cache._cache_path) if dispatcher is not None else None
    out = {"version": numba.__version__, "llvmlite": llvmlite.__version__,
           "cache_dir_env": os.environ.get("NUMBA_CACHE_DIR"),
           "cache_dir": str(folder) if folder else None, "cache_exists": False,
           "cache_writable": False, "cached_kernels": 0, "disable_jit": bool(numba.config.DISABLE_JIT),
           "threads": int(numba.config.NUMBA_NUM_THREADS)}
    if folder is not None:
        out["cache_exists"] = folder.is_dir()
        out["cache_writable"] = os.access(_nearest_existing(folder), os.W_OK)
        # one .nbi index per compiled kernel; every pocket/infer source file caches here
        out["cached_kernels"] = sum(1 for _ in folder.glob("*.nbi")) if folder.is_dir() else 0
    return out


# --------------------------------------------------------------------------- extras

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def _declared_extras() -> dict[str, list[str]]:
    """extra -> requirement strings: from the checkout's pyproject.toml when running from one,
    else from the installed distribution's metadata."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        try:
            import tomllib
        except ImportError:  # Python 3.10
            tomllib = None
        if tomllib is not None:
            try:
                data = tomllib.loads(pyproject.read_text())
                if data.get("project", {}).get("name") == "pocketnn":
                    return dict(data["project"].get("optional-dependencies", {}))
            except (OSError, ValueError):
                pass
    try:
        meta = md.metadata("pocketnn")
    except md.PackageNotFoundError:
        return {}
    extras: dict[str, list[str]] = {e: [] for e in meta.get_all("Provides-Extra") or []}
    for req in meta.get_all("Requires-Dist") or []:
        m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if m and m.group(1) in extras:
            extras[m.group(1)].append(req.split(";")[0].strip())
    return extras


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def extras_report() -> dict:
    declared = _declared_extras()

    def packages(extra: str, seen: frozenset = frozenset()) -> list[str]:
        out = []
        for req in declared.get(extra, []):
            m = _NAME.match(req)
            if not m:
                continue
            if m.group(1).lower() == "pocketnn":
                for sub in (m.group(2) or "").split(","):
                    if sub.strip() and sub.strip() not in seen:
                        out += packages(sub.strip(), seen | {extra})
            else:
                out.append(m.group(1))
        return sorted(set(out))

    report = {}
    for extra in sorted(declared):
        pkgs = packages(extra)
        versions = {p: _installed(p) for p in pkgs}
        report[extra] = {"installed": all(versions.values()), "packages": versions}
    return report


# --------------------------------------------------------------------------- GPU

def _fp16_fast(major: int, minor: int) -> bool:
    # NOTE: native fp16 arithmetic came with sm_53; consumer Pascal (sm_61) runs it at 1/64 of
    # fp32, so only sm_53/60/62 and Volta (sm_70) onwards, with tensor cores, are fast
    return (major, minor) in ((5, 3), (6, 0), (6, 2)) or major >= 7


def gpu_report() -> dict:
    out: dict = {"cupy": None, "cuda_runtime": None, "driver": None, "devices": [], "error": None}
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+([\d.]+)", text)
        out["driver"] = m.group(1) if m else None
    except OSError:
        pass
    if importlib.util.find_spec("cupy") is None:
        out["error"] = "CuPy is not installed"
        return out
    try:
        from pocket.train.backend import cuda_inventory  # the one module that imports CuPy

        inv = cuda_inventory()
        out.update(cupy=inv["cupy"], cuda_runtime=inv["cuda_runtime"], driver_cuda=inv["driver_cuda"])
        for dev in inv["devices"]:
            major, minor = dev["major"], dev["minor"]
            out["devices"].append({"index": dev["index"], "name": dev["name"],
                                   "memory_bytes": dev["memory_bytes"],
                                   "compute_capability": f"{major}.{minor}",
                                   "fp16_fast": _fp16_fast(major, minor)})
    except Exception as e:  # noqa: BLE001 - any CUDA failure is a finding to report, not a crash
        out["error"] = f"{type(e).__name__}: {e}"
    return out


# --------------------------------------------------------------------------- a model

def model_report(path: str) -> dict:
    from pocket.errors import PocketError
    from pocket.infer import Engine

    out: dict = {"path": path, "loads": False, "runs_here": False, "error": None}
    try:
        with Engine(path, interpret_first=True) as eng:
            ops = sorted({n.op for n in eng.graph.nodes})
            int8 = any(n.op == "quantize" or "x_scale" in n.attrs for n in eng.graph.nodes)
            out.update(loads=True, runs_here=True, ops=ops, precision="int8" if int8 else "fp32",
                       input_shape=list(eng.input_shape), task=eng.task,
                       file_bytes=os.path.getsize(path))
    except PocketError as e:
        out["error"] = str(e)
    return out


# --------------------------------------------------------------------------- all of it

def _advice(r: dict) -> list[str]:
    tips = []
    cpu, eng, nb, gpu = r["cpu"], r["engine"], r["numba"], r["gpu"]
    if not cpu["known"]:
        tips.append("CPU features unknown (no /proc/cpuinfo): the engine takes its portable routes")
    elif cpu["arch"] in ("x86_64", "amd64") and not cpu["features"].get("avx2"):
        tips.append("this x86 CPU has no AVX2: every kernel runs without wide vectors; expect "
                    "several times the latency of a recent CPU")
    if cpu["arch"] in ("aarch64", "arm64") and cpu["known"] and not cpu["features"].get("asimddp"):
        tips.append("no ARM dot-product instructions (asimddp): int8 runs on widening multiplies "
                    "(smull), only somewhat faster than fp32 here; try both with pocket infer MODEL "
                    "--bench 100")
    if cpu["features"].get("avx512_vnni") and eng["int8_route"] != "vnni":
        tips.append("the CPU has AVX-512 VNNI but the int8 kernels are off "
                    "(POCKET_INT8_VNNI=0 or NUMBA_CPU_NAME set): unset it for faster int8")
    if nb["disable_jit"]:
        tips.append("NUMBA_DISABLE_JIT is set: every kernel runs as slow Python; unset it")
    if nb["cache_dir"] and not nb["cache_writable"]:
        tips.append(f"the Numba cache {nb['cache_dir']} is not writable: every start recompiles; "
                    "set NUMBA_CACHE_DIR to a writable folder")
    elif nb["cache_dir"] and nb["cached_kernels"] == 0:
        tips.append("no engine kernels are cached yet: run pocket infer MODEL --warmup once so "
                    "later starts are fast")
    images = r["extras"].get("images")
    if images is not None and not images["installed"]:
        tips.append("Pillow is missing: image inputs need pip install 'pocketnn[images]'")
    onnx = r["extras"].get("onnx")
    if onnx is not None and not onnx["installed"]:
        tips.append("onnx/onnxruntime are missing: ONNX export and compare --onnx need "
                    "pip install 'pocketnn[onnx]'")
    if gpu["cupy"] is None and gpu["driver"]:
        tips.append(f"an NVIDIA driver ({gpu['driver']}) is present but CuPy is not: GPU training "
                    "needs pip install 'pocketnn[gpu]'")
    elif gpu["cupy"] is not None and gpu["error"]:
        tips.append(f"CuPy is installed but CUDA failed ({gpu['error']}): check the driver, or "
                    "train with --device cpu")
    for d in gpu["devices"]:
        if not d["fp16_fast"]:
            tips.append(f"GPU {d['index']} ({d['name']}, sm_{d['compute_capability']}) has slow "
                        "fp16: keep --precision fp32 on it")
    m = r.get("model")
    if m is not None and not m["runs_here"]:
        tips.append(f"{m['path']} will not run here: {m['error']}")
    return tips


def doctor(model: str | None = None) -> dict:
    r = {"pocket": __version__, "python": platform.python_version(),
         "platform": f"{platform.system()} {platform.release()}",
         "executable": sys.executable, "cpu": cpu_report(), "engine": engine_report(),
         "numba": numba_report(), "numpy": _installed("numpy") or __import__("numpy").__version__,
         "extras": extras_report(), "gpu": gpu_report(), "model": None}
    if model is not None:
        r["model"] = model_report(model)
    r["advice"] = _advice(r)
    return r


def render(r: dict) -> str:
    cpu, eng, nb, gpu = r["cpu"], r["engine"], r["numba"], r["gpu"]
    feats = " ".join(f for f, on in cpu["features"].items() if on) or "none known"
    lines = [f"pocket {r['pocket']} on Python {r['python']}, {r['platform']}",
             f"cpu      {cpu['model']} ({cpu['arch']}, {cpu['usable_cores']} of {cpu['cores']} "
             f"cores usable)",
             f"features {feats}",
             f"engine   int8: {eng['int8_route']} ({eng['int8_detail']})",
             f"         fp32: {eng['fp32_route']} ({eng['fp32_detail']})",
             f"numba    {nb['version']} (llvmlite {nb['llvmlite']}), cache {nb['cache_dir']} "
             f"({'writable' if nb['cache_writable'] else 'NOT writable'}, "
             f"{nb['cached_kernels']} cached kernels)"]
    for name, e in r["extras"].items():
        pk = ", ".join(f"{p} {v or 'missing'}" for p, v in e["packages"].items())
        lines.append(f"extra    [{name}] {'installed' if e['installed'] else 'incomplete'}: {pk}")
    if gpu["cupy"] is None:
        lines.append(f"gpu      {gpu['error'] or 'none'}"
                     + (f" (NVIDIA driver {gpu['driver']})" if gpu["driver"] else ""))
    else:
        lines.append(f"gpu      CuPy {gpu['cupy']}, CUDA runtime {gpu['cuda_runtime']}, driver "
                     f"{gpu['driver'] or gpu.get('driver_cuda')}"
                     + (f" ({gpu['error']})" if gpu["error"] else ""))
        for d in gpu["devices"]:
            lines.append(f"         {d['index']}: {d['name']}, {d['memory_bytes'] / 2**30:.1f} GiB, "
                         f"sm_{d['compute_capability']}, fp16 {'fast' if d['fp16_fast'] else 'slow'}")
    m = r.get("model")
    if m is not None:
        if m["runs_here"]:
            lines.append(f"model    {m['path']}: runs here ({m['precision']}, input {m['input_shape']}, "
                         f"ops {', '.join(m['ops'])})")
        else:
            lines.append(f"model    {m['path']}: will NOT run here")
    lines.append("")
    lines += [f"advice: {t}" for t in r["advice"]] or ["no problems found"]
    return "\n".join(lines)

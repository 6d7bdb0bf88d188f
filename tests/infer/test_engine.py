"""The engine end to end: real .bin files, the reference, onnxruntime, memory and errors."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from models import Builder, FakeContainer, cnn_mnist, mlp, quantize_sequential, save_model, to_onnx

from pocket.compare import exact_session_options
from pocket.errors import PocketError
from pocket.formats import reference as ref
from pocket.formats.container import read_container
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph
from pocket.infer import Engine, EngineError, lowering, pools
from pocket.infer import engine as engine_mod


def numba_threads() -> int:
    import numba

    return numba.config.NUMBA_NUM_THREADS


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    rng = np.random.default_rng(0)
    g, p = cnn_mnist(rng)
    x = rng.random((9, 1, 28, 28), dtype=np.float32)
    path = save_model(tmp_path_factory.mktemp("m") / "cnn.bin", g, p)
    gq, pq, qq = quantize_sequential(g, p, x)
    qpath = save_model(tmp_path_factory.mktemp("m") / "cnn8.bin", gq, pq, qq)
    return {"g": g, "p": p, "x": x, "path": path, "qpath": qpath}


def test_fp32_bin_matches_reference(mnist):
    with Engine(mnist["path"], max_batch=4) as eng:
        assert eng.input_shape == (1, 28, 28) and eng.input_dtype == np.float32
        assert eng.labels == [str(i) for i in range(10)] and eng.task == "classification"
        got = eng.run(mnist["x"])  # 9 > max_batch: split into 4 + 4 + 1
        with read_container(mnist["path"]) as c:
            want = ref.run_container(c, mnist["x"])[c.graph.outputs[0]]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(eng.run(mnist["x"][:3]), want[:3], rtol=1e-5, atol=1e-5)


def test_int8_bin_matches_reference_exactly(mnist, int8_route):
    with Engine(mnist["qpath"]) as eng, read_container(mnist["qpath"]) as c:
        want = ref.run_container(c, mnist["x"])[c.graph.outputs[0]]
        assert np.array_equal(eng.run(mnist["x"]), want)
        ops = {n.op for n in eng.graph.nodes}
        assert {"quantize", "conv2d", "maxpool2d", "flatten", "linear"} <= ops
    fp32 = ref.run(mnist["g"], mnist["p"], mnist["x"])[mnist["g"].outputs[0]]
    assert np.abs(want - fp32).max() < 0.1 * np.abs(fp32).max()


def test_matches_onnxruntime(mnist, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    for g, p in (cnn_mnist(rng, softmax=True), (mnist["g"], mnist["p"]), mlp(rng)):
        sess = ort.InferenceSession(to_onnx(g, p), exact_session_options(ort),
                                    providers=["CPUExecutionProvider"])
        x = rng.random((5, *g.inputs["x"].shape[1:]), dtype=np.float32)
        with Engine(save_model(tmp_path / "m.bin", g, p)) as eng:
            np.testing.assert_allclose(eng.run(x), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_weights_are_views_of_the_mmap(mnist):
    with Engine(mnist["path"]) as eng:
        tensors = eng._container.tensors
        for name, w in eng.weights().items():
            assert np.shares_memory(w, tensors[name]) and not w.flags.writeable
        for prep in eng._prep:
            for key in ("w", "w2", "wT"):
                if key in prep:
                    assert any(np.shares_memory(prep[key], t) for t in tensors.values())


@pytest.mark.parametrize("threads", [1, 2])
def test_no_allocation_per_call(mnist, int8_route, threads, tmp_path):
    """run() allocates nothing after its first call at a batch size: the cnn at batch 7 and
    1 (a pooled conv writing the next one's padded images), an MLP at 64 (its linears split
    by rows or channels across the threads), fp32 and int8."""
    g, p = mlp(np.random.default_rng(3))
    mlp_path = save_model(tmp_path / "mlp.bin", g, p)
    mlp_x = np.random.default_rng(4).random((64, 784), dtype=np.float32)
    cases = [(mnist["path"], mnist["x"][:7]), (mnist["qpath"], mnist["x"][:7]),
             (mnist["path"], mnist["x"][:1]), (mlp_path, mlp_x)]
    for path, x in cases:
        with Engine(path, max_batch=64, threads=min(threads, numba_threads())) as eng:
            eng.run(x)
            tracemalloc.start()
            try:
                eng.run(x)
                base, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                for _ in range(50):
                    eng.run(x)
                cur, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            # one (64, 10) f32 output is 2560 bytes; a per-call array would show up in the peak
            assert cur - base < 2048 and peak - base < 8192, (path, cur - base, peak - base)


def test_arena_reuses_dead_buffers(mnist):
    with Engine(mnist["path"], max_batch=8) as eng:
        bufs = list(eng._buffers.values())
        assert eng.arena_bytes < sum(b.nbytes for b in bufs)
        for i, a in enumerate(bufs):  # buffers alive at the same step never share bytes
            for b in bufs[i + 1:]:
                if a.first <= b.last and b.first <= a.last:
                    assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
        y1 = eng.run(mnist["x"][:2])
        kept = eng.run(mnist["x"][:2], copy=True)
        eng.run(mnist["x"][2:4])
        assert not np.array_equal(y1, kept)  # the view was overwritten, the copy was not


def test_errors(mnist, tmp_path, monkeypatch):
    with Engine(mnist["path"]) as eng:
        with pytest.raises(EngineError, match=r"shape \(N, 1, 28, 28\)"):
            eng.run(np.zeros((2, 28, 28), np.float32))
        with pytest.raises(EngineError, match="must be float32"):
            eng.run(np.zeros((2, 1, 28, 28), np.complex64))
    ck = save_model(tmp_path / "c.bin", mnist["g"], mnist["p"], kind="checkpoint")
    with pytest.raises(FormatError, match="model"):
        Engine(ck)
    with read_container(ck) as c, pytest.raises(FormatError, match="model"):
        Engine(c)
    monkeypatch.setattr(engine_mod, "SUPPORTED_OPS", engine_mod.SUPPORTED_OPS - {"maxpool2d", "linear"})
    with pytest.raises(EngineError, match="linear, maxpool2d") as e:
        Engine(mnist["path"])
    assert isinstance(e.value, PocketError)


def test_int8_weight_without_scales_is_rejected(mnist):
    with read_container(mnist["qpath"]) as c:
        fake = FakeContainer(c.graph, dict(c.tensors), {})
        with pytest.raises(FormatError, match="per-output-channel scales"):
            Engine(fake)


def test_threads_and_warmup(mnist):
    with Engine(mnist["path"], threads=1) as eng:
        eng.warmup()
        assert eng.run(mnist["x"][:1]).shape == (1, 10)
    with pytest.raises(EngineError, match="threads"):
        Engine(mnist["path"], threads=10_000)


class _FakeBlas:
    """A threadpoolctl controller stand-in: records the pool sizes it is given."""

    internal_api = "fake"

    def __init__(self):
        self.num_threads, self.sizes = 2, []

    def set_num_threads(self, k):
        self.sizes.append(k)
        self.num_threads = k


@pytest.mark.parametrize("threads", [1, 2, None])
def test_threads_size_the_blas_pool(mnist, monkeypatch, threads):
    """With threadpoolctl, `threads` sets BLAS's pool as well, 1 included (left alone, a
    1-thread engine ran OpenBLAS on every core); None leaves it as it was; a plan of small
    GEMMs on 2+ threads pins it to 1 (pools.spin_policy)."""
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)  # restored after the test
    monkeypatch.setattr(pools, "_SPIN_AT_LAUNCH", None)  # (what the env says, not this process's pool)
    fake = _FakeBlas()
    monkeypatch.setattr(pools, "blas_controllers", lambda: [fake])
    with Engine(mnist["path"], threads=threads) as eng:
        eng.warmup()
        if eng._pinned:
            # its GEMMs on the calling thread, the pool never switched per call
            assert eng._threads > 1 and eng._spinning
            assert set(fake.sizes) == {1} and fake.num_threads == 1 and not eng._blas
        elif threads is None:
            # where the plan calls BLAS (no AVX-512), an engine of 2+ threads shrinks the pool
            # to 1 around its small GEMMs (Engine._serial) and hands back the size it found
            assert set(fake.sizes) <= {1, 2} and fake.num_threads == 2
        else:
            assert fake.sizes[:1] == [threads]
            # only an engine of 2+ threads switches the pool per call (Engine._serial)
            assert bool(eng._blas) == (eng._threads > 1)


def test_openblas_pool_without_threadpoolctl(monkeypatch):
    """The edge install has no threadpoolctl: the engine sizes the OpenBLAS NumPy loaded
    through its own C entry points; threadpoolctl (where installed) reads the same pool."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails as if absent
    found = pools.blas_controllers()
    if not found:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS this process loaded")
    monkeypatch.undo()
    for c in found:  # NumPy's, and any other OpenBLAS loaded by then (SciPy bundles its own)

        def pool(c=c):
            info = [i for i in threadpoolctl.threadpool_info()
                    if os.path.realpath(i["filepath"]) == os.path.realpath(c.filepath)]
            return info[0]["num_threads"]

        before, top = c.num_threads, min(2, os.cpu_count() or 1)
        assert before == pool()
        try:
            for k in (1, top, 1):
                c.set_num_threads(k)
                assert c.num_threads == k == pool()
            pools.blas_setter(c)(top)  # the allocation-free setter Engine._serial calls
            assert pool() == top
        finally:
            c.set_num_threads(before)


def test_blas_small_tells_small_gemm_plans_from_large_ones():
    """The MobileNet-like plans (GEMMs of under 2**24 multiply-adds a sample) pin BLAS and spin;
    a plan whose multiply-adds sit mostly in large GEMMs (a 64-channel 3x3 conv at 56x56: 115M)
    keeps BLAS's pool; a plan with neither conv nor linear has nothing to pin."""
    rng = np.random.default_rng(5)
    g, _ = cnn_mnist(rng)
    assert pools.blas_small(g, {v: i.shape[1:] for v, i in g.validate().items()})
    b = Builder((64, 56, 56), rng)
    b.conv(64, 64, 3, padding=[1, 1], activation="relu")
    b.op("global_avgpool")
    b.op("flatten")
    b.linear(64, 10)
    big = b.graph({"task": "classification"})
    assert not pools.blas_small(big, {v: i.shape[1:] for v, i in big.validate().items()})
    b = Builder((8,), rng)
    b.op("relu")
    g = b.graph({})
    assert not pools.blas_small(g, {v: i.shape[1:] for v, i in g.validate().items()})


@pytest.mark.parametrize("split", [False, True])
def test_spinning_openmp_pins_blas_for_large_plans_too(monkeypatch, tmp_path, split):
    """Once OpenMP's threads spin in the process, a plan with large GEMMs pins BLAS's pool as
    well (its threads would compete with the spinning ones), on 2 threads; without spinning it
    keeps the pool, unless its GEMMs can split across Numba's threads (pools.split_gemms):
    then it pins and spins."""
    fake = _FakeBlas()
    monkeypatch.setattr(pools, "blas_controllers", lambda: [fake])
    monkeypatch.setattr(pools, "spin_if_no_blas", lambda graph: False)
    monkeypatch.setattr(pools, "split_gemms", lambda: split)
    rng = np.random.default_rng(6)
    b = Builder((64, 56, 56), rng)
    b.conv(64, 64, 3, padding=[1, 1], activation="relu")
    b.op("flatten")
    g = b.graph({})
    sample = {v: i.shape[1:] for v, i in g.validate().items()}
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(pools, "_SPIN_AT_LAUNCH", None)
    if split:
        assert pools.spin_policy(g, sample, 2) == (True, True)
        assert os.environ["GOMP_SPINCOUNT"] == "100000"
        assert pools.spin_policy(g, sample, 1) == (False, False)
        return
    assert pools.spin_policy(g, sample, 2) == (False, False)
    assert "GOMP_SPINCOUNT" not in os.environ  # large GEMMs: nothing set
    monkeypatch.setenv("GOMP_SPINCOUNT", "100000")
    assert pools.spin_policy(g, sample, 2) == (True, True)
    assert pools.spin_policy(g, sample, 1) == (False, False)


def test_openmp_policy_is_set_before_the_first_engine_starts_the_pool(mnist):
    """A fresh process whose first engine has one thread, on the path that calls BLAS: OpenMP's
    pool starts with that engine (Numba's set_num_threads) and reads its wait policy then, so
    the spinning a later two-thread engine wants is set before it; that engine then plans as
    spinning, and pools.omp_spins() keeps answering what the pool started with, whatever the
    environment says later. (Planned and bound only: planning starts the pool, and compiling
    the portable kernels in a fresh process would take half a minute.)"""
    code = (f"import os, numpy as np\nfrom pocket.infer import Engine, pools\n"
            f"if pools.default_threads() < 2 or not pools.blas_controllers() or not pools.split_gemms():\n"
            f"    print('SKIP'); raise SystemExit\n"
            f"e1 = Engine({str(mnist['path'])!r}, threads=1); e1.bind(1)\n"
            f"assert os.environ.get('GOMP_SPINCOUNT') == '100000'\n"
            f"assert pools._SPIN_AT_LAUNCH is True, pools._SPIN_AT_LAUNCH\n"
            f"e2 = Engine({str(mnist['path'])!r}, threads=2); e2.bind(1)\n"
            f"assert e2._spinning and e2._pinned\n"
            f"os.environ['GOMP_SPINCOUNT'] = '0'\n"
            f"assert pools.omp_spins()\n"
            f"print('OK')\n")
    env = {**os.environ, "POCKET_FP32_FMA": "0", "POCKET_INT8_VNNI": "0"}
    env.pop("GOMP_SPINCOUNT", None)
    env.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.strip() == "SKIP":
        pytest.skip("needs 2 cores and an OpenBLAS whose sgemm pocket finds")
    assert out.stdout.strip() == "OK"


def test_each_engine_runs_on_its_own_thread_count(mnist):
    """Numba keeps one thread count a thread and each engine sets it when it plans: a
    two-thread engine built before a one-thread one takes its count back when it runs (its
    parallel kernels ran on one thread), through run() and run_all() alike."""
    import numba

    if pools.default_threads() < 2:
        pytest.skip("needs 2 cores")
    before = numba.get_num_threads()
    x = np.random.default_rng(3).random((1, 1, 28, 28), dtype=np.float32)
    try:
        e2 = Engine(mnist["path"], threads=2)
        want = e2.run(x).copy()
        e1 = Engine(mnist["path"], threads=1)
        e1.run(x)
        assert numba.get_num_threads() == 1
        np.testing.assert_array_equal(e2.run(x), want)
        assert numba.get_num_threads() == 2
        e1.run(x)
        e2.run_all(x)
        assert numba.get_num_threads() == 2
    finally:
        numba.set_num_threads(before)
        engine_mod._NUMBA_THREADS.n = before


def test_import_pulls_in_no_heavy_modules():
    code = ("import sys, pocket.infer, pocket.infer.app, pocket.infer.inputs\n"
            "bad = [m for m in ('click', 'onnx', 'onnxruntime', 'cupy', 'PIL', 'pocket.train',"
            " 'pocket.export', 'torch') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_first_run_skips_scipy_linalg(mnist):
    """Numba's BLAS probe would import scipy.linalg on the first kernel call (half of a warm
    start); pocket.infer blocks the probe, and Numba's np.dot still works afterwards."""
    code = (f"import sys, numpy as np\nfrom pocket.infer import Engine\n"
            f"Engine({str(mnist['path'])!r}).run(np.zeros((1, 1, 28, 28), np.float32))\n"
            "assert 'scipy.linalg' not in sys.modules\n"
            "import numba\n"
            "a = np.ones((3, 3))\n"
            "assert numba.njit(lambda a: np.dot(a, a))(a).sum() == 27\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_supported_ops_are_the_lowered_ops():
    assert engine_mod.SUPPORTED_OPS == set(lowering.BUILDERS)


def test_interpret_first_answers_without_numba(mnist):
    """A cold process: the first answers come from the reference interpreter with Numba never
    imported; they equal the kernels' (int8 bit for bit), and warmup() switches to the kernels."""
    code = (f"import sys, numpy as np\nfrom pocket.infer import Engine\n"
            f"x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)\n"
            f"e = Engine({str(mnist['qpath'])!r}, threads=1, interpret_first=True)\n"
            "y = e.run(x)\n"
            "assert 'numba' not in sys.modules, 'numba imported'\n"
            "e.warmup()\n"
            "assert 'numba' in sys.modules and e._planned\n"
            "assert np.array_equal(e.run(x), y)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_interpret_first_switches_to_the_kernels(mnist, monkeypatch):
    monkeypatch.setattr(engine_mod, "_INTERPRET_SECONDS", 1e-9)
    x = mnist["x"][:2]
    with Engine(mnist["path"], interpret_first=True) as eng, Engine(mnist["path"]) as planned:
        first = eng.run(x)  # interpreted; it uses up the budget
        assert not eng._planned
        np.testing.assert_allclose(first, planned.run(x), rtol=1e-5, atol=1e-5)
        second = eng.run(x)
        assert eng._planned and np.shares_memory(second, eng._arena)
        np.testing.assert_allclose(second, first, rtol=1e-5, atol=1e-5)
        with pytest.raises(EngineError, match="threads must be between 1 and"):
            Engine(mnist["path"], threads=10_000, interpret_first=True)
    monkeypatch.setattr(engine_mod, "_INTERPRET_SECONDS", 10.0)
    with Engine(mnist["path"], interpret_first=True) as eng:
        eng.run(mnist["x"][:engine_mod._INTERPRET_ROWS])
        assert not eng._planned
        eng.run(mnist["x"][:engine_mod._INTERPRET_ROWS + 1])  # a big batch plans at once
        assert eng._planned


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("n", [1, 16, 33])
def test_input_fed_in_place(int8, n, tmp_path):
    """An MLP's first kernel reads the caller's array itself (no copy into the arena) when it
    is C-ordered, aligned and writeable; other arrays (strided, read-only) are copied. Either
    way each call sees its own input, and the caller's array is left as it was."""
    rng = np.random.default_rng(3)
    g, p = mlp(rng)
    q = None
    if int8:
        g, p, q = quantize_sequential(g, p, rng.random((16, 784), dtype=np.float32))
    path = save_model(tmp_path / "m.bin", g, p, q)
    with Engine(path, max_batch=64) as eng:
        for _ in range(3):
            big = rng.random((2 * n, 784), dtype=np.float32)
            xs = [np.ascontiguousarray(big[:n]), big[::2]]
            ro = xs[0].copy()
            ro.flags.writeable = False
            for x in [*xs, ro]:
                keep = x.copy()
                got = eng.run(x, copy=True)
                assert np.array_equal(x, keep)
                want = ref.run(g, p, x, q)[g.outputs[0]]
                if int8:
                    assert np.array_equal(got, want)
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert eng._bind(n).feed is not None


@pytest.mark.parametrize("int8", [False, True])
def test_chained_linears(int8, tmp_path, monkeypatch):
    """An MLP's linears hand their results on in the next one's packed layout
    (lowering.chained_linears): outputs equal, bit for bit, those of the same engine without
    chains, and the reference's, below and above the rows where chains start; a value that is
    also a graph output (a tap) is left in its own layout."""
    from pocket.infer import kernels_fma, kernels_vnni

    if not (kernels_vnni.AVAILABLE if int8 else kernels_fma.AVAILABLE):
        pytest.skip("this CPU has neither of the chained GEMM routes")
    rng = np.random.default_rng(5)
    g, p = mlp(rng)
    q = None
    if int8:
        g, p, q = quantize_sequential(g, p, rng.random((16, 784), dtype=np.float32))
    linears = [s for s, node in enumerate(g.nodes) if node.op == "linear"]
    path = save_model(tmp_path / "m.bin", g, p, q)
    tapped = Graph(dict(g.inputs), [*g.outputs, g.nodes[linears[0]].outputs[0]], list(g.nodes),
                   dict(g.params), dict(g.metadata))
    tpath = save_model(tmp_path / "t.bin", tapped, p, q)
    xs = [rng.random((n, 784), dtype=np.float32) for n in (1, lowering.CHAIN_ROWS - 1,
                                                             lowering.CHAIN_ROWS, 17, 64)]
    with Engine(path) as eng, Engine(tpath) as teng:
        assert sorted(eng._chained) == linears[:2]
        assert sorted(teng._chained) == linears[1:2]
        got = [eng.run(x, copy=True) for x in xs]
        tapped_got = [teng.run_all(x, copy=True)[g.outputs[0]] for x in xs]
    monkeypatch.setattr(lowering, "chained_linears", lambda eng: {})
    with Engine(path) as eng:
        assert not eng._chained
        plain = [eng.run(x, copy=True) for x in xs]
    for x, a, b, c in zip(xs, got, plain, tapped_got):
        assert np.array_equal(a, b) and np.array_equal(a, c)
        want = ref.run(g, p, x, q)[g.outputs[0]]
        if int8:
            assert np.array_equal(a, want)
        else:
            np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5)

"""pocket.infer: the edge engine. NumPy + Numba only (no ONNX, no trainer, no CuPy).

    import pocket.infer as pi
    model = pi.load("model.bin")                 # -> Model (pocket/infer/api.py)
    pred = model.predict(model.preprocess(raw))  # labels, probs, raw outputs
    y = model.run(x)                             # a new array each call (or out=)

    with pi.Engine("model.bin") as eng:          # the engine itself, zero-copy:
        logits = eng.run(x)                      # x (N, *eng.input_shape); a view the
                                                 # next call overwrites
        with eng.stream(chunk=1) as s:           # a sequence model a step at a time, its
            y_t = s(x[:, t:t + 1])               # ssm state kept between calls (streaming.py)

What lives where, and how an op flows from IR to kernel: `engine.py` (Engine) reads the
container, validates the graph and plans once: it builds the `plan.py` PlanContext (weights,
per-sample shapes, threads, CPU features, the prepared dicts and fusion maps, then views of
the arena) and is the only module that imports the lowerings. For each node,
`lowering.py` PREPARE/BUILDERS dispatch by op name; a conv2d (`lowering_conv.py`) or linear
asks the ordered table of `routes/` (one module per route, `routes/base.py` the Route type and
the geometry its eligibility reads) for the first route eligible for its geometry, dtype and
CPU (POCKET_ROUTE forces one), whose `prepare` runs at load and whose `bind` returns, per batch
size, the kernel calls on arena views; `lowering_common.py` holds what the lowerings and
routes share (scratch budgets, int8 constants). The kernels are Numba functions in
`kernels_fp32.py` (portable), `kernels_int8.py`, `kernels_winograd.py`, and the AVX-512 ones
in `kernels_fma.py`, `kernels_fma_winograd.py` and `kernels_vnni.py`, each compiled in two
twins by `jit.py`; `run()` makes the bound calls. `inputs.py` turns image files and CSV rows
into arrays with the model's preprocessing and `app.py` is what `pocket infer` runs;
`formats/reference.py` is the oracle every kernel is tested against.
"""

import os

# NOTE: the engine alternates Numba's thread pool with the BLAS pool (im2col, then GEMM). With
# OpenMP's default spin-waiting, each pool's idle threads burn the cores the other needs: on a
# 2-core box that made a batch-1 CNN 30x slower. Passive waiting must be chosen before the
# OpenMP runtime starts, i.e. before the first parallel kernel; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


from pocket.infer.api import Model, Prediction, load  # noqa: E402
from pocket.infer.engine import Engine, EngineError  # noqa: E402

__all__ = ["Engine", "EngineError", "Model", "Prediction", "load"]

"""pocket.infer: the edge engine. NumPy + Numba only (no ONNX, no trainer, no CuPy).

    import pocket.infer as pi
    model = pi.load("model.bin")                 # -> Model (pocket/infer/api.py)
    pred = model.predict(model.preprocess(raw))  # labels, probs, raw outputs
    y = model.run(x)                             # a new array each call (or out=)

    with pi.Engine("model.bin") as eng:          # the engine itself, zero-copy:
        logits = eng.run(x)                      # a view the next call overwrites
"""

import os
import sys

# NOTE: the engine alternates Numba's thread pool with the BLAS pool (im2col, then GEMM). With
# OpenMP's default spin-waiting, each pool's idle threads burn the cores the other needs: on a
# 2-core box that made a batch-1 CNN 30x slower. Passive waiting must be chosen before the
# OpenMP runtime starts, i.e. before the first parallel kernel; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _import_numba_math() -> None:
    """Import Numba's array-math registry without SciPy's linear algebra (the engine calls
    this before it first imports its kernels).

    NOTE: Numba's first compile or cache load imports numba.np.arraymath, which probes for BLAS
    by importing scipy.linalg: half a second of a warm start on a small board, for a probe
    whose only use is to route np.convolve/np.correlate through np.dot. With the probe blocked
    they use Numba's own loop (our kernels call neither); np.dot inside njit still imports
    scipy.linalg lazily when it is compiled. Skipped when SciPy's linalg is already loaded.
    """
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    blocked = "scipy.linalg.cython_blas"
    sys.modules[blocked] = None  # `import` of a None entry raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get(blocked, 0) is None:
            del sys.modules[blocked]


from pocket.infer.api import Model, Prediction, load  # noqa: E402
from pocket.infer.engine import Engine, EngineError  # noqa: E402

__all__ = ["Engine", "EngineError", "Model", "Prediction", "load"]

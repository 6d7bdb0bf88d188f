"""pocket.infer: the edge engine. NumPy + Numba only (no ONNX, no trainer, no CuPy).

    from pocket.infer import Engine
    with Engine("model.bin") as eng:
        logits = eng.run(x)          # x (N, *eng.input_shape)
"""

import os

# NOTE: the engine alternates Numba's thread pool with the BLAS pool (im2col, then GEMM). With
# OpenMP's default spin-waiting, each pool's idle threads burn the cores the other needs: on a
# 2-core box that made a batch-1 CNN 30x slower. Passive waiting must be chosen before the
# OpenMP runtime starts, i.e. before the first parallel kernel; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pocket.infer.engine import Engine, EngineError  # noqa: E402

__all__ = ["Engine", "EngineError"]

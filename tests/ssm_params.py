"""Random state-space layer parameters for the ssm tests (stable poles, odd sizes)."""

from __future__ import annotations

import numpy as np

from pocket.formats.ops_ssm import SSM_PARAMS


def ssm_params(rng, h: int, s: int, bidirectional: bool = False, dtype=np.float64) -> dict:
    dirs = 2 if bidirectional else 1
    p = {
        "log_dt": np.log(rng.uniform(0.01, 0.3, h)),
        "log_a_re": np.log(rng.uniform(0.2, 0.8, (h, s))),
        "a_im": rng.normal(0.0, 3.0, (h, s)),
        "b_re": rng.normal(size=(h, s)),
        "b_im": rng.normal(size=(h, s)),
        "c_re": rng.normal(size=(dirs, h, s)),
        "c_im": rng.normal(size=(dirs, h, s)),
        "d": rng.normal(size=h),
    }
    return {k: p[k].astype(dtype) for k in SSM_PARAMS}

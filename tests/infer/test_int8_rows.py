"""int8 linears over (N, ..., in) (issue 24): the 2-D int8 routes on the N * ... rows, bit for
bit against formats/reference.py (itself checked by loops in tests/formats/test_reference.py),
on every route eligible here (route_fuzz.check forces each in turn: VNNI where the CPU has it,
the portable linear_int8 always; linear_sdot runs in test_sdot_kernels.py)."""

from __future__ import annotations

import itertools

import pytest
import route_fuzz
from models import FakeContainer

from pocket.infer import Engine

CASES = [
    # lead dims, batch, dims (in, out, ...), bias, activation, int8 result
    (lead, batch, dims, bias, act, to_int8)
    for lead, batch, dims, (bias, act, to_int8) in itertools.product(
        [[1], [7], [2, 3]], [1, 3, 17], [[5, 10], [64, 16, 130]],
        [(True, "none", False), (False, "relu", True), (True, "clip", True), (False, "none", True)])
]


@pytest.mark.parametrize("lead,batch,dims,bias,act,to_int8", CASES)
def test_rows_match_the_reference_on_every_route(lead, batch, dims, bias, act, to_int8):
    case = {"kind": "linear", "dtype": "i8", "batch": batch, "threads": 2, "max_batch": batch,
            "split": False, "seed": batch + len(dims), "linears": dims,
            "activation": [act] * (len(dims) - 1), "bias": bias, "to_int8": to_int8, "seq": lead}
    route_fuzz.check(case)


def test_rows_take_the_int8_routes_and_do_not_chain():
    """Two int8 linears over (N, 7, in) back to back: int8 routes (not the fp32 linear_rows),
    and no packed chain between them (its buffers count batch rows, linear_chain)."""
    case = {"kind": "linear", "dtype": "i8", "batch": 17, "seed": 3, "linears": [16, 32, 8],
            "activation": ["relu", "none"], "bias": True, "to_int8": True, "seq": [7]}
    graph, params, quant, _ = route_fuzz.build(case)
    with Engine(FakeContainer(graph, params, quant), max_batch=17) as eng:
        taken = [r["route"] for r in eng.routes()]
        assert len(taken) == 2 and "linear_rows" not in taken, taken
        assert not eng._chained

"""MobileNetV2 (the zoo's, random weights with data-dependent BatchNorm statistics) in int8:
min-max calibration loses most of the signal, --int8-target brings it back to 20 dB by
keeping its most sensitive layers fp32, measured on held-out image-like inputs.

NOTE: a random MobileNetV2 is chaotic (input noise at 40 dB SNR leaves 10 dB at its output),
so layers that quantize at 36-44 dB each cost far more here than in a trained network; the
fallback keeps the early layers (stem, first expansions), whose error all later ones amplify."""

import numpy as np
import pytest
from export_models import smooth_images

from pocket.export.app import export
from pocket.formats import ops, reference
from pocket.formats import quant as Q
from pocket.formats.container import read_container, write_container


def data_dependent_bn(graph, params, x) -> None:
    """Each batchnorm's running stats := its input's batch statistics, as after training."""
    env = {next(iter(graph.inputs)): x, **params}
    for node in graph.nodes:
        if node.op == "batchnorm":
            v = env[node.inputs[0]].astype(np.float64)
            params[node.inputs[3]][...] = v.mean(axis=(0, 2, 3))
            params[node.inputs[4]][...] = v.var(axis=(0, 2, 3)) + 1e-3
        env[node.outputs[0]] = ops.impl("reference", node.op)(
            node.attrs, *(env[i] for i in node.inputs))


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    models = pytest.importorskip("pocket.train.models")
    if "mobilenet_v2" not in models.ZOO:
        pytest.skip("no mobilenet_v2 in the zoo")
    from pocket.train.trace import trace

    rng = np.random.default_rng(0)
    model = models.ZOO["mobilenet_v2"]((3, 32, 32), 10, width_mult=0.35, rng=rng)
    model.eval()
    graph, params = trace(model, (3, 32, 32), {"task": "classification"})
    params = {k: v.copy() for k, v in params.items()}
    for k in params:
        if k.endswith(".bias") and k.replace(".bias", ".running_mean") in params:
            params[k][...] = rng.normal(0, 0.2, params[k].shape)
    x = smooth_images(rng, 48, (3, 32, 32))
    data_dependent_bn(graph, params, x[:8])
    path = tmp_path_factory.mktemp("mnv2") / "m.ckpt"
    write_container(path, kind="checkpoint", graph=graph, tensors={**params, "calib/x": x[:32]},
                    meta={})
    return path, graph, params, x[32:]


def held_out_sqnr(path, graph, params, x) -> float:
    with read_container(path) as m:
        y = reference.run_container(m, x)[graph.outputs[0]]
    return Q.sqnr_db(reference.run(graph, params, x)[graph.outputs[0]], y)


@pytest.mark.slow
def test_int8_target_brings_mobilenet_v2_to_20_db(mobilenet, tmp_path):
    path, graph, params, x = mobilenet
    plain = export(path, tmp_path / "a.bin", int8=True)
    r = export(path, tmp_path / "b.bin", int8=True, int8_target=20.0, sensitivity_samples=8)
    t = r["int8_target"]
    assert t["met"] and t["reached_db"] >= 20.0
    n = len(r["layers"])
    assert 0 < len(t["layers_fp32"]) < n
    before, after = held_out_sqnr(plain["output"], graph, params, x), held_out_sqnr(
        r["output"], graph, params, x)
    assert before < 12.0 and after > 18.0, (before, after)

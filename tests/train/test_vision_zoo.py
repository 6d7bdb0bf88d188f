"""The edge zoo (train/models_edge.py): parameter counts at the ImageNet configuration against
the published counts, the same function as torchvision's model given the same weights, a few
training steps on digits, and traced graphs that compute what the models compute."""

from __future__ import annotations

import numpy as np
import pytest
from zoo_small import SMALL, randomize_bn

from pocket.formats import reference
from pocket.train import config, models, nn, optim
from pocket.train import functional as F
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import trace

# Published parameter counts (torchvision's model cards), 1000 classes.
PUBLISHED = {"mobilenet_v2": 3_504_872, "resnet18": 11_689_512, "squeezenet": 1_235_496,
             "shufflenet_v2": 2_278_604, "mobilenet_v3_small": 2_542_856,
             "efficientnet_b0": 5_288_548}


def _build(name, shape, classes=10, seed=0, **options):
    return models.build_model({"name": name, **options}, shape, classes,
                              np.random.default_rng(seed))


def _count(model) -> int:
    return sum(int(p.data.size) for p in model.parameters())




@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_at_the_imagenet_configuration(name):
    model = _build(name, (3, 224, 224), 1000)
    assert _count(model) == PUBLISHED[name]


def test_every_zoo_model_is_in_the_config():
    for name in SMALL:
        assert name in models.ZOO and models.INPUT_RANK[name] == 3
    cfg = config.merge({"model": {"name": "mobilenet_v2", "width_mult": 0.5}})
    assert cfg["model"]["width_mult"] == 0.5
    assert set(models.model_options("efficientnet_b0")) == {"width_mult", "depth_mult"}


# torchvision builders with the same small widths as SMALL (at 64x64 every stride is the
# paper's, so the two must compute the same function).
def _torchvision(name):
    tv = pytest.importorskip("torchvision.models")
    if name == "resnet18":
        from torchvision.models.resnet import BasicBlock, ResNet
        m = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10)
        return m, {}
    if name == "squeezenet":
        return tv.squeezenet1_1(num_classes=10), {}
    if name == "mobilenet_v2":
        return tv.mobilenet_v2(num_classes=10, width_mult=0.25), {"width_mult": 0.25}
    if name == "mobilenet_v3_small":
        return tv.mobilenet_v3_small(num_classes=10, width_mult=0.25), {"width_mult": 0.25}
    if name == "shufflenet_v2":
        return tv.shufflenet_v2_x0_5(num_classes=10), {"width_mult": 0.5}
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.34)
    return (EfficientNet(setting, 0.2, stochastic_depth_prob=0.0, num_classes=10),
            {"width_mult": 0.25, "depth_mult": 0.34})


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_function_as_torchvision(name):
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # NOTE: two spinning threads on a busy 2-core box cost 50x
    try:
        _compare_with_torchvision(torch, name)
    finally:
        torch.set_num_threads(threads)


def _compare_with_torchvision(torch, name):
    tmodel, options = _torchvision(name)
    model = _build(name, (3, 64, 64), **options)
    randomize_bn(model, np.random.default_rng(1))
    model.eval()
    tmodel.eval()
    # Parameters, then BN running statistics, pair up in registration order.
    ours = [p for _, p in model.named_parameters()]
    theirs = list(tmodel.parameters())
    assert [tuple(p.shape) for p in ours] == [tuple(p.shape) for p in theirs]
    ours_b = [(m, k) for m in model.modules() if isinstance(m, nn.BatchNorm2d)
              for k in ("running_mean", "running_var")]
    theirs_b = [b for n, b in tmodel.named_buffers() if not n.endswith("num_batches_tracked")]
    assert len(ours_b) == len(theirs_b)
    with torch.no_grad():
        for p, t in zip(ours, theirs):
            t.copy_(torch.from_numpy(np.asarray(p.data)))
        for (m, k), t in zip(ours_b, theirs_b):
            t.copy_(torch.from_numpy(np.asarray(getattr(m, k))))
        x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
        want = tmodel(torch.from_numpy(x)).numpy()
        got = model(Tensor(x)).data
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# The last feature map at 8x8 and at 32x32 input, by the small-input rule of models_edge.py
# (worked by hand: the stem's strides go, then no stride-2 step starts below 4 pixels).
LAST_MAP = {"resnet18": (2, 4), "squeezenet": (2, 6), "mobilenet_v2": (2, 2),
            "mobilenet_v3_small": (2, 2), "shufflenet_v2": (2, 4), "efficientnet_b0": (2, 2)}


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_small_inputs_keep_a_map_and_trace(name, shape):
    model = _build(name, shape, **SMALL[name])
    randomize_bn(model, np.random.default_rng(3))
    model.eval()
    g, params = trace(model, shape)
    x = np.random.default_rng(4).standard_normal((2, *shape)).astype(np.float32)
    with no_grad():
        want = model(Tensor(x)).data
    got = reference.run(g, params, {"input": x}, keep_all=True)
    np.testing.assert_allclose(got["output"], want, rtol=1e-4, atol=1e-5)
    pool = [n for n in g.nodes if n.op == "global_avgpool"][-1]  # the head's, not an SE's
    spatial = g.validate()[pool.inputs[0]].shape[2:]
    side = LAST_MAP[name][shape[1] == 32]
    assert tuple(spatial) == (side, side)


def test_strides_at_224_are_the_papers():
    for name in PUBLISHED:
        g, _ = trace(_build(name, (3, 224, 224), **SMALL[name]).eval(), (3, 224, 224))
        pool = [n for n in g.nodes if n.op == "global_avgpool"][-1]  # the head's, not an SE's
        want = (13, 13) if name == "squeezenet" else (7, 7)
        assert tuple(g.validate()[pool.inputs[0]].shape[2:]) == want, name


def _digits(n=16):
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    return (d.images[:n, None] / 16.0).astype(np.float32), d.target[:n].astype(np.int64)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_few_training_steps_on_digits(name):
    x, y = _digits()
    model = _build(name, (1, 8, 8), **SMALL[name]).train()
    opt = optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = F.cross_entropy(model(Tensor(x)), Tensor(y))
        loss.backward()
        assert not opt.step().skipped
        losses.append(float(loss.data))
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("options, match", [
    ({"name": "mobilenet_v2", "width_mult": 0}, r"width_mult must be a number in \(0, 4\]"),
    ({"name": "efficientnet_b0", "depth_mult": -1.0}, r"depth_mult must be a number"),
    ({"name": "resnet18", "channels": [8, 8]}, r"four stages"),
])
def test_bad_options_are_clear(options, match):
    with pytest.raises(models.ModelError, match=match):
        models.build_model(options, (3, 32, 32), 10, np.random.default_rng(0))


def test_an_image_model_refuses_flat_input():
    with pytest.raises(models.ModelError, match=r"'shufflenet_v2' needs image input"):
        _build("shufflenet_v2", (20,))

"""Hand-built IR graphs with random weights for the export tests (no trainer needed)."""

from __future__ import annotations

import numpy as np

from pocket.formats.ir import Graph, Node, ValueInfo, make_metadata


class Net:
    """A tiny graph builder: each method appends one node and returns its output name."""

    def __init__(self, shape: tuple[int, ...], seed: int = 0, input: str = "input"):
        self.rng = np.random.default_rng(seed)
        self.input = input
        self.inputs = {input: ValueInfo("f32", ("N", *shape))}
        self.nodes: list[Node] = []
        self.params: dict[str, np.ndarray] = {}

    def graph(self, outputs: list[str], **meta) -> Graph:
        infos = {n: ValueInfo("f32", a.shape) for n, a in self.params.items()}
        g = Graph(dict(self.inputs), list(outputs), [Node(n.name, n.op, list(n.inputs),
                                                         list(n.outputs), dict(n.attrs))
                                                    for n in self.nodes], infos,
                  make_metadata(task=meta.pop("task", "classification"), version="test", **meta))
        g.validate()
        return g

    def shape(self, x: str) -> tuple:
        return self.graph([x]).validate()[x].shape

    def op(self, op: str, *inputs: str, name: str | None = None, out: str | None = None,
           **attrs) -> str:
        name = name or f"{op}{len(self.nodes)}"
        out = out or f"{name}:0"
        self.nodes.append(Node(name, op, list(inputs), [out], attrs))
        return out

    def param(self, name: str, a: np.ndarray) -> str:
        self.params[name] = np.asarray(a, np.float32)
        return name

    def conv(self, x: str, o: int, k: int = 3, *, stride=1, padding=1, dilation=1, groups=1,
             bias=True, name=None, out=None, **attrs) -> str:
        name = name or f"conv{len(self.nodes)}"
        c = self.shape(x)[1]
        w = self.param(f"{name}.weight", self.rng.normal(0, np.sqrt(2 / (c // groups * k * k)),
                                                         (o, c // groups, k, k)))
        ins = [x, w] + ([self.param(f"{name}.bias", self.rng.normal(0, 0.1, o))] if bias else [])
        return self.op("conv2d", *ins, name=name, out=out, stride=[stride, stride],
                       padding=[padding, padding], dilation=[dilation, dilation], groups=groups,
                       **attrs)

    def linear(self, x: str, o: int, *, bias=True, name=None, out=None, **attrs) -> str:
        name = name or f"fc{len(self.nodes)}"
        i = self.shape(x)[-1]
        w = self.param(f"{name}.weight", self.rng.normal(0, np.sqrt(2 / i), (o, i)))
        ins = [x, w] + ([self.param(f"{name}.bias", self.rng.normal(0, 0.1, o))] if bias else [])
        return self.op("linear", *ins, name=name, out=out, **attrs)

    def bn(self, x: str, *, name=None, out=None, eps=1e-5) -> str:
        """BatchNorm with random (not identity) statistics, as after real training."""
        name = name or f"bn{len(self.nodes)}"
        c = self.shape(x)[1]
        r = self.rng
        ps = [self.param(f"{name}.weight", r.uniform(0.5, 1.5, c)),
              self.param(f"{name}.bias", r.normal(0, 0.3, c)),
              self.param(f"{name}.running_mean", r.normal(0, 0.3, c)),
              self.param(f"{name}.running_var", r.uniform(0.3, 2.0, c))]
        return self.op("batchnorm", x, *ps, name=name, out=out, eps=eps)


def residual_cnn(seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    """conv-BN-relu stem, a residual block, pooling, dropout, BN1d head: every transform fires."""
    n = Net((1, 8, 8), seed)
    x = n.op("relu", n.bn(n.conv(n.input, 8, name="stem"), name="stem_bn"))
    h = n.op("relu", n.bn(n.conv(x, 8, name="b1c1", bias=False), name="b1bn1"))
    h = n.bn(n.conv(h, 8, name="b1c2"), name="b1bn2")
    h = n.op("relu", n.op("add", x, h, name="b1add"))
    h = n.op("maxpool2d", h, kernel=[2, 2])
    h = n.op("relu", n.bn(n.conv(h, 16, name="c3"), name="bn3"))
    h = n.op("dropout", h, p=0.2)
    h = n.op("flatten", n.op("global_avgpool", h))
    h = n.op("relu", n.bn(n.linear(h, 32, name="fc1"), name="bn4"))
    h = n.op("dropout", h, p=0.5)
    out = n.linear(h, 10, name="head", out="logits")
    labels = [str(i) for i in range(10)]
    return n.graph([out], labels=labels), n.params


def wide_cnn(seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    """Enough weights that the int8 file size is dominated by them (~100k weights)."""
    n = Net((3, 12, 12), seed)
    h = n.op("relu", n.conv(n.input, 16, name="c1"))
    h = n.op("relu", n.bn(n.conv(h, 32, name="c2"), name="bn2"))
    h = n.op("maxpool2d", h, kernel=[2, 2])
    h = n.op("relu", n.conv(h, 64, name="c3"))
    h = n.op("maxpool2d", h, kernel=[2, 2])
    h = n.op("flatten", h)
    h = n.op("relu", n.linear(h, 128, name="fc1"))
    out = n.linear(h, 10, name="fc2", out="logits")
    return n.graph([out], labels=[f"c{i}" for i in range(10)]), n.params


def smooth_images(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Images with spatial structure (blurred noise), closer to real data than white noise."""
    x = rng.normal(0, 1, (n, *shape))
    for ax in (-1, -2):
        x = (x + np.roll(x, 1, ax) + np.roll(x, -1, ax)) / 3
    return (x * 2).astype(np.float32)

"""Small graphs for the engine tests, fp32 and hand-quantized int8, and a way to load them."""

from __future__ import annotations

import numpy as np

from pocket.formats import quant as qm
from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo

_DT = {np.float32: "f32", np.int8: "i8", np.int32: "i32"}


def _info(a: np.ndarray) -> ValueInfo:
    return ValueInfo(_DT[a.dtype.type], tuple(a.shape))


class Builder:
    """Append nodes to a sequential graph; params get random weights from `rng`."""

    def __init__(self, shape, rng, dtype="f32", name="x"):
        self.rng = rng
        self.inputs = {name: ValueInfo(dtype, ("N", *shape))}
        self.nodes: list[Node] = []
        self.params: dict[str, np.ndarray] = {}
        self.last = name

    def param(self, name, a):
        self.params[name] = a
        return name

    def op(self, op, *extra, **attrs):
        i = len(self.nodes)
        out = f"{op}{i}:0"
        self.nodes.append(Node(f"{op}{i}", op, [self.last, *extra], [out], attrs))
        self.last = out
        return out

    def conv(self, c_in, c_out, k, *, groups=1, bias=True, **attrs):
        kh, kw = (k, k) if isinstance(k, int) else k
        i = len(self.nodes)
        fan = c_in // groups * kh * kw
        w = self.param(f"conv{i}.weight", (self.rng.standard_normal((c_out, c_in // groups, kh, kw))
                                           / np.sqrt(fan)).astype(np.float32))
        extra = [w]
        if bias:
            extra.append(self.param(f"conv{i}.bias",
                                    (0.1 * self.rng.standard_normal(c_out)).astype(np.float32)))
        return self.op("conv2d", *extra, groups=groups, **attrs)

    def linear(self, k, o, **attrs):
        i = len(self.nodes)
        w = self.param(f"fc{i}.weight",
                       (self.rng.standard_normal((o, k)) / np.sqrt(k)).astype(np.float32))
        b = self.param(f"fc{i}.bias", (0.1 * self.rng.standard_normal(o)).astype(np.float32))
        return self.op("linear", w, b, **attrs)

    def graph(self, metadata=None) -> Graph:
        g = Graph(dict(self.inputs), [self.last], list(self.nodes),
                  {k: _info(v) for k, v in self.params.items()}, metadata or {})
        g.validate()
        return g


def cnn_mnist(rng, *, softmax=False) -> tuple[Graph, dict]:
    b = Builder((1, 28, 28), rng)
    b.conv(1, 32, 3, padding=[1, 1], activation="relu")
    b.op("maxpool2d", kernel=[2, 2])
    b.conv(32, 64, 3, padding=[1, 1], activation="relu")
    b.op("maxpool2d", kernel=[2, 2])
    b.op("flatten")
    b.linear(3136, 128, activation="relu")
    b.linear(128, 10)
    if softmax:
        b.op("softmax", axis=1)
    return b.graph({"task": "classification", "labels": [str(i) for i in range(10)]}), b.params


def mlp(rng) -> tuple[Graph, dict]:
    b = Builder((784,), rng)
    b.linear(784, 256, activation="relu")
    b.linear(256, 128, activation="relu")
    b.linear(128, 10)
    return b.graph({"task": "classification"}), b.params


def quantize_sequential(graph: Graph, params: dict, calib: np.ndarray):
    """A sequential fp32 graph of conv2d/linear/maxpool2d/flatten -> its int8 twin.

    Activation qparams come from the fp32 reference run on `calib`; every conv/linear writes
    int8 except the last, which writes f32 logits. Returns (graph, params, quant).
    """
    env = ref.run(graph, params, calib, keep_all=True)
    x = next(iter(graph.inputs))
    s, zp = qm.choose_activation_qparams(env[x].min(), env[x].max())
    nodes = [Node("quant_in", "quantize", [x], ["xq"], {"scale": s, "zero_point": zp})]
    qparams, quant, last = {}, {}, "xq"
    compute = [n for n in graph.nodes if n.op in ("conv2d", "linear")]
    for node in graph.nodes:
        a = {k: v for k, v in node.attrs.items() if k not in ("alpha",)}
        out = node.outputs[0] + "q"
        if node.op in ("conv2d", "linear"):
            w_q, w_s = qm.quantize_weights(params[node.inputs[1]])
            qparams[node.inputs[1]] = w_q
            quant[node.inputs[1]] = {"scale": w_s.tolist(), "zero_point": [0] * len(w_s), "axis": 0}
            ins = [last, node.inputs[1]]
            if len(node.inputs) > 2:
                qparams[node.inputs[2]] = qm.quantize_bias(params[node.inputs[2]], s, w_s)
                ins.append(node.inputs[2])
            a.update(x_scale=s, x_zero_point=zp)
            if node is not compute[-1]:
                s, zp = qm.choose_activation_qparams(env[node.outputs[0]].min(),
                                                     env[node.outputs[0]].max())
                a.update(y_scale=s, y_zero_point=zp)
            nodes.append(Node(node.name, node.op, ins, [out], a))
        else:
            nodes.append(Node(node.name, node.op, [last], [out], a))
        last = out
    infos = {k: _info(v) for k, v in qparams.items()}
    g = Graph(dict(graph.inputs), [last], nodes, infos, dict(graph.metadata))
    g.validate()
    return g, qparams, quant


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of a, as the engine's weights are (mapped from the file, or prepared at
    load: routes.base.prepared): given a writable one, Numba compiles a kernel once more."""
    v = a.view()
    v.flags.writeable = False
    return v


class FakeContainer:
    """Stands in for pocket.formats.container's reader where a test needs no file."""

    def __init__(self, graph, tensors, quant=None, kind="model"):
        self.kind, self.graph, self.meta = kind, graph, {}
        self.tensors = {}
        for k, v in tensors.items():
            v = np.array(v)
            v.flags.writeable = False
            self.tensors[k] = v
        self._quant = quant or {}

    def quant(self, name):
        return self._quant.get(name)

    def close(self):
        pass


def save_model(path, graph, tensors, quant=None, kind="model"):
    """Write a real .bin with the container writer."""
    from pocket.formats.container import write_container

    write_container(path, kind=kind, tensors=tensors, graph=graph, quant=quant)
    return path


def two_thread_calls(path, builder, rng, shape, int8: bool, pick) -> tuple[list[str], list]:
    """Builder's graph saved to path (int8: quantize_sequential on two random samples of
    `shape`), run at batch 1 on a 2-thread engine (adaptive threads off) and checked against the
    reference (int8 bit for bit); its conv routes and the bound calls whose kernel name `pick`
    accepts."""
    from pocket.infer.engine import Engine

    g, p, quant = builder.graph(), builder.params, None
    if int8:
        g, p, quant = quantize_sequential(g, p, rng.standard_normal((2, *shape)).astype(np.float32))
    x = rng.standard_normal((1, *shape)).astype(np.float32)
    save_model(path, g, p, quant)
    with Engine(path, max_batch=1, threads=2, adaptive_threads=False) as eng:
        got = eng.run(x, copy=True)
        routes = [r["route"] for r in eng.routes() if r["op"] == "conv2d"]
        calls = [c for c in eng._bound[1].calls if pick(getattr(c.func, "__name__", ""))]
    matches_reference(path, x, got, int8)
    return routes, calls


def matches_reference(path, x, got, int8: bool) -> None:
    """The engine's output `got` for x equals formats/reference.py's on the .bin at path: int8
    bit for bit, fp32 to float32 rounding."""
    from pocket.formats.container import read_container

    with read_container(path) as c:
        want = ref.run_container(c, x)[c.graph.outputs[0]]
    if int8:
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class BindRecorder:
    """Records, while engines bind their calls, which arena region each view and scratch array
    a builder asks for comes from, and for which step (install with monkeypatch before the
    engine's first run at a batch size; see arena_hazards)."""

    def __init__(self, monkeypatch):
        from pocket.infer import lowering
        from pocket.infer.plan import PlanContext

        self.step = -1
        self.made: list[tuple[int, int, int, int, str]] = []  # (plan, step, start, nbytes, region)
        view, region = PlanContext.view, PlanContext.region

        self.plans = []  # (kept alive, so that no later plan reuses an id)

        def rec_view(ctx, v, n):
            a = view(ctx, v, n)
            if v not in ctx.params:
                self.made.append((id(ctx), self.step, a.ctypes.data - ctx.arena.ctypes.data, a.nbytes,
                                  ctx.root[v]))
            return a

        def rec_region(ctx, key, dtype, shape, at=0):
            a = region(ctx, key, dtype, shape, at)
            self.made.append((id(ctx), self.step, a.ctypes.data - ctx.arena.ctypes.data, a.nbytes, key))
            return a

        def at_step(build):
            def bind(ctx, step, node, n):
                self.step = step
                if not any(p is ctx for p in self.plans):
                    self.plans.append(ctx)
                return build(ctx, step, node, n)
            return bind

        monkeypatch.setattr(PlanContext, "view", rec_view)
        monkeypatch.setattr(PlanContext, "region", rec_region)
        for op, build in list(lowering.BUILDERS.items()):
            monkeypatch.setitem(lowering.BUILDERS, op, at_step(build))


def arena_hazards(eng, n: int, rec: BindRecorder) -> list[str]:
    """The arena arguments of engine eng's calls at batch n (bound under rec) whose region is
    not live at the call's step (first <= step <= last): the arena may give those bytes to
    another value or scratch at that step, which that call, or another thread's part of it,
    then writes while the argument is read (s21's SE gate, which the project's partial sums
    overwrote). An argument's region: that of the array its step's builder asked for with the
    same bytes, else one containing them (its slices and reshapes); [] when all are live."""
    base, size = eng._arena.ctypes.data, eng._arena.nbytes
    regions = eng._ctx.buffers
    bound = eng._bound[n]
    found = []
    for call, step in zip(bound.calls, bound.steps):
        arrays = [a for a in (*getattr(call, "args", ()), *getattr(call, "keywords", {}).values())
                  if isinstance(a, np.ndarray) and a.nbytes > 0]
        mine = [(lo, nb, key) for plan, s, lo, nb, key in rec.made if plan == id(eng._ctx) and s == step]
        for a in arrays:
            lo, hi = np.lib.array_utils.byte_bounds(a)
            if not (base <= lo and hi <= base + size):
                continue  # weights, constants, the caller's arrays
            lo, hi = lo - base, hi - base
            keys = ([key for at, nb, key in mine if (at, at + nb) == (lo, hi)]
                    or [key for at, nb, key in mine if at <= lo and hi <= at + nb])
            if keys:
                ok = any(regions[k].first <= step <= regions[k].last for k in keys)
            else:  # (made before the builders ran: the graph's input views)
                ok = any(r.first <= step <= r.last and r.offset <= lo and hi <= r.offset + r.nbytes
                         for r in regions.values())
            if not ok:
                name = getattr(call.func, "__name__", str(call.func))
                found.append(f"step {step} {eng.graph.nodes[step].name}: {name} uses arena bytes "
                             f"[{lo}, {hi}) of {keys or 'no region'}, not live there")
    return found


def to_onnx(graph: Graph, params: dict) -> bytes:
    """A sequential fp32 graph -> ONNX bytes, op for op (Conv, MaxPool, Gemm, Relu, ...)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = []
    for n in graph.nodes:
        a, out = n.attrs, n.outputs[0]
        act = a.get("activation", "none")
        raw = out + "_pre" if act != "none" else out
        if n.op == "conv2d":
            ph, pw = a["padding"]
            nodes.append(helper.make_node("Conv", n.inputs, [raw], strides=a["stride"],
                                          pads=[ph, pw, ph, pw], dilations=a["dilation"],
                                          group=a["groups"]))
        elif n.op == "linear":
            nodes.append(helper.make_node("Gemm", n.inputs, [raw], transB=1))
        elif n.op in ("maxpool2d", "avgpool2d"):
            ph, pw = a["padding"]
            kw = {"count_include_pad": int(a["count_include_pad"])} if n.op == "avgpool2d" else {}
            nodes.append(helper.make_node("MaxPool" if n.op == "maxpool2d" else "AveragePool",
                                          n.inputs, [raw], kernel_shape=a["kernel"],
                                          strides=a.get("stride") or a["kernel"],
                                          pads=[ph, pw, ph, pw], **kw))
        elif n.op == "flatten":
            nodes.append(helper.make_node("Flatten", n.inputs, [raw], axis=1))
        elif n.op == "softmax":
            nodes.append(helper.make_node("Softmax", n.inputs, [raw], axis=a["axis"]))
        elif n.op == "global_avgpool":
            nodes.append(helper.make_node("GlobalAveragePool", n.inputs, [raw]))
        else:
            raise NotImplementedError(n.op)
        if act == "relu":
            nodes.append(helper.make_node("Relu", [raw], [out]))
        elif act != "none":
            raise NotImplementedError(act)
    (name, info), = graph.inputs.items()
    x = helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", *info.shape[1:]])
    y = helper.make_tensor_value_info(graph.outputs[0], TensorProto.FLOAT, ["N", None])
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in params.items()]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def naive_im2col(x, kh, kw, ph, pw, dh, dw, pad):
    """(N, C*kh*kw, H*W) for a stride-1 conv that keeps the size: row (c, i, j) of image b,
    from a padded copy (the reference for the im2col_same kernels)."""
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), pad, np.float64)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    rows = [xp[:, :, i * dh:i * dh + h, j * dw:j * dw + w] for i in range(kh) for j in range(kw)]
    return np.stack(rows, axis=2).reshape(n, c * kh * kw, h * w)

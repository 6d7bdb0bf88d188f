"""The graph IR: every op round-trips and shape-infers; validation names the node and problem."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from pocket.formats import OPS, FormatError, Graph
from pocket.formats.container import read_container, write_container


def conv_out(size, k, s=1, p=0, d=1):
    # The textbook formula, written here rather than taken from ir.py.
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


H, W = 17, 13
H1, W1 = conv_out(H, 3, 2, 1, 1), conv_out(W, 5, 1, 2, 2)  # conv c1
HP, WP = conv_out(H1, 3, 2, 1), conv_out(W1, 3, 2, 1)  # pools

PARAMS = {
    "bn.g": ("f32", [3]), "bn.b": ("f32", [3]), "bn.m": ("f32", [3]), "bn.v": ("f32", [3]),
    "c1.w": ("f32", [8, 3, 3, 5]), "c1.b": ("f32", [8]),
    "c2.w": ("f32", [8, 2, 3, 3]),
    "fc.w": ("f32", [10, 16]), "fc.b": ("f32", [10]),
    "qfc.w": ("i8", [5, 10]), "qfc.b": ("i32", [5]),
    "qc.w": ("i8", [4, 16, 1, 1]),
    "ln.w": ("f32", [HP * WP]), "ln.b": ("f32", [HP * WP]), "mm.w": ("f32", [16, 6]),
    "emb.w": ("f32", [9, 4]), "lut.t": ("i8", [256]),
}

EXPECTED = {  # node output -> (dtype, shape), derived by hand from the formulas above
    "bn": ("f32", ["N", 3, H, W]),
    "c1": ("f32", ["N", 8, H1, W1]),
    "c2": ("f32", ["N", 8, H1, W1]),
    "relu": ("f32", ["N", 8, H1, W1]), "lrelu": ("f32", ["N", 8, H1, W1]),
    "sig": ("f32", ["N", 8, H1, W1]), "tanh": ("f32", ["N", 8, H1, W1]),
    "gelu": ("f32", ["N", 8, H1, W1]), "add": ("f32", ["N", 8, H1, W1]),
    "hsw": ("f32", ["N", 8, H1, W1]), "hsig": ("f32", ["N", 8, H1, W1]),
    "clip": ("f32", ["N", 8, H1, W1]), "silu": ("f32", ["N", 8, H1, W1]),
    "cs": ("f32", ["N", 8, H1, W1]), "mul": ("f32", ["N", 8, H1, W1]),
    "sl": ("f32", ["N", 16, 2]), "qcs": ("i8", ["N", 16, 1, 1]),
    "qlut": ("i8", ["N", 16, 1, 1]),
    "mp": ("f32", ["N", 8, HP, WP]), "ap": ("f32", ["N", 8, HP, WP]),
    "cat": ("f32", ["N", 16, HP, WP]), "drop": ("f32", ["N", 16, HP, WP]),
    "flat": ("f32", ["N", 16 * HP * WP]), "rs": ("f32", ["N", 16, HP * WP]),
    "sm": ("f32", ["N", 16, HP * WP]),
    "gap": ("f32", ["N", 16, 1, 1]), "flat2": ("f32", ["N", 16]), "fc": ("f32", ["N", 10]),
    "q": ("i8", ["N", 10]), "qfc": ("i8", ["N", 5]), "dq": ("f32", ["N", 5]),
    "qgap": ("i8", ["N", 16, 1, 1]), "qc": ("f32", ["N", 4, 1, 1]),
    "qmp": ("i8", ["N", 16, 1, 1]),
    "ln": ("f32", ["N", 16, HP * WP]), "tr": ("f32", ["N", HP * WP, 16]),
    "mm": ("f32", ["N", HP * WP, 6]), "heads": ("f32", ["N", 1, HP * WP, 6]),
    "att": ("f32", ["N", 1, HP * WP, 6]), "emb": ("f32", ["N", 7, 4]),
}


def node(name, op, inputs, **attrs):
    return {"name": name, "op": op, "inputs": inputs, "outputs": [name], "attrs": attrs}


def every_op_graph() -> dict:
    nodes = [
        node("bn", "batchnorm", ["x", "bn.g", "bn.b", "bn.m", "bn.v"], eps=1e-5),
        node("c1", "conv2d", ["bn", "c1.w", "c1.b"], stride=[2, 1], padding=[1, 2],
             dilation=[1, 2]),
        node("c2", "conv2d", ["c1", "c2.w"], padding=1, groups=4),
        node("relu", "relu", ["c2"]),
        node("lrelu", "leaky_relu", ["relu"], alpha=0.1),
        node("sig", "sigmoid", ["lrelu"]),
        node("tanh", "tanh", ["sig"]),
        node("gelu", "gelu", ["tanh"], approximate="tanh"),
        node("hsw", "hardswish", ["gelu"]),
        node("hsig", "hardsigmoid", ["hsw"]),
        node("clip", "clip", ["hsig"], min=-1.0, max=2.5),
        node("silu", "silu", ["clip"]),
        node("cs", "channel_shuffle", ["silu"], groups=4),
        node("add", "add", ["cs", "c1"]),
        node("mul", "mul", ["add", "c1"]),
        node("mp", "maxpool2d", ["mul"], kernel=[3, 3], stride=[2, 2], padding=[1, 1]),
        node("ap", "avgpool2d", ["mul"], kernel=3, stride=2, padding=1, count_include_pad=False),
        node("cat", "concat", ["mp", "ap"], axis=1),
        node("drop", "dropout", ["cat"], p=0.25),
        node("flat", "flatten", ["drop"]),
        node("rs", "reshape", ["flat"], shape=[16, -1]),
        node("sm", "softmax", ["rs"], axis=-1),
        node("sl", "slice", ["sm"], axis=2, start=1, end=3),
        node("gap", "global_avgpool", ["drop"]),
        node("flat2", "flatten", ["gap"]),
        node("fc", "linear", ["flat2", "fc.w", "fc.b"], activation="gelu"),
        node("q", "quantize", ["fc"], scale=0.05, zero_point=-3),
        node("qfc", "linear", ["q", "qfc.w", "qfc.b"], x_scale=0.05, x_zero_point=-3,
             y_scale=0.1, y_zero_point=0, activation="relu"),
        node("dq", "dequantize", ["qfc"], scale=0.1, zero_point=0),
        node("qgap", "quantize", ["gap"], scale=0.02, zero_point=0),
        node("qc", "conv2d", ["qgap", "qc.w"], x_scale=0.02, x_zero_point=0),
        node("qmp", "maxpool2d", ["qgap"], kernel=1),
        node("qcs", "channel_shuffle", ["qgap"], groups=8),
        node("qlut", "lut", ["qgap", "lut.t"]),
        node("ln", "layernorm", ["rs", "ln.w", "ln.b"], eps=1e-5),
        node("tr", "transpose", ["ln"], perm=[0, 2, 1]),
        node("mm", "matmul", ["tr", "mm.w"]),
        node("heads", "reshape", ["mm"], shape=[1, -1, 6]),
        node("att", "attention", ["heads", "heads", "heads"], causal=True),
        node("emb", "embedding", ["ids", "emb.w"]),
    ]
    return {
        "inputs": [{"name": "x", "dtype": "f32", "shape": ["N", 3, H, W]},
                   {"name": "ids", "dtype": "i64", "shape": ["N", 7]}],
        "outputs": ["sm", "dq", "qc", "qmp", "sl", "qcs", "qlut", "att", "emb"],
        "params": {k: {"dtype": d, "shape": s} for k, (d, s) in PARAMS.items()},
        "nodes": nodes,
        "metadata": {"task": "classification", "labels": [str(i) for i in range(5)]},
    }


def test_graph_uses_every_op():
    # every core op; an op family (ops._FAMILIES) may add its own here or test them in
    # tests/formats/test_<family>_*
    from pocket.formats import ops

    family = {op.name for f in ops._FAMILIES for op in f.ENTRIES}
    used = {n["op"] for n in every_op_graph()["nodes"]}
    assert set(OPS) - family <= used <= set(OPS)


def _check_shapes(g: Graph):
    infos = g.validate()
    for name, (dtype, shape) in EXPECTED.items():
        assert (infos[name].dtype, list(infos[name].shape)) == (dtype, shape), name
    assert [list(i.shape) for i in g.output_infos()] == [EXPECTED[o][1] for o in g.outputs]


def test_every_op_shape_inference_and_json_roundtrip():
    g = Graph.from_dict(every_op_graph())
    _check_shapes(g)
    again = Graph.from_json(g.to_json())
    assert again.to_dict() == g.to_dict()
    assert json.loads(g.to_json()) == g.to_dict()
    _check_shapes(again)


def test_every_op_container_roundtrip(tmp_path):
    g = Graph.from_dict(every_op_graph())
    np_dt = {"f32": np.float32, "i8": np.int8, "i32": np.int32}
    tensors = {k: np.ones(s, np_dt[d]) for k, (d, s) in PARAMS.items()}
    write_container(tmp_path / "all.bin", kind="model", graph=g, tensors=tensors,
                    quant={"qfc.w": {"scale": [0.01] * 5, "zero_point": [0] * 5, "axis": 0}})
    with read_container(tmp_path / "all.bin") as c:
        assert c.graph.to_dict() == g.to_dict()
        _check_shapes(c.graph)


def test_defaults_are_filled_in():
    g = Graph.from_dict(every_op_graph())
    c2 = next(n for n in g.nodes if n.name == "c2")
    assert c2.attrs["stride"] == [1, 1] and c2.attrs["dilation"] == [1, 1]
    assert c2.attrs["padding"] == [1, 1] and c2.attrs["activation"] == "none"


# --------------------------------------------------------------------------- validation errors


def broken(fn) -> dict:
    d = copy.deepcopy(every_op_graph())
    fn(d)
    return d


def nd(d, name):
    return next(n for n in d["nodes"] if n["name"] == name)


@pytest.mark.parametrize("fn, match", [
    (lambda d: nd(d, "relu").update(op="swish"), r"node 'relu' \(swish\): unknown op 'swish'"),
    (lambda d: nd(d, "add").update(inputs=["gelu"]), r"node 'add' \(add\): takes 2..2 inputs, got 1"),
    (lambda d: nd(d, "relu").update(inputs=["c2", "c1"]), r"node 'relu'.*takes 1..1"),
    (lambda d: nd(d, "c1").update(inputs=["bn", "c2.w", "c1.b"]), r"node 'c1'.*input channels"),
    (lambda d: d["params"]["fc.w"].update(shape=[10, 15]), r"node 'fc'.*features"),
    (lambda d: d["params"]["c1.b"].update(shape=[7]), r"node 'c1'.*bias"),
    (lambda d: nd(d, "c1")["attrs"].update(stride="2"), r"node 'c1'.*'stride'.*integers"),
    (lambda d: nd(d, "c1")["attrs"].update(stride=[1, 2, 3]), r"node 'c1'.*'stride'"),
    (lambda d: nd(d, "c2")["attrs"].update(groups=True), r"node 'c2'.*'groups'.*integer"),
    (lambda d: nd(d, "c2")["attrs"].update(groups=3), r"node 'c2'.*divisible"),
    (lambda d: nd(d, "lrelu")["attrs"].update(alpha="x"), r"node 'lrelu'.*'alpha'.*number"),
    (lambda d: nd(d, "lrelu")["attrs"].update(alpha=float("nan")), r"node 'lrelu'.*finite"),
    (lambda d: nd(d, "gelu")["attrs"].update(approximate="erf"), r"node 'gelu'.*one of"),
    (lambda d: nd(d, "relu")["attrs"].update(alpha=0.1), r"node 'relu'.*unknown attribute"),
    (lambda d: nd(d, "mp")["attrs"].pop("kernel"), r"node 'mp'.*missing required attribute 'kernel'"),
    (lambda d: nd(d, "rs")["attrs"].update(shape=[7, -1]), r"node 'rs'.*reshape"),
    (lambda d: nd(d, "cat")["attrs"].update(axis=0), r"node 'cat'.*batch"),
    (lambda d: nd(d, "cat")["attrs"].update(axis=4), r"node 'cat'.*axis 4"),
    (lambda d: nd(d, "sm")["attrs"].update(axis=3), r"node 'sm'.*axis"),
    (lambda d: nd(d, "mp")["attrs"].update(kernel=[40, 40]), r"node 'mp'.*output height"),
    (lambda d: nd(d, "relu").update(inputs=["gelu"]), r"node 'relu'.*'gelu' is not"),  # cycle
    (lambda d: nd(d, "relu").update(inputs=["nowhere"]), r"node 'relu'.*'nowhere'"),
    (lambda d: nd(d, "lrelu").update(name="relu"), r"node 'relu'.*duplicate node name"),
    (lambda d: nd(d, "lrelu").update(outputs=["relu"]), r"output 'relu' is already defined"),
    (lambda d: nd(d, "lrelu").update(outputs=["a", "b"]), r"exactly one output"),
    (lambda d: d.update(outputs=["ghost"]), r"graph.outputs: 'ghost'"),
    (lambda d: d["inputs"][0].update(dtype="f64"), r"graph.inputs\[0\].dtype"),
    (lambda d: d["inputs"][0].update(shape=["N", 3, -1, 13]), r"graph.inputs\[0\].shape"),
    (lambda d: d["nodes"][0].update(extra=1), r"graph.nodes\[0\]: unknown field"),
    (lambda d: d["metadata"].update(task="ranking"), r"graph.metadata.task"),
])
def test_validation_errors_name_node_and_problem(fn, match):
    with pytest.raises(FormatError, match=match):
        Graph.from_dict(broken(fn))


@pytest.mark.parametrize("fn, match", [
    (lambda d: nd(d, "q")["attrs"].pop("zero_point"), r"node 'q'.*zero_point"),
    (lambda d: nd(d, "q")["attrs"].update(scale=0.0), r"node 'q'.*'scale' must be a positive"),
    (lambda d: nd(d, "q")["attrs"].update(zero_point=128), r"node 'q'.*\[-128, 127\]"),
    (lambda d: nd(d, "qgap").update(inputs=["q"]), r"node 'qgap'.*quantize reads f32"),
    (lambda d: nd(d, "dq").update(inputs=["fc"]), r"node 'dq'.*dequantize reads i8"),
    (lambda d: nd(d, "qfc").update(inputs=["fc", "qfc.w", "qfc.b"]), r"node 'qfc'.*must be i8"),
    (lambda d: d["params"]["qfc.w"].update(dtype="f32"), r"node 'qfc'.*weight 'qfc.w' must be i8"),
    (lambda d: d["params"]["qfc.b"].update(dtype="f32"), r"node 'qfc'.*bias 'qfc.b' must be i32"),
    (lambda d: nd(d, "qfc")["attrs"].update(activation="gelu"), r"node 'qfc'.*only relu"),
    (lambda d: nd(d, "qfc")["attrs"].pop("x_zero_point"), r"node 'qfc'.*x_zero_point"),
    (lambda d: nd(d, "qfc")["attrs"].update(y_zero_point=300), r"node 'qfc'.*y_zero_point"),
    (lambda d: nd(d, "fc")["attrs"].update(y_scale=0.1), r"node 'fc'.*need 'x_scale'"),
    (lambda d: nd(d, "qc").update(inputs=["gap", "qc.w"]), r"node 'qc'.*must be i8"),
    (lambda d: d["nodes"].append(node("late", "avgpool2d", ["qgap"], kernel=1)),
     r"node 'late'.*avgpool2d runs on f32"),
    (lambda d: d["nodes"].append(node("late", "add", ["qgap", "qgap"])),
     r"node 'late'.*add runs on f32"),
    (lambda d: d["nodes"].append(node("late", "conv2d", ["qgap", "c2.w"])),
     r"node 'late'.*must be f32"),
])
def test_int8_validation(fn, match):
    with pytest.raises(FormatError, match=match):
        Graph.from_dict(broken(fn))


def test_int8_output_dtypes():
    infos = Graph.from_dict(every_op_graph()).validate()
    assert infos["qfc"].dtype == "i8"  # y_scale given: requantized
    assert infos["qc"].dtype == "f32"  # no y_scale: dequantized output
    assert infos["qmp"].dtype == "i8"  # maxpool passes int8 through


def test_param_named_like_input_is_rejected():
    d = every_op_graph()
    d["params"]["x"] = {"dtype": "f32", "shape": [1]}
    with pytest.raises(FormatError, match="'x' is both an input and a param"):
        Graph.from_dict(d)


def _conv_graph(weight_shape, **attrs) -> dict:
    return {"inputs": [{"name": "x", "dtype": "f32", "shape": ["N", 2, 5, 5]}], "outputs": ["y"],
            "params": {"w": {"dtype": "f32", "shape": weight_shape}},
            "nodes": [node("y", "conv2d", ["x", "w"], **attrs)]}


@pytest.mark.parametrize("shape", [["O", 2, 3, 3], [2, 2, "K", 3]])
def test_symbolic_conv_weight_dims_are_format_errors(shape):
    with pytest.raises(FormatError):
        Graph.from_dict(_conv_graph(shape))


def test_huge_integer_float_attr_is_format_error():
    with pytest.raises(FormatError):
        Graph.from_dict(_conv_graph([2, 2, 3, 3], alpha=10**400))

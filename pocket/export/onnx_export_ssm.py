"""ONNX (opset 17) of the state-space family.

`ssm` becomes its equivalent convolution, the kernel computed here from the layer's
parameters (formats/reference_ssm.ssm_kernel, float64, rounded once): Transpose to (N, H, L),
a depthwise Conv with the kernel over the whole window (causal: padding L-1 on the left;
bidirectional: a 2L-1 tap kernel, L-1 either side) with the skip d folded into the tap at lag
0, and Transpose back. The window length is the graph's, so the ONNX model takes exactly that
length (the .bin engine runs the recurrence and takes it too; Engine.stream() takes any).
`glu` is Split + Sigmoid + Mul.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.formats.ops_ssm import SSM_PARAMS
from pocket.formats.reference_ssm import ssm_kernel


def conv_weight(params: dict, length: int, bidirectional: bool) -> np.ndarray:
    """The ONNX Conv weight (H, 1, taps) float32 equal to the layer on a window of `length`."""
    k = ssm_kernel(params, length)  # (D, H, L): K[0] on the past, K[1] on the future
    d = np.asarray(params["d"], np.float64)
    # ONNX Conv is a cross-correlation: tap L-1-j reads x[t - j]
    taps = [k[0][:, ::-1]]
    if bidirectional:
        taps.append(k[1][:, 1:])  # tap L-1+j reads x[t + j]
    w = np.concatenate(taps, axis=1)
    w[:, length - 1] += d + (k[1][:, 0] if bidirectional else 0.0)
    return w[:, None, :].astype(np.float32)


@ops.register("onnx_export", "ssm")
def _ssm(b, n) -> None:
    name, x = n.name, n.inputs[0]
    shape = b.graph.validate()[x].shape  # (N, L, H)
    length, h = int(shape[1]), int(shape[2])
    params = {k: b.params[v] for k, v in zip(SSM_PARAMS, n.inputs[1:])}
    bidir = bool(n.attrs.get("bidirectional", False))
    w = b.const(f"{name}.kernel", conv_weight(params, length, bidir))
    xt = b.node("Transpose", [x], f"{name}/x_nhl", f"{name}/x_nhl", perm=[0, 2, 1])
    pads = [length - 1, length - 1 if bidir else 0]
    yt = b.node("Conv", [xt, w], f"{name}/y_nhl", f"{name}/conv", group=h, pads=pads,
                kernel_shape=[w_len(length, bidir)])
    b.node("Transpose", [yt], n.outputs[0], name, perm=[0, 2, 1])


def w_len(length: int, bidirectional: bool) -> int:
    return 2 * length - 1 if bidirectional else length


@ops.register("onnx_export", "glu")
def _glu(b, n) -> None:
    name, x = n.name, n.inputs[0]
    first, gate = f"{name}/a", f"{name}/b"
    b.nodes.append(b.helper.make_node("Split", [x], [first, gate], name=f"{name}/split",
                                      axis=int(n.attrs.get("axis", -1))))
    sig = b.node("Sigmoid", [gate], f"{name}/sig", f"{name}/sig")
    b.node("Mul", [first, sig], n.outputs[0], name)

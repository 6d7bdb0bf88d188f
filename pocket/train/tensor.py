"""Tensor and define-by-run reverse-mode autograd.

A primitive is a pair of functions `fwd(ctx, *arrays, **attrs) -> array` and
`bwd(ctx, gy) -> tuple of input gradients` (see `primitive`). When any input needs a gradient,
the call records a `Node`: the primitive's backward, the parents (nodes, leaf tensors or None),
and only the arrays the forward chose to `ctx.save`. A node drops its saved arrays right after
its own backward ran, so after `loss.backward()` no activation is alive.
"""

from __future__ import annotations

import contextlib
import weakref

import numpy as np

from pocket.train import backend
from pocket.train.memory import get_tracker

_grad_enabled = [True]


@contextlib.contextmanager
def no_grad():
    """Run without recording a graph (evaluation, optimizer updates)."""
    prev = _grad_enabled[0]
    _grad_enabled[0] = False
    try:
        yield
    finally:
        _grad_enabled[0] = prev


@contextlib.contextmanager
def enable_grad():
    prev = _grad_enabled[0]
    _grad_enabled[0] = True
    try:
        yield
    finally:
        _grad_enabled[0] = prev


def is_grad_enabled() -> bool:
    return _grad_enabled[0]


_save_fp16 = [False]


def set_saved_activations_fp16(enabled: bool) -> bool:
    """Store float32 arrays that nodes save for backward as float16; returns the old value."""
    prev = _save_fp16[0]
    _save_fp16[0] = bool(enabled)
    return prev


@contextlib.contextmanager
def saved_activations_fp16(enabled: bool = True):
    """Within this block, `Node.save` keeps float32 activations as float16 copies (half the
    bytes) and the backward reads them back as float32. Masks, indices and parameters are
    kept as they are."""
    prev = set_saved_activations_fp16(enabled)
    try:
        yield
    finally:
        _save_fp16[0] = prev


# id(float32 array) -> (weakref to it, its float16 copy). An activation is usually saved by
# two nodes (relu keeps its output, the next conv keeps the same array as its input); one
# shared copy keeps the fp16 saving real instead of storing two halves of the same array.
_fp16_copies: dict[int, tuple] = {}


def _fp16_copy(a):
    hit = _fp16_copies.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    half = a.astype(np.float16)
    key = id(a)
    try:
        ref = weakref.ref(a, lambda _r, key=key: _fp16_copies.pop(key, None))
    except TypeError:  # an array type without weakrefs: no sharing, still correct
        return half
    _fp16_copies[key] = (ref, half)
    return half


class Node:
    """One recorded primitive call: what its backward needs, and where gradients go."""

    __slots__ = ("op", "bwd", "parents", "needs", "_saved", "_half", "attrs", "__weakref__")

    def __init__(self, op: str, bwd, parents: tuple, needs: tuple) -> None:
        self.op = op
        self.bwd = bwd
        self.parents = parents  # per input: Node, leaf Tensor, or None
        self.needs = needs  # per input: does it need a gradient
        self._saved: tuple | None = ()
        self._half: tuple | None = None  # per saved array: stored as float16 for float32
        self.attrs: dict = {}

    def save(self, *arrays) -> None:
        tracker = get_tracker()
        if _save_fp16[0]:
            half = tuple(a is not None and a.dtype == np.float32 and not _is_parameter_array(a)
                         for a in arrays)
            if any(half):
                arrays = tuple(_fp16_copy(a) if h else a for a, h in zip(arrays, half))
                self._half = half
        for a in arrays:
            if a is not None and not _is_parameter_array(a):
                tracker.alloc("activations", id(a), a.nbytes)
        self._saved = arrays

    @property
    def saved(self) -> tuple | None:
        """The saved arrays as the forward gave them (float16-stored ones come back float32;
        each read makes a transient float32 copy that lives only inside the backward)."""
        if self._half is None or not self._saved:
            return self._saved
        return tuple(a.astype(np.float32) if h else a for a, h in zip(self._saved, self._half))

    @saved.setter
    def saved(self, arrays) -> None:
        self._saved = arrays
        self._half = None

    def saved_arrays(self) -> tuple:
        return self.saved or ()

    def release(self) -> None:
        """Drop saved arrays and parents; called right after this node's backward."""
        if self._saved:
            tracker = get_tracker()
            for a in self._saved:
                if a is not None and not _is_parameter_array(a):
                    tracker.free("activations", id(a))
        self._saved = None
        self._half = None
        self.parents = None

    def __del__(self) -> None:
        if self._saved:
            self.release()


class _NoRecord:
    """Context for forwards that record nothing: saving is a no-op."""

    __slots__ = ("attrs", "needs")

    def __init__(self, n: int) -> None:
        self.attrs = {}
        self.needs = (False,) * n

    def save(self, *arrays) -> None:
        pass


_param_ids: set[int] = set()


def _is_parameter_array(a) -> bool:
    return id(a) in _param_ids


def _to_array(data, dtype=None, like=None):
    if isinstance(data, Tensor):
        return data.data
    if like is not None:
        xp = backend.get_array_module(like)
        return xp.asarray(data, dtype=dtype or like.dtype)
    xp = backend.get_array_module(data)
    arr = xp.asarray(data, dtype=dtype)
    if dtype is None and arr.dtype == np.float64 and type(data) in (float, list, tuple):
        arr = arr.astype(np.float32)  # Python floats and lists default to float32, like torch
    return arr


class Tensor:
    """An n-d array (NumPy or CuPy) with an optional gradient and the node that made it."""

    __array_priority__ = 1000  # so ndarray + Tensor defers to Tensor.__radd__

    def __init__(self, data, requires_grad: bool = False, dtype=None) -> None:
        self.data = _to_array(data, dtype)
        self.requires_grad = requires_grad
        self.grad = None
        self._node: Node | None = None

    # ---- array-like attributes
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def device(self) -> backend.Device:
        return backend.device_of(self.data)

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def node(self) -> Node | None:
        return self._node

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        g = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({self.data!r}{g})"

    def numpy(self) -> np.ndarray:
        return backend.to_numpy(self.data)

    def item(self) -> float:
        return self.data.item()

    def detach(self) -> Tensor:
        return Tensor(self.data)

    def to(self, device) -> Tensor:
        return Tensor(backend.to_device(self.data, device), requires_grad=self.requires_grad)

    def saved_arrays(self) -> tuple:
        """Arrays the node that produced this tensor keeps for backward (empty once freed)."""
        return self._node.saved_arrays() if self._node is not None else ()

    # ---- autograd
    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's `.grad` (with +=)."""
        if grad is None:
            if self.data.size != 1:
                raise ValueError("backward() without a gradient needs a one-element tensor")
            gy = backend.get_array_module(self.data).ones_like(self.data)
        else:
            gy = _to_array(grad, like=self.data)
        if self._node is None:
            if self.requires_grad:
                _accumulate_leaf(self, gy)
            return
        if self._node._saved is None:
            raise RuntimeError("this graph was already freed by a backward(); "
                               "pass retain_graph=True to the first backward to run it twice")
        run_backward(self._node, gy, retain_graph)

    # ---- operators (defined in functional; imported at the bottom of this module)
    def __add__(self, o):
        return F.add(self, o)

    def __radd__(self, o):
        return F.add(o, self)

    def __sub__(self, o):
        return F.sub(self, o)

    def __rsub__(self, o):
        return F.sub(o, self)

    def __mul__(self, o):
        return F.mul(self, o)

    def __rmul__(self, o):
        return F.mul(o, self)

    def __truediv__(self, o):
        return F.div(self, o)

    def __rtruediv__(self, o):
        return F.div(o, self)

    def __pow__(self, p):
        return F.pow(self, p)

    def __neg__(self):
        return F.neg(self)

    def __matmul__(self, o):
        return F.matmul(self, o)

    def __rmatmul__(self, o):
        return F.matmul(o, self)

    def __getitem__(self, index):
        return F.getitem(self, index)

    def reshape(self, *shape):
        return F.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], tuple | list)
                         else shape)

    def view(self, *shape):
        return self.reshape(*shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        return F.flatten(self, start_dim, end_dim)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], tuple | list):
            axes = tuple(axes[0])
        return F.transpose(self, axes or None)

    @property
    def T(self):
        return F.transpose(self, None)

    def sum(self, axis=None, keepdims: bool = False):
        return F.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims: bool = False):
        return F.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims: bool = False):
        return F.max(self, axis, keepdims)

    def exp(self):
        return F.exp(self)

    def log(self):
        return F.log(self)

    def abs(self):
        return F.abs(self)

    def relu(self):
        return F.relu(self)

    def astype(self, dtype):
        return F.astype(self, dtype)

    def argmax(self, axis=None):
        return Tensor(self.data.argmax(axis=axis))


def _accumulate_leaf(t: Tensor, g) -> None:
    if g.dtype != t.data.dtype:
        g = g.astype(t.data.dtype)
    if g.shape != t.data.shape:
        g = backend.get_array_module(g).broadcast_to(g, t.data.shape)
    if t.grad is None:
        # NOTE: copy, because a backward may hand the same array to several inputs.
        t.grad = g.copy()
    else:
        t.grad += g


def _topological(root: Node) -> list:
    """Nodes reachable from root, each after all its consumers (iterative DFS)."""
    order, seen = [], {id(root)}
    stack = [(root, 0)]
    while stack:
        node, i = stack[-1]
        parents = node.parents
        while i < len(parents) and not (
            isinstance(parents[i], Node) and id(parents[i]) not in seen
        ):
            i += 1
        if i < len(parents):
            stack[-1] = (node, i + 1)
            seen.add(id(parents[i]))
            stack.append((parents[i], 0))
        else:
            stack.pop()
            order.append(node)
    order.reverse()
    return order


def run_backward(root: Node, gy, retain_graph: bool = False) -> None:
    grads = {id(root): gy}
    for node in _topological(root):
        gy = grads.pop(id(node), None)
        if gy is None:
            continue
        gxs = node.bwd(node, gy)
        parents = node.parents
        if not retain_graph:
            node.release()
        for parent, g in zip(parents, gxs):
            if parent is None or g is None:
                continue
            if isinstance(parent, Node):
                prev = grads.get(id(parent))
                grads[id(parent)] = g if prev is None else prev + g
            else:
                _accumulate_leaf(parent, g)


def primitive(op: str, fwd, bwd):
    """Wrap a forward/backward pair into a function of Tensors (positional) and attrs (kw)."""

    def apply(*inputs, **attrs):
        arrays = [t.data for t in inputs]
        record = _grad_enabled[0] and any(t.requires_grad for t in inputs)
        if not record:
            return Tensor(fwd(_NoRecord(len(inputs)), *arrays, **attrs))
        parents = tuple(
            t._node if t._node is not None else (t if t.requires_grad else None) for t in inputs
        )
        ctx = Node(op, bwd, parents, tuple(t.requires_grad for t in inputs))
        out = Tensor(fwd(ctx, *arrays, **attrs))
        out.requires_grad = True
        out._node = ctx
        return out

    apply.__name__ = op
    apply.op = op
    apply.fwd = fwd
    apply.bwd = bwd
    return apply


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if like is not None:
        return Tensor(_to_array(x, like=like.data))
    return Tensor(x)


class Parameter(Tensor):
    """A leaf tensor that a Module owns; counted under "parameters" (and its grad under
    "gradients") in the memory tracker for as long as it lives."""

    def __init__(self, data, requires_grad: bool = True) -> None:
        self._data = None
        self._grad = None
        self._cell = [0]  # id of the current data array, shared with the finalizer
        super().__init__(data, requires_grad=requires_grad)
        weakref.finalize(self, _forget_parameter, id(self), self._cell)

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, arr) -> None:
        tracker = get_tracker()
        if self._data is not None:
            _param_ids.discard(id(self._data))
            tracker.free("parameters", id(self))
        self._data = arr
        self._cell[0] = id(arr)
        _param_ids.add(id(arr))
        tracker.alloc("parameters", id(self), arr.nbytes)

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, g) -> None:
        tracker = get_tracker()
        if self._grad is not None:
            tracker.free("gradients", id(self))
        self._grad = g
        if g is not None:
            tracker.alloc("gradients", id(self), g.nbytes)

    def __repr__(self) -> str:
        return f"Parameter({self._data!r})"


def _forget_parameter(key: int, cell: list) -> None:
    _param_ids.discard(cell[0])
    tracker = get_tracker()
    tracker.free("parameters", key)
    tracker.free("gradients", key)


from pocket.train import functional as F  # noqa: E402  (circular by design: ops need Tensor)

"""Vector-Jacobian-product rules for the ``Gradient`` expansion, one per forward op.

Each rule takes (the expansion, the forward node, the gradients of its outputs (None
where no gradient reaches them), which inputs need a gradient) and returns one gradient
(or None) per input. Inputs outside a rule's differentiable set never need one. Rules
emit nodes through the expansion's helpers (see :mod:`onnxrt_cpu.gradient`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .gradient import _Expansion

import numpy as np
from onnx import TensorProto
from onnxrt.ir import Node

#: the float element types a gradient flows through
FLOAT_TYPES = {TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BFLOAT16}

# Each rule takes (expansion, forward node, gradients of its outputs (None where no
# gradient reaches them), which inputs need a gradient) and returns one gradient (or
# None) per input. Inputs outside a rule's differentiable set never need one.

RULES: dict[str, tuple[tuple[int, ...] | None, Callable]] = {}


def _rule(*ops: str, diff: tuple[int, ...] | None = None):
    def deco(fn):
        for op in ops:
            RULES[op] = (diff, fn)
        return fn

    return deco


def _out_shape(b: _Expansion, n: Node) -> list | None:
    return b.shape(n.outputs[0])


@_rule("Add", "Sum")
def _add(b, n, gouts, need):
    g = gouts[0]
    return [b.unbroadcast(g, _out_shape(b, n), x) if need[i] else None for i, x in enumerate(n.inputs)]


@_rule("Sub")
def _sub(b, n, gouts, need):
    g, ys = gouts[0], _out_shape(b, n)
    a, c = n.inputs
    return [
        b.unbroadcast(g, ys, a) if need[0] else None,
        b.emit("Neg", [b.unbroadcast(g, ys, c)]) if need[1] else None,
    ]


@_rule("Mul")
def _mul(b, n, gouts, need):
    g, ys = gouts[0], _out_shape(b, n)
    a, c = n.inputs
    return [
        b.unbroadcast(b.emit("Mul", [g, c]), ys, a) if need[0] else None,
        b.unbroadcast(b.emit("Mul", [g, a]), ys, c) if need[1] else None,
    ]


@_rule("Div")
def _div(b, n, gouts, need):
    g, ys = gouts[0], _out_shape(b, n)
    a, c = n.inputs
    y = n.outputs[0]
    return [
        b.unbroadcast(b.emit("Div", [g, c]), ys, a) if need[0] else None,
        # d(a/c)/dc = -a/c^2 = -y/c
        b.emit("Neg", [b.unbroadcast(b.emit("Div", [b.emit("Mul", [g, y]), c]), ys, c)]) if need[1] else None,
    ]


@_rule("Pow")
def _pow(b, n, gouts, need):
    g, ys = gouts[0], _out_shape(b, n)
    a, p = n.inputs
    y = n.outputs[0]
    out = [None, None]
    if need[0]:
        pa = p if b.dtype(p) is not None and b.dtype(p) == b.dtype(a) else b.cast_like(p, a)
        pm1 = b.emit("Sub", [pa, b.scalar_like(a, 1.0)])
        d = b.emit("Mul", [pa, b.emit("Pow", [a, pm1])])
        out[0] = b.unbroadcast(b.emit("Mul", [g, d]), ys, a)
    if need[1]:
        # d(a^p)/dp = a^p * log(a), defined where a > 0
        d = b.emit("Mul", [g, b.emit("Mul", [y, b.emit("Log", [a])])])
        d = b.unbroadcast(d, ys, p)
        out[1] = d if b.dtype(p) is not None and b.dtype(p) == b.dtype(a) else b.cast_like(d, p)
    return out


@_rule("Neg")
def _neg(b, n, gouts, need):
    return [b.emit("Neg", [gouts[0]])]


@_rule("Identity")
def _identity(b, n, gouts, need):
    return [gouts[0]]


@_rule("Relu")
def _relu(b, n, gouts, need):
    x = n.inputs[0]
    zero = b.scalar_like(x, 0.0)
    return [b.emit("Where", [b.emit("Greater", [x, zero]), gouts[0], zero])]


@_rule("Sigmoid")
def _sigmoid(b, n, gouts, need):
    x, y = n.inputs[0], n.outputs[0]
    d = b.emit("Mul", [y, b.emit("Sub", [b.scalar_like(x, 1.0), y])])
    return [b.emit("Mul", [gouts[0], d])]


@_rule("Tanh")
def _tanh(b, n, gouts, need):
    x, y = n.inputs[0], n.outputs[0]
    d = b.emit("Sub", [b.scalar_like(x, 1.0), b.emit("Mul", [y, y])])
    return [b.emit("Mul", [gouts[0], d])]


@_rule("Exp")
def _exp(b, n, gouts, need):
    return [b.emit("Mul", [gouts[0], n.outputs[0]])]


@_rule("Log")
def _log(b, n, gouts, need):
    return [b.emit("Div", [gouts[0], n.inputs[0]])]


@_rule("Sqrt")
def _sqrt(b, n, gouts, need):
    y = n.outputs[0]
    return [b.emit("Div", [gouts[0], b.emit("Add", [y, y])])]


@_rule("Reciprocal")
def _reciprocal(b, n, gouts, need):
    y = n.outputs[0]
    return [b.emit("Neg", [b.emit("Mul", [gouts[0], b.emit("Mul", [y, y])])])]


@_rule("Abs")
def _abs(b, n, gouts, need):
    return [b.emit("Mul", [gouts[0], b.emit("Sign", [n.inputs[0]])])]


@_rule("Where", diff=(1, 2))
def _where(b, n, gouts, need):
    g, ys = gouts[0], _out_shape(b, n)
    c, a, e = n.inputs
    zero = b.scalar_like(n.outputs[0], 0.0)
    return [
        None,
        b.unbroadcast(b.emit("Where", [c, g, zero]), ys, a) if need[1] else None,
        b.unbroadcast(b.emit("Where", [c, zero, g]), ys, e) if need[2] else None,
    ]


@_rule("MatMul")
def _matmul(b, n, gouts, need):
    g = gouts[0]
    a, c = n.inputs
    ra, rc = b.rank(a, "MatMul"), b.rank(c, "MatMul")
    sa, sc = b.shape(a), b.shape(c)
    ys = b.shape(n.outputs[0])
    # promote 1-D operands to matrices, as MatMul does, so both rules are matrix products
    a2, sa2 = (a, sa) if ra >= 2 else (b.unsqueeze(a, [0]), [1] + sa)
    c2, sc2 = (c, sc) if rc >= 2 else (b.unsqueeze(c, [1]), sc + [1])
    b.shapes[a2], b.shapes[c2] = sa2, sc2
    # batch dims of the product: the output's leading dims (its last two are m, n, less
    # the one a 1-D operand dropped)
    blen = max(ra, rc, 2) - 2
    tail = 2 if ra >= 2 and rc >= 2 else (0 if ra == 1 and rc == 1 else 1)
    if ys is not None and len(ys) == blen + tail:
        batch = list(ys[:blen])
    else:
        batch = [None] * blen
    gs2 = batch + [sa2[-2], sc2[-1]]
    if ra == 1 and rc == 1:
        g2 = b.emit("Reshape", [g, b.ints([1, 1])])
    elif ra == 1:
        g2 = b.unsqueeze(g, [len(gs2) - 2])
    elif rc == 1:
        g2 = b.unsqueeze(g, [len(gs2) - 1])
    else:
        g2 = g
    out = [None, None]
    if need[0]:
        da = b.emit("MatMul", [g2, b.transpose_last2(c2, len(sc2))])
        da = b.unbroadcast(da, batch + [sa2[-2], sa2[-1]], a2)
        out[0] = da if ra >= 2 else b.reshape_to(da, a)
    if need[1]:
        dc = b.emit("MatMul", [b.transpose_last2(a2, len(sa2)), g2])
        dc = b.unbroadcast(dc, batch + [sc2[-2], sc2[-1]], c2)
        out[1] = dc if rc >= 2 else b.reshape_to(dc, c)
    return out


@_rule("Gemm")
def _gemm(b, n, gouts, need):
    g = gouts[0]
    a, c = n.inputs[0], n.inputs[1]
    bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    ta, tb = n.attr("transA", 0), n.attr("transB", 0)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    ga = g if alpha == 1.0 else b.emit("Mul", [g, b.scalar_like(n.outputs[0], alpha)])
    out = [None, None, None]
    if need[0]:
        # Y = A' B': dA' = g B'^T, and dA = dA'^T when A was transposed
        cb = c if tb else b.emit("Transpose", [c], perm=[1, 0])
        da = b.emit("MatMul", [ga, cb])
        out[0] = b.emit("Transpose", [da], perm=[1, 0]) if ta else da
    if need[1]:
        at = a if ta else b.emit("Transpose", [a], perm=[1, 0])
        dc = b.emit("MatMul", [at, ga])
        out[1] = b.emit("Transpose", [dc], perm=[1, 0]) if tb else dc
    if bias is not None and len(need) > 2 and need[2]:
        gb = g if beta == 1.0 else b.emit("Mul", [g, b.scalar_like(n.outputs[0], beta)])
        out[2] = b.unbroadcast(gb, _out_shape(b, n), bias)
    return out


@_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze", diff=(0,))
def _reshape(b, n, gouts, need):
    return [b.reshape_to(gouts[0], n.inputs[0])] + [None] * (len(n.inputs) - 1)


@_rule("Expand", diff=(0,))
def _expand(b, n, gouts, need):
    return [b.unbroadcast(gouts[0], _out_shape(b, n), n.inputs[0]), None]


@_rule("Transpose")
def _transpose(b, n, gouts, need):
    perm = n.attr("perm")
    if perm is None:  # a reversal undoes itself
        return [b.emit("Transpose", [gouts[0]])]
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return [b.emit("Transpose", [gouts[0]], perm=inv)]


def _reduce(b, n, gouts, need, mean: bool):
    g = gouts[0]
    x, y = n.inputs[0], n.outputs[0]
    keep = n.attr("keepdims", 1)
    axes_as_input = n.opset >= (18 if mean else 13)
    axes_val = None  # a value name holding axes known only at run time
    if axes_as_input:
        name = n.inputs[1] if len(n.inputs) > 1 and n.inputs[1] else None
        axes = [] if name is None else b.constant_value(name)
        if axes is None:
            axes_val = name
        else:
            axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    else:
        axes = n.attr("axes") or []
    if keep or axes_val is None and not axes:
        # kept axes broadcast back directly; reducing everything (or nothing) left a scalar (or x)
        gx = g
    elif axes_val is not None:
        gx = b.emit("Unsqueeze", [g, axes_val])
    else:
        # negative axes of Unsqueeze count from the end of its output, which has x's rank
        gx = b.unsqueeze(g, axes)
    dx = b.expand_like(gx, x)
    if mean:
        count = b.emit("Div", [b.emit("Size", [x]), b.emit("Size", [y])])
        dx = b.emit("Div", [dx, b.cast_like(count, x)])
    return [dx] + [None] * (len(n.inputs) - 1)


@_rule("ReduceSum", diff=(0,))
def _reduce_sum(b, n, gouts, need):
    return _reduce(b, n, gouts, need, mean=False)


@_rule("ReduceMean", diff=(0,))
def _reduce_mean(b, n, gouts, need):
    return _reduce(b, n, gouts, need, mean=True)


def _softmax_like(b, n, gouts, log: bool):
    g = gouts[0]
    x, y = n.inputs[0], n.outputs[0]
    if n.opset >= 13:
        axis = n.attr("axis", -1)
        gf, yf, axes = g, y, [axis]
    else:
        # before opset 13 the op works on the input flattened to 2-D at axis
        axis = n.attr("axis", 1)
        gf, yf, axes = b.emit("Flatten", [g], axis=axis), b.emit("Flatten", [y], axis=axis), [1]
    if log:
        s = b.reduce_sum(gf, axes, keepdims=1)
        dx = b.emit("Sub", [gf, b.emit("Mul", [b.emit("Exp", [yf]), s])])
    else:
        s = b.reduce_sum(b.emit("Mul", [gf, yf]), axes, keepdims=1)
        dx = b.emit("Mul", [yf, b.emit("Sub", [gf, s])])
    if n.opset < 13:
        dx = b.reshape_to(dx, x)
    return [dx]


@_rule("Softmax")
def _softmax(b, n, gouts, need):
    return _softmax_like(b, n, gouts, log=False)


@_rule("LogSoftmax")
def _log_softmax(b, n, gouts, need):
    return _softmax_like(b, n, gouts, log=True)


@_rule("Concat")
def _concat(b, n, gouts, need):
    g = gouts[0]
    axis = n.attr("axis")
    last = max(i for i, k in enumerate(need) if k)
    out: list[str | None] = [None] * len(n.inputs)
    start_static: int | None = 0
    start_val = b.ints([0])
    for i, x in enumerate(n.inputs[: last + 1]):
        s = b.shape(x)
        size_static = None
        if s is not None and -len(s) <= axis < len(s) and isinstance(s[axis], int):
            size_static = s[axis]
        if start_static is not None and size_static is not None:
            end_static = start_static + size_static
            end_val = b.ints([end_static])
        else:
            size_val = b.emit("Gather", [b.shape_of(x), b.ints([axis])], axis=0)
            if start_static is not None:
                start_val = b.ints([start_static])
            end_val = b.emit("Add", [start_val, size_val])
            end_static = None
        if need[i]:
            st = b.ints([start_static]) if start_static is not None else start_val
            out[i] = b.emit("Slice", [g, st, end_val, b.ints([axis])])
        start_static, start_val = end_static, end_val
    return out


@_rule("Cast")
def _cast(b, n, gouts, need):
    x = n.inputs[0]
    dx, dy = b.dtype(x), n.attr("to")
    if dy not in FLOAT_TYPES or (dx is not None and dx not in FLOAT_TYPES):
        return [None]  # through integers the derivative is zero (no contribution)
    return [b.cast_like(gouts[0], x)]


@_rule("CastLike", diff=(0,))
def _cast_like(b, n, gouts, need):
    x = n.inputs[0]
    dx, dy = b.dtype(x), b.dtype(n.inputs[1])
    if (dy is not None and dy not in FLOAT_TYPES) or (dx is not None and dx not in FLOAT_TYPES):
        return [None, None]
    return [b.cast_like(gouts[0], x), None]


# ops whose outputs have no useful derivative (integer or boolean, or piecewise constant):
# nothing flows back through them
for _op in ("Shape", "Size", "ConstantOfShape", "Equal", "Greater", "Less", "GreaterOrEqual",
            "LessOrEqual", "Not", "And", "Or", "Xor", "NonZero", "ArgMax", "ArgMin", "Sign",
            "Floor", "Ceil", "Round", "IsNaN", "IsInf"):
    RULES[_op] = ((), lambda b, n, gouts, need: [None] * len(n.inputs))

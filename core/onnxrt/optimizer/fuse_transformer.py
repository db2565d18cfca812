"""Transformer fusions: Gelu, FastGelu, BiasGelu, LayerNormalization,
SimplifiedLayerNormalization and SkipLayerNormalization.

Level 2, after partitioning, applied only where the provider owning the matched
nodes has a kernel for the fused op. The patterns are the ones exporters write:

- ``gelu_fusion``: ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (``x * (1 / sqrt 2)`` too, and
  the three orders of the two final products) -> com.microsoft ``Gelu``.
- ``fast_gelu_fusion``: the tanh approximation
  ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`` with ``x^3`` as a Pow or
  as products -> com.microsoft ``FastGelu``.
- ``bias_gelu_fusion``: ``Gelu(a + bias)`` with a constant 1-D bias over the last axis
  -> ``BiasGelu``; ``FastGelu(a + bias)`` -> ``FastGelu(a, bias)``.
- ``layer_norm_fusion``: ReduceMean, Sub, Pow (or Mul), ReduceMean, Add(eps), Sqrt,
  Div, Mul(gamma), Add(beta) over the last axis -> ``LayerNormalization`` (at any opset, as onnxruntime).
- ``simplified_layer_norm_fusion``: RMSNorm, Pow, ReduceMean, Add(eps), Sqrt, then Div,
  or Reciprocal (or ``1 / s``) and Mul, then Mul(gamma) -> ``SimplifiedLayerNormalization`` (the
  ai.onnx-domain op onnxruntime defines).
- ``skip_layer_norm_fusion``: ``LayerNormalization(a + b)`` with ``a`` and ``b`` of the
  same known 2-D or 3-D shape -> com.microsoft ``SkipLayerNormalization``; when the
  sum is read elsewhere too it comes out as the op's fourth output.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from .patterns import MS_DOMAIN, GraphView

__all__ = [
    "bias_gelu_fusion",
    "fast_gelu_fusion",
    "gelu_fusion",
    "layer_norm_fusion",
    "other_input",
    "scaled_by",
    "quick_gelu_fusion",
    "simplified_layer_norm_fusion",
    "skip_layer_norm_fusion",
]

_FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


def other_input(node, name: str) -> str | None:
    """The input of a binary ``node`` that is not ``name`` (``name`` if both are)."""
    if len(node.inputs) != 2:
        return None
    if node.inputs[0] == name:
        return node.inputs[1]
    if node.inputs[1] == name:
        return node.inputs[0]
    return None


def scaled_by(view: GraphView, node, op_type: str, value: float) -> str | None:
    """If ``node`` is ``op_type(v, c)`` (or ``(c, v)`` for Mul/Add) with a scalar constant
    ``c`` close to ``value``, return ``v``."""
    if node is None or node.op_type != op_type or node.domain != "" or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if view.is_scalar(b, value, operand=a) and view.const(a) is None:
        return a
    if op_type in ("Mul", "Add") and view.is_scalar(a, value, operand=b) and view.const(b) is None:
        return b
    return None


def _half_x_times(view: GraphView, value: str, x: str):
    """Match ``0.5 * x * value`` in its three association orders: (nodes, output)."""
    m = view.only_reader(value, "Mul")
    if m is None:
        return None
    o = other_input(m, value)
    if o == x:
        m2 = view.only_reader(m.outputs[0], "Mul")
        if m2 is not None and scaled_by(view, m2, "Mul", 0.5) == m.outputs[0]:
            return [m, m2], m2.outputs[0]
    elif o is not None and view.is_scalar(o, 0.5, operand=value):
        m2 = view.only_reader(m.outputs[0], "Mul")
        if m2 is not None and other_input(m2, m.outputs[0]) == x:
            return [m, m2], m2.outputs[0]
    elif o is not None:
        h = view.producer(o, "Mul")
        if h is not None and scaled_by(view, h, "Mul", 0.5) == x:
            return [h, m], m.outputs[0]
    return None


def _float_input(view: GraphView, name: str) -> bool:
    return view.elem_type(name) in _FLOATS


def gelu_fusion(graph, ctx) -> bool:
    """The erf form of Gelu -> com.microsoft Gelu."""
    view = GraphView(graph, ctx)
    for erf in view.candidates("Erf"):
        d = view.producer(erf.inputs[0])
        x = scaled_by(view, d, "Div", math.sqrt(2.0)) or scaled_by(view, d, "Mul", 1.0 / math.sqrt(2.0))
        if x is None or not _float_input(view, x):
            continue
        add = view.only_reader(erf.outputs[0], "Add")
        if add is None or scaled_by(view, add, "Add", 1.0) != erf.outputs[0]:
            continue
        tail = _half_x_times(view, add.outputs[0], x)
        if tail is None:
            continue
        nodes, out = tail
        gelu = view.make_node("Gelu", [x], [out], erf.name + "_gelu", domain=MS_DOMAIN)
        view.replace([d, erf, add] + nodes, [gelu])
    return view.finish()


def _cube_of(view: GraphView, name: str, x: str):
    """The nodes computing ``x^3`` as ``name``, or None."""
    n = view.producer(name)
    if n is None or n.domain != "":
        return None
    if n.op_type == "Pow" and n.inputs[0] == x and view.is_scalar(n.inputs[1], 3.0, operand=x):
        return [n]
    if n.op_type == "Mul" and x in n.inputs:
        sq = view.producer(other_input(n, x) or "", "Mul")
        if sq is not None and sq.inputs == [x, x]:
            return [sq, n]
    return None


def fast_gelu_fusion(graph, ctx) -> bool:
    """The tanh approximation of Gelu -> com.microsoft FastGelu."""
    view = GraphView(graph, ctx)
    for tanh in view.candidates("Tanh"):
        scale = view.producer(tanh.inputs[0])
        inner = scaled_by(view, scale, "Mul", math.sqrt(2.0 / math.pi))
        add = view.producer(inner or "", "Add")
        if add is None or len(add.inputs) != 2:
            continue
        found = None
        for x, s in (add.inputs, add.inputs[::-1]):
            sm = view.producer(s)
            cube = scaled_by(view, sm, "Mul", 0.044715)
            cube_nodes = _cube_of(view, cube, x) if cube else None
            if cube_nodes:
                found = x, [*cube_nodes, sm]
                break
        if found is None or not _float_input(view, found[0]):
            continue
        x, front = found
        one = view.only_reader(tanh.outputs[0], "Add")
        if one is None or scaled_by(view, one, "Add", 1.0) != tanh.outputs[0]:
            continue
        tail = _half_x_times(view, one.outputs[0], x)
        if tail is None:
            continue
        nodes, out = tail
        fast = view.make_node("FastGelu", [x], [out], tanh.name + "_fastgelu", domain=MS_DOMAIN)
        view.replace(front + [add, scale, tanh, one] + nodes, [fast])
    return view.finish()


def quick_gelu_fusion(graph, ctx) -> bool:
    """``x * Sigmoid(alpha * x)`` (with ``alpha = 1``: SiLU, or Swish) -> com.microsoft
    QuickGelu, as onnxruntime's QuickGeluFusion does: one node instead of two or three."""
    view = GraphView(graph, ctx)
    for sig in view.candidates("Sigmoid"):
        mul = view.only_reader(sig.outputs[0], "Mul")
        if mul is None:
            continue
        other = other_input(mul, sig.outputs[0])
        inner = sig.inputs[0]
        scale = view.producer(inner, "Mul")
        found = None
        if scale is not None and len(scale.inputs) == 2:
            for x, c in (scale.inputs, scale.inputs[::-1]):
                alpha = view.scalar(c, operand=x)
                if alpha is not None and view.const(x) is None and other == x:
                    found = x, alpha, [scale]
                    break
        if found is None and other == inner:
            found = inner, 1.0, []
        if found is None or not _float_input(view, found[0]):
            continue
        x, alpha, front = found
        quick = view.make_node("QuickGelu", [x], [mul.outputs[0]], sig.name + "_quickgelu", domain=MS_DOMAIN,
                               alpha=float(alpha))
        view.replace(front + [sig, mul], [quick])
    return view.finish()


def bias_gelu_fusion(graph, ctx) -> bool:
    """``Gelu(a + bias)`` -> BiasGelu; ``FastGelu(a + bias)`` -> FastGelu with its bias."""
    view = GraphView(graph, ctx)
    for g in list(graph.nodes):
        if g.domain != MS_DOMAIN or g.op_type not in ("Gelu", "FastGelu") or len(g.inputs) != 1:
            continue
        if not view.free(g):
            continue
        add = view.producer(g.inputs[0], "Add")
        if add is None or len(add.inputs) != 2:
            continue
        for a, bias in (add.inputs, add.inputs[::-1]):
            b = view.const(bias)
            shape = view.shape(a)
            if b is None or b.ndim != 1 or view.const(a) is not None or not shape:
                continue
            if shape[-1] != b.shape[0] or view.shape(add.outputs[0]) != shape:
                continue
            if view.elem_type(a) != view.elem_type(bias):
                continue
            op = "BiasGelu" if g.op_type == "Gelu" else "FastGelu"
            new = view.make_node(op, [a, bias], list(g.outputs), g.name, domain=MS_DOMAIN)
            view.replace([add, g], [new])
            break
    return view.finish()


def _last_axis_reduce(view: GraphView, node, rank: int | None) -> bool:
    """Whether ``node`` is a keepdims ReduceMean over the last axis only."""
    if node is None or node.op_type != "ReduceMean" or node.domain != "" or not node.attr("keepdims", 1):
        return False
    if len(node.inputs) > 1 and node.inputs[1]:
        c = view.const(node.inputs[1])
        axes = None if c is None else [int(v) for v in c.reshape(-1)]
    else:
        axes = node.attr("axes")
    if not axes or len(axes) != 1:
        return False
    return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)


def _eps_sqrt(view: GraphView, var: str):
    """``Sqrt(var + eps)``: (nodes, eps, output), or None."""
    add = view.only_reader(var, "Add")
    if add is None:
        return None
    eps_name = other_input(add, var)
    eps = view.scalar(eps_name, operand=var) if eps_name else None
    if eps is None or eps < 0:  # onnxruntime's normalizations refuse a negative epsilon
        return None
    sq = view.only_reader(add.outputs[0], "Sqrt")
    if sq is None:
        return None
    return [add, sq], eps, sq.outputs[0]


def _vector(view: GraphView, name: str, d, dtype_of: str) -> np.ndarray | None:
    c = view.const(name)
    if c is None or not isinstance(d, int) or c.shape != (d,):
        return None
    if view.elem_type(name) != view.elem_type(dtype_of):
        return None
    return c


def _affine_tail(view: GraphView, value: str, x: str, d, with_beta: bool):
    """``value * gamma (+ beta)``: (nodes, gamma, beta, output); gamma may be absent."""
    nodes, gamma, beta, out = [], None, None, value
    m = view.only_reader(value, "Mul")
    if m is not None:
        g = other_input(m, value)
        gamma = _vector(view, g, d, x) if g else None
        if gamma is not None:
            nodes.append(m)
            out = m.outputs[0]
    if with_beta:
        a = view.only_reader(out, "Add")
        if a is not None:
            b = other_input(a, out)
            beta = _vector(view, b, d, x) if b else None
            if beta is not None:
                nodes.append(a)
                out = a.outputs[0]
    return nodes, gamma, beta, out


def layer_norm_fusion(graph, ctx) -> bool:
    """The decomposed layer normalization over the last axis -> LayerNormalization."""
    view = GraphView(graph, ctx)
    # at any opset: onnxruntime defines LayerNormalization in the default domain before
    # opset 17 (where ONNX added it) and fuses into it there too, so a model saved after
    # this fusion still loads in onnxruntime
    for rm in list(graph.nodes):
        if rm.op_type != "ReduceMean" or not view.free(rm):
            continue
        x = rm.inputs[0]
        shape = view.shape(x)
        rank = None if shape is None else len(shape)
        if shape is None or not shape or not isinstance(shape[-1], int) or not _float_input(view, x):
            continue
        if not _last_axis_reduce(view, rm, rank):
            continue
        sub = view.only_reader(rm.outputs[0], "Sub")
        if sub is None or sub.inputs != [x, rm.outputs[0]]:
            continue
        dev = sub.outputs[0]
        readers = view.readers(dev)
        if len(readers) != 2 or dev in view.outputs:
            continue
        sq = next((r for r in readers if r.op_type == "Pow" and r.inputs[0] == dev
                   and view.is_scalar(r.inputs[1], 2.0, operand=dev)), None)
        sq = sq or next((r for r in readers if r.op_type == "Mul" and r.inputs == [dev, dev]), None)
        div = next((r for r in readers if r.op_type == "Div" and r.inputs[0] == dev), None)
        if sq is None or div is None or not view.free(sq) or not view.free(div):
            continue
        rm2 = view.only_reader(sq.outputs[0], "ReduceMean")
        if not _last_axis_reduce(view, rm2, rank):
            continue
        es = _eps_sqrt(view, rm2.outputs[0])
        if es is None or div.inputs[1] != es[2]:
            continue
        tail, gamma, _, out = _affine_tail(view, div.outputs[0], x, shape[-1], True)
        if gamma is None:
            gname = view.add_constant(rm.name + "_gamma", np.ones(shape[-1], _np_type(view, x)))
            bnode = tail[0] if tail else None
        else:
            gname = other_input(tail[0], div.outputs[0])
            bnode = tail[1] if len(tail) > 1 else None
        inputs = [x, gname]
        if bnode is not None:
            inputs.append(bnode.inputs[1] if view.const(bnode.inputs[1]) is not None else bnode.inputs[0])
        ln = view.make_node("LayerNormalization", inputs, [out], rm.name + "_layernorm", axis=-1,
                            epsilon=float(es[1]))
        view.replace([rm, sub, sq, rm2, *es[0], div, *tail], [ln])
    return view.finish()


def _np_type(view: GraphView, name: str):
    return helper.tensor_dtype_to_np_dtype(view.elem_type(name))


def simplified_layer_norm_fusion(graph, ctx) -> bool:
    """RMS normalization over the last axis -> SimplifiedLayerNormalization."""
    view = GraphView(graph, ctx)
    for sq in list(graph.nodes):
        if sq.domain != "" or not view.free(sq):
            continue
        x = sq.inputs[0] if sq.inputs else ""
        if sq.op_type == "Pow":
            if not view.is_scalar(sq.inputs[1], 2.0, operand=x):
                continue
        elif not (sq.op_type == "Mul" and sq.inputs == [x, x]):
            continue
        shape = view.shape(x)
        if not shape or not isinstance(shape[-1], int) or not _float_input(view, x):
            continue
        rm = view.only_reader(sq.outputs[0], "ReduceMean")
        if not _last_axis_reduce(view, rm, len(shape)):
            continue
        es = _eps_sqrt(view, rm.outputs[0])
        if es is None:
            continue
        nodes = [sq, rm, *es[0]]
        std = es[2]
        div = view.only_reader(std, "Div")
        if div is not None and div.inputs == [x, std]:
            nodes.append(div)
            normed = div.outputs[0]
        else:
            rec = view.only_reader(std)
            if rec is not None and not (
                    (rec.op_type == "Reciprocal" and rec.domain == "")
                    or (rec.op_type == "Div" and rec.inputs[1] == std and view.is_scalar(rec.inputs[0], 1.0, operand=std))):
                rec = None
            mul = view.only_reader(rec.outputs[0], "Mul") if rec is not None else None
            if mul is None or other_input(mul, rec.outputs[0]) != x:
                continue
            nodes += [rec, mul]
            normed = mul.outputs[0]
        tail, gamma, _, out = _affine_tail(view, normed, x, shape[-1], False)
        if gamma is None:
            continue
        gname = other_input(tail[0], normed)
        node = view.make_node("SimplifiedLayerNormalization", [x, gname], [out], sq.name + "_rmsnorm",
                              axis=-1, epsilon=float(es[1]))
        view.replace(nodes + tail, [node])
    return view.finish()


def _provably_same_shape(a, b) -> bool:
    return (a is not None and b is not None and len(a) == len(b) and len(a) in (2, 3)
            and all(x is not None and x == y for x, y in zip(a, b)))


def skip_layer_norm_fusion(graph, ctx) -> bool:
    """``LayerNormalization(a + b)`` over the last axis -> SkipLayerNormalization."""
    view = GraphView(graph, ctx)
    for ln in view.candidates("LayerNormalization"):
        if len(ln.outputs) > 1 and any(ln.outputs[1:]):
            continue
        shape = view.shape(ln.inputs[0])
        if shape is None or ln.attr("axis", -1) not in (-1, len(shape) - 1):
            continue
        d = shape[-1] if shape else None
        gamma = view.const(ln.inputs[1]) if len(ln.inputs) > 1 else None
        beta_name = ln.inputs[2] if len(ln.inputs) > 2 else ""
        beta = view.const(beta_name) if beta_name else None
        if gamma is None or gamma.shape != (d,) or (beta_name and (beta is None or beta.shape != (d,))):
            continue
        add = view.producer(ln.inputs[0], "Add")
        if add is None or len(add.inputs) != 2:
            continue
        a, b = add.inputs
        if not _provably_same_shape(view.shape(a), view.shape(b)) or view.const(a) is not None:
            continue
        if not (_float_input(view, a) and view.elem_type(a) == view.elem_type(b)):
            continue
        s = add.outputs[0]
        shared = s in view.outputs or len(view.readers(s)) > 1
        outputs = [ln.outputs[0]] + (["", "", s] if shared else [])
        inputs = [a, b, ln.inputs[1]] + ([beta_name] if beta_name else [])
        node = view.make_node("SkipLayerNormalization", inputs, outputs, ln.name + "_skip", domain=MS_DOMAIN,
                              epsilon=float(ln.attr("epsilon", 1e-5)))
        view.replace([add, ln], [node])
    return view.finish()

"""Quantization fusions: QDQ node units and dynamic-quantization chains -> integer ops.

Level 2, after partitioning, and only where the provider owning the nodes has the
fused op's kernel (``GraphView.replace`` checks it). What is fused is what
onnxruntime's QDQ selectors and actions, ``DynamicQuantizeMatMulFusion`` and
``MatMulIntegerToFloatFusion`` fuse; each match checks that the fused op computes
what the graph did:

- ``qdq_conv_fusion``: ``Q(Conv(DQ(x), DQ(w) [, DQ(b)]))`` -> ``QLinearConv``. ``x``
  and ``y`` per tensor, ``w`` per tensor or per output channel (axis 0), the bias
  int32 with zero point 0 and scale ``x_scale * w_scale``.
- ``qdq_matmul_fusion``: ``Q(MatMul(DQ(a), DQ(b)))`` -> ``QLinearMatMul`` (per
  tensor); ``MatMul(DQ(a), DQ(b))`` read as float -> com.microsoft
  ``MatMulIntegerToFloat`` (``b`` constant, per tensor or per column).
- ``qdq_gemm_fusion``: ``[Q](Gemm(DQ(a), DQ(b) [, DQ(c)]))`` -> com.microsoft
  ``QGemm`` (per tensor, ``beta`` 1, the bias as for Conv).
- ``qdq_binary_fusion``: ``Q(Add|Mul(DQ(a), DQ(b)))`` -> com.microsoft
  ``QLinearAdd``/``QLinearMul``.
- ``qdq_pool_fusion``: ``Q(GlobalAveragePool|AveragePool(DQ(x)))`` -> com.microsoft
  ``QLinearGlobalAveragePool``/``QLinearAveragePool``.
- ``qdq_drop_fusion``: ``Q(op(DQ(x)))`` where ``Q`` has ``DQ``'s scale and zero point
  and ``op`` only moves or selects values (MaxPool, Reshape, Transpose, Flatten,
  Squeeze, Unsqueeze, Slice, Split, Gather): the op runs on the integers.
- ``qdq_lookup_fusion``: ``Q(f(DQ(x)))`` for a chain ``f`` of elementwise float ops
  (constants one-element) -> ``Gather`` from a 256-entry table of what the chain
  computes for each 8-bit input (built with the chain's own kernels, so exact).
- ``dynamic_quant_matmul_fusion``: ``Mul(Cast(MatMulInteger(DynamicQuantizeLinear(x),
  W)), x_scale * w_scale) [+ bias]`` -> com.microsoft ``DynamicQuantizeMatMul`` (or
  ``MatMulIntegerToFloat`` when the quantized ``x`` has other readers).
- ``qdq_constant_folding``: constant folding again, now including the
  ``DequantizeLinear`` nodes of constants, which level-1 folding keeps at level 2
  and above so that the fusions above can read the integers behind them.

The integer ops accumulate exactly and round once, where the float graph rounded each
product and sum; a requantized result can therefore differ from the unfused graph's by
one quantization step where a value falls next to a rounding boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .patterns import MS_DOMAIN, GraphView

__all__ = [
    "dynamic_quant_matmul_fusion",
    "qdq_binary_fusion",
    "qdq_constant_folding",
    "qdq_conv_fusion",
    "qdq_drop_fusion",
    "qdq_gemm_fusion",
    "qdq_lookup_fusion",
    "qdq_matmul_fusion",
    "qdq_pool_fusion",
    "register",
]

_F32 = np.dtype(np.float32)
_BYTE_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))
#: ops that only move or select values: quantized before or after, the integers agree
_DATA_MOVEMENT = {"MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather"}


@dataclass
class _Quant:
    """A DequantizeLinear or QuantizeLinear node's integer side and parameters."""

    node: object
    value: str  # the integer tensor (DQ's input, Q's output)
    scale: str
    zero_point: str  # "" when absent (uint8, zero)
    scale_value: np.ndarray
    zp_value: np.ndarray | None
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale_value.size == 1 and (self.zp_value is None or self.zp_value.size == 1)

    def same_params(self, other: _Quant) -> bool:
        """Whether both have the same scale and zero point (and so the same type)."""
        if not (self.per_tensor and other.per_tensor):
            return False
        if self.scale_value.reshape(()) != other.scale_value.reshape(()):
            return False
        za, zb = self.zp_value, other.zp_value
        if za is None or zb is None:
            return za is None and zb is None
        return za.dtype == zb.dtype and za.reshape(()) == zb.reshape(())


def _params(view: GraphView, node) -> _Quant | None:
    """Scale and zero point of a Q/DQ node when they are constants it can be fused with."""
    ins = node.inputs
    if len(ins) < 2 or int(node.attr("block_size", 0) or 0) or int(node.attr("output_dtype", 0) or 0):
        return None
    if node.op_type == "QuantizeLinear" and not int(node.attr("saturate", 1)):
        return None
    scale = view.const(ins[1])
    if scale is None or scale.dtype != _F32 or scale.ndim > 1:
        return None
    zp_name = ins[2] if len(ins) > 2 else ""
    zp = None
    if zp_name:
        zp = view.const(zp_name)
        if zp is None or zp.size != scale.size or zp.ndim > 1:
            return None
    value = ins[0] if node.op_type == "DequantizeLinear" else node.outputs[0]
    return _Quant(node, value, ins[1], zp_name, scale, zp, int(node.attr("axis", 1)))


def _dq(view: GraphView, name: str, provider) -> _Quant | None:
    """The DequantizeLinear producing ``name`` (on ``provider``), with its parameters.

    The DequantizeLinear itself stays: other readers may use it, and dead-node
    elimination removes it when nobody does.
    """
    n = view.producer(name, "DequantizeLinear")
    if n is None or n.provider != provider or len(n.outputs) != 1:
        return None
    return _params(view, n)


def _q_after(view: GraphView, value: str, provider) -> _Quant | None:
    """The QuantizeLinear that is the only reader of ``value`` (not a graph output)."""
    n = view.only_reader(value, "QuantizeLinear")
    if n is None or n.inputs[0] != value or n.provider != provider:
        return None
    p = _params(view, n)
    if p is None or not p.per_tensor:
        return None
    return p


def _int_type(view: GraphView, q: _Quant) -> np.dtype | None:
    """The 8-bit type of a Q/DQ's integers, or None when it is not 8-bit."""
    if q.zp_value is not None:
        dt = q.zp_value.dtype
    elif q.node.op_type == "QuantizeLinear":
        dt = np.dtype(np.uint8)  # no zero point and no output_dtype: uint8
    else:
        c = view.const(q.value)
        et = view.elem_type(q.value)
        if c is not None:
            dt = c.dtype
        elif et is not None:
            from onnx import helper

            dt = np.dtype(helper.tensor_dtype_to_np_dtype(et))
        else:
            return None
    return dt if dt in _BYTE_TYPES else None


def _zp_input(view: GraphView, q: _Quant, base: str) -> str | None:
    """A zero-point input for a fused op: the Q/DQ's own, or a new zero of its type."""
    if q.zero_point:
        return q.zero_point
    dt = _int_type(view, q)
    if dt is None:
        return None
    return view.add_constant(base + "_zero_point", np.zeros((), dtype=dt))


def _trim(inputs: list) -> list:
    """Inputs without trailing empty (omitted optional) names."""
    inputs = list(inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def _scalar_of(a: np.ndarray) -> float:
    return float(a.reshape(-1)[0])


def _bias_fits(view: GraphView, name: str, provider, x: _Quant, w: _Quant, n: int) -> bool:
    """Whether DQ(``name``) is an int32 bias of length ``n`` quantized with scale
    ``x_scale * w_scale`` and zero point 0, so that it can join the int32 accumulator."""
    b = _dq(view, name, provider)
    if b is None:
        return False
    bq = view.const(b.value)
    if bq is None or bq.dtype != np.int32 or bq.shape != (n,):
        return False
    if b.zp_value is not None and np.any(b.zp_value):
        return False
    want = (np.float32(_scalar_of(x.scale_value)) * w.scale_value.astype(_F32)).reshape(-1)
    have = b.scale_value.astype(_F32).reshape(-1)
    if have.size not in (1, n) or want.size not in (1, n):
        return False
    return bool(np.allclose(np.broadcast_to(have, (n,)), np.broadcast_to(want, (n,)), rtol=1e-6, atol=0))


def _io_ok(view: GraphView, *qs: _Quant) -> bool:
    return all(q is not None and _int_type(view, q) is not None for q in qs)


# -- QDQ node units ---------------------------------------------------------------------


def qdq_conv_fusion(graph, ctx) -> bool:
    """``Q(Conv(DQ(x), DQ(w) [, DQ(b)]))`` -> QLinearConv."""
    view = GraphView(graph, ctx)
    for conv in view.candidates("Conv"):
        if len(conv.inputs) < 2:
            continue
        p = conv.provider
        x = _dq(view, conv.inputs[0], p)
        w = _dq(view, conv.inputs[1], p)
        y = _q_after(view, conv.outputs[0], p)
        if not _io_ok(view, x, w, y) or not x.per_tensor:
            continue
        wq = view.const(w.value)
        if wq is None or wq.ndim < 3:
            continue
        m = wq.shape[0]
        if not w.per_tensor and (w.axis not in (0, -wq.ndim) or w.scale_value.shape != (m,)):
            continue
        if w.zp_value is not None and not w.per_tensor and np.any(w.zp_value):
            continue  # onnxruntime's kernels take per-channel weights symmetric only
        bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
        if bias and not _bias_fits(view, bias, p, x, w, m):
            continue
        xzp, wzp, yzp = (_zp_input(view, q, conv.name) for q in (x, w, y))
        inputs = [x.value, x.scale, xzp, w.value, w.scale, wzp, y.scale, yzp]
        if bias:
            inputs.append(view.producers[bias].inputs[0])
        fused = view.make_node("QLinearConv", inputs, [y.value], conv.name)
        fused.attrs.update(conv.attrs)
        view.replace([conv, y.node], [fused])
    return view.finish()


def _const_b_ok(view: GraphView, b: _Quant, n_axis: int) -> bool:
    """Whether ``b`` is a constant 2-D weight quantized per tensor or along ``n_axis``."""
    bq = view.const(b.value)
    if bq is None or bq.ndim != 2:
        return False
    if b.per_tensor:
        return True
    return b.axis % 2 == n_axis and b.scale_value.shape == (bq.shape[n_axis],)


def qdq_matmul_fusion(graph, ctx) -> bool:
    """``Q(MatMul(DQ(a), DQ(b)))`` -> QLinearMatMul; ``MatMul(DQ(a), DQ(b))`` read as
    float -> com.microsoft MatMulIntegerToFloat."""
    view = GraphView(graph, ctx)
    for mm in view.candidates("MatMul"):
        p = mm.provider
        a = _dq(view, mm.inputs[0], p)
        b = _dq(view, mm.inputs[1], p)
        if not _io_ok(view, a, b) or not a.per_tensor:
            continue
        y = _q_after(view, mm.outputs[0], p)
        if y is not None and _int_type(view, y) is not None and b.per_tensor:
            azp, bzp, yzp = (_zp_input(view, q, mm.name) for q in (a, b, y))
            fused = view.make_node("QLinearMatMul", [a.value, a.scale, azp, b.value, b.scale, bzp, y.scale, yzp],
                                   [y.value], mm.name)
            view.replace([mm, y.node], [fused])
            continue
        if view.only_reader(mm.outputs[0], "QuantizeLinear") is not None or not _const_b_ok(view, b, 1):
            continue
        azp, bzp = (_zp_input(view, q, mm.name) for q in (a, b))
        fused = view.make_node("MatMulIntegerToFloat", [a.value, b.value, a.scale, b.scale, azp, bzp],
                               [mm.outputs[0]], mm.name, domain=MS_DOMAIN)
        view.replace([mm], [fused])
    return view.finish()


def qdq_gemm_fusion(graph, ctx) -> bool:
    """``[Q](Gemm(DQ(a), DQ(b) [, DQ(c)]))`` -> com.microsoft QGemm."""
    view = GraphView(graph, ctx)
    for gemm in view.candidates("Gemm"):
        if len(gemm.inputs) < 2:
            continue
        if float(gemm.attr("beta", 1.0)) != 1.0 or int(gemm.attr("transA", 0)):
            continue
        p = gemm.provider
        a = _dq(view, gemm.inputs[0], p)
        b = _dq(view, gemm.inputs[1], p)
        if not _io_ok(view, a, b) or not (a.per_tensor and b.per_tensor):
            continue
        bq = view.const(b.value)
        if bq is None or bq.ndim != 2:
            continue
        n = bq.shape[0] if int(gemm.attr("transB", 0)) else bq.shape[1]
        c = gemm.inputs[2] if len(gemm.inputs) > 2 else ""
        if c and not _bias_fits(view, c, p, a, b, n):
            continue
        y = _q_after(view, gemm.outputs[0], p)
        if y is not None and _int_type(view, y) is None:
            continue
        if y is None and view.only_reader(gemm.outputs[0], "QuantizeLinear") is not None:
            continue
        azp, bzp = (_zp_input(view, q, gemm.name) for q in (a, b))
        inputs = [a.value, a.scale, azp, b.value, b.scale, bzp, view.producers[c].inputs[0] if c else ""]
        old = [gemm]
        out = gemm.outputs[0]
        if y is not None:
            inputs += [y.scale, _zp_input(view, y, gemm.name)]
            old.append(y.node)
            out = y.value
        fused = view.make_node("QGemm", _trim(inputs), [out], gemm.name, domain=MS_DOMAIN,
                               alpha=float(gemm.attr("alpha", 1.0)), transB=int(gemm.attr("transB", 0)))
        view.replace(old, [fused])
    return view.finish()


def qdq_binary_fusion(graph, ctx) -> bool:
    """``Q(Add|Mul(DQ(a), DQ(b)))`` -> com.microsoft QLinearAdd/QLinearMul."""
    view = GraphView(graph, ctx)
    for node in view.candidates(("Add", "Mul")):
        if len(node.inputs) != 2:
            continue
        p = node.provider
        a = _dq(view, node.inputs[0], p)
        b = _dq(view, node.inputs[1], p)
        y = _q_after(view, node.outputs[0], p)
        if not _io_ok(view, a, b, y) or not (a.per_tensor and b.per_tensor):
            continue
        if _int_type(view, a) != _int_type(view, b):
            continue
        azp, bzp, yzp = (_zp_input(view, q, node.name) for q in (a, b, y))
        fused = view.make_node("QLinear" + node.op_type, [a.value, a.scale, azp, b.value, b.scale, bzp, y.scale, yzp],
                               [y.value], node.name, domain=MS_DOMAIN)
        view.replace([node, y.node], [fused])
    return view.finish()


def qdq_pool_fusion(graph, ctx) -> bool:
    """``Q(GlobalAveragePool|AveragePool(DQ(x)))`` -> com.microsoft QLinear pooling."""
    view = GraphView(graph, ctx)
    for node in view.candidates(("GlobalAveragePool", "AveragePool")):
        p = node.provider
        x = _dq(view, node.inputs[0], p)
        y = _q_after(view, node.outputs[0], p)
        if not _io_ok(view, x, y) or not x.per_tensor or _int_type(view, x) != _int_type(view, y):
            continue
        xzp, yzp = (_zp_input(view, q, node.name) for q in (x, y))
        fused = view.make_node("QLinear" + node.op_type, [x.value, x.scale, xzp, y.scale, yzp], [y.value],
                               node.name, domain=MS_DOMAIN)
        if node.op_type == "AveragePool":
            fused.attrs.update(node.attrs)
        view.replace([node, y.node], [fused])
    return view.finish()


def qdq_drop_fusion(graph, ctx) -> bool:
    """``Q(op(DQ(x)))`` with equal scales and zero points, ``op`` moving values only:
    ``op`` reads the integers and writes ``Q``'s output."""
    view = GraphView(graph, ctx)
    for node in view.candidates(_DATA_MOVEMENT):
        if not node.inputs:
            continue
        if node.op_type == "MaxPool" and (len(node.outputs) > 1 and node.outputs[1]):
            continue
        p = node.provider
        x = _dq(view, node.inputs[0], p)
        if x is None or not x.per_tensor or _int_type(view, x) is None:
            continue
        if any(i == node.inputs[0] for i in node.inputs[1:]):
            continue
        qs = [_q_after(view, o, p) if o else None for o in node.outputs]
        if any(q is None or not x.same_params(q) for q in qs):
            continue
        fused = view.make_node(node.op_type, [x.value] + list(node.inputs[1:]), [q.value for q in qs], node.name)
        fused.attrs.update(node.attrs)
        view.replace([node] + [q.node for q in qs], [fused])
    return view.finish()


#: elementwise ops whose output element depends only on the same input element
_UNARY = {"Erf", "Tanh", "Sigmoid", "Relu", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Softplus",
          "Softsign", "LeakyRelu", "HardSigmoid", "Elu", "Selu", "Celu", "HardSwish", "Mish", "ThresholdedRelu",
          "Floor", "Ceil", "Round", "Sign", "Sin", "Cos"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}
_LOOKUP_MAX_CHAIN = 8


def _lookup_chain(view: GraphView, first, value: str, provider):
    """Elementwise float nodes from ``first`` (which reads ``value``) to a
    QuantizeLinear, each reading the previous result and at most a one-element float
    constant; returns (chain, Q params) or (None, None)."""
    chain, node = [], first
    while node is not None and len(chain) < _LOOKUP_MAX_CHAIN:
        if node.provider != provider or node.domain != "" or len(node.outputs) != 1 or node.subgraphs:
            return None, None
        if node.op_type == "QuantizeLinear":
            q = _params(view, node) if node.inputs[0] == value else None
            if q is None or not q.per_tensor or _int_type(view, q) is None or not chain:
                return None, None
            return chain, q
        if node.op_type in _UNARY:
            if node.inputs != [value]:
                return None, None
        elif node.op_type in _BINARY and len(node.inputs) == 2:
            other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
            c = view.const(other)
            if other == value or c is None or c.size != 1 or c.dtype != _F32:
                return None, None
        else:
            return None, None
        chain.append(node)
        value = node.outputs[0]
        node = view.only_reader(value)
    return None, None


def _lookup_table(view: GraphView, dq: _Quant, chain, q: _Quant, in_dt: np.dtype) -> np.ndarray | None:
    """The Q output for each of the 256 inputs, lowest first, computed by the nodes' own
    kernels: exactly what the graph computes."""
    ctx = view.ctx
    lo, hi = (-128, 127) if in_dt == np.dtype(np.int8) else (0, 255)
    v = np.arange(lo, hi + 1).astype(in_dt)
    flowing = dq.node.inputs[0]
    try:
        for node in [dq.node, *chain, q.node]:
            args = []
            for name in node.inputs:
                if name == flowing:
                    args.append(v)
                elif not name:
                    args.append(None)
                else:
                    c = view.const(name)
                    if c is None:
                        return None
                    args.append(c)
            out = ctx.cpu_registry.create(ctx.node_info(node)).run(*args)
            v = np.asarray(out[0] if isinstance(out, (tuple, list)) else out)
            flowing = node.outputs[0]
    except Exception:  # noqa: BLE001 - no table, no fusion: the graph runs as written
        return None
    if v.shape != (hi - lo + 1,) or v.dtype not in _BYTE_TYPES:
        return None
    return v


def qdq_lookup_fusion(graph, ctx) -> bool:
    """``Q(f(DQ(x)))`` for elementwise float ``f`` (one or more ops, constants
    one-element) -> ``Gather(table, Cast(x) [+ 128])``: an 8-bit input has 256 values,
    and the table holds what the graph computes for each (int8 inputs are offset to
    non-negative indices, which numpy's take gathers several times faster)."""
    view = GraphView(graph, ctx)
    for dqn in view.candidates("DequantizeLinear"):
        dq = _params(view, dqn)
        if dq is None or not dq.per_tensor or view.const(dq.value) is not None:
            continue
        in_dt = _int_type(view, dq)
        if in_dt is None:
            continue
        for first in list(view.readers(dqn.outputs[0])):
            if not view.free(first):
                continue
            chain, q = _lookup_chain(view, first, dqn.outputs[0], dqn.provider)
            if chain is None:
                continue
            table = _lookup_table(view, dq, chain, q, in_dt)
            if table is None:
                continue
            name = chain[0].name
            idx = view.graph.unique_name(name + "_index")
            new = [view.make_node("Cast", [dq.value], [idx], name + "_index", to=6)]  # int32
            if in_dt == np.dtype(np.int8):
                offset = view.add_constant(name + "_offset", np.array(128, np.int32))
                shifted = view.graph.unique_name(name + "_index")
                new.append(view.make_node("Add", [idx, offset], [shifted], name + "_offset"))
                idx = shifted
            new.append(view.make_node("Gather", [view.add_constant(name + "_table", table), idx], [q.value],
                                      name + "_lookup", axis=0))
            view.replace([*chain, q.node], new)
    return view.finish()


# -- dynamic quantization ---------------------------------------------------------------


def _other(node, name: str) -> str | None:
    """The other input of a two-input node that reads ``name``."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a == name and b != name:
        return b
    if b == name and a != name:
        return a
    return None


def dynamic_quant_matmul_fusion(graph, ctx) -> bool:
    """``Mul(Cast(MatMulInteger(DynamicQuantizeLinear(x), W)), x_scale * w_scale)
    [+ bias]`` -> com.microsoft DynamicQuantizeMatMul or MatMulIntegerToFloat."""
    view = GraphView(graph, ctx)
    for mmi in view.candidates("MatMulInteger"):
        p = mmi.provider
        ins = list(mmi.inputs) + [""] * (4 - len(mmi.inputs))
        dql = view.producer(ins[0], "DynamicQuantizeLinear")
        if dql is None or dql.provider != p or len(dql.outputs) != 3 or ins[2] != dql.outputs[2]:
            continue
        xq, xs, xzp = dql.outputs
        w = view.const(ins[1])
        if w is None or w.ndim != 2 or w.dtype not in _BYTE_TYPES:
            continue
        wzp = ins[3]
        if wzp:
            z = view.const(wzp)
            if z is None or z.dtype != w.dtype or z.size not in (1, w.shape[1]):
                continue
        cast = view.only_reader(mmi.outputs[0], "Cast")
        if cast is None or cast.provider != p or int(cast.attr("to", 0)) != 1:
            continue
        mul = view.only_reader(cast.outputs[0], "Mul")
        if mul is None or mul.provider != p:
            continue
        scale_name = _other(mul, cast.outputs[0])
        smul = view.producer(scale_name, "Mul") if scale_name else None
        if smul is None or smul.provider != p:
            continue
        ws_name = _other(smul, xs)
        ws = view.const(ws_name) if ws_name else None
        if ws is None or ws.dtype != _F32 or ws.size not in (1, w.shape[1]) or ws.ndim > 1:
            continue
        old = [mmi, cast, mul]
        if view.internal(scale_name, old):
            old.append(smul)
        out = mul.outputs[0]
        bias = ""
        add = view.only_reader(out, "Add")
        if add is not None and add.provider == p:
            b_name = _other(add, out)
            b = view.const(b_name) if b_name else None
            if b is not None and b.dtype == _F32 and b.shape == (w.shape[1],):
                bias = b_name
                old.append(add)
                out = add.outputs[0]
        # x's quantization is fused too when nothing else reads it
        whole = old + [dql]
        if all(view.internal(o, whole) for o in dql.outputs):
            fused = view.make_node("DynamicQuantizeMatMul", _trim([dql.inputs[0], ins[1], ws_name, wzp, bias]), [out],
                                   mmi.name, domain=MS_DOMAIN)
            if view.replace(whole, [fused]):
                continue
        fused = view.make_node("MatMulIntegerToFloat", _trim([xq, ins[1], xs, ws_name, xzp, wzp, bias]), [out],
                               mmi.name, domain=MS_DOMAIN)
        view.replace(old, [fused])
    return view.finish()


def qdq_constant_folding(graph, ctx) -> bool:
    """Constant folding, DequantizeLinear of constants included (after the fusions
    above took the ones they could use)."""
    from .basic import constant_folding

    so = getattr(ctx, "session_options", None)
    if "constant_folding" in set(getattr(so, "disabled_optimizers", None) or ()):
        return False
    # nodes a provider already grouped to compile are left alone: folding only removes
    # nodes, so the others are folded on their own and the order is kept
    frozen = {id(n) for _, cap in getattr(graph, "_fused_groups", []) for n in cap.nodes}
    if not frozen:
        return constant_folding(graph, ctx, fold_dequantize=True)
    every = list(graph.nodes)
    graph.nodes = [n for n in every if id(n) not in frozen]
    try:
        changed = constant_folding(graph, ctx, fold_dequantize=True)
    finally:
        kept = {id(n) for n in graph.nodes}
        graph.nodes = [n for n in every if id(n) in frozen or id(n) in kept]
    return changed


def register(reg) -> None:
    """Add the quantization fusions (level 2) to a ``TransformerRegistry``."""
    from ..options import GraphOptimizationLevel

    extended = GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    reg.add("qdq_conv_fusion", qdq_conv_fusion, extended)
    reg.add("qdq_matmul_fusion", qdq_matmul_fusion, extended)
    reg.add("qdq_gemm_fusion", qdq_gemm_fusion, extended)
    reg.add("qdq_binary_fusion", qdq_binary_fusion, extended)
    reg.add("qdq_pool_fusion", qdq_pool_fusion, extended)
    reg.add("qdq_drop_fusion", qdq_drop_fusion, extended)
    reg.add("qdq_lookup_fusion", qdq_lookup_fusion, extended)
    reg.add("dynamic_quant_matmul_fusion", dynamic_quant_matmul_fusion, extended)
    reg.add("qdq_constant_folding", qdq_constant_folding, extended)

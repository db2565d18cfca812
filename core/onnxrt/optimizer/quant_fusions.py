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
  tensor, or ``b`` a constant 2-D weight per column); ``MatMul(DQ(a), DQ(b))`` read
  as float -> com.microsoft
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
- ``qdq_lookup_fusion``: elementwise work ``f`` on one 8-bit ``x`` alone, ending in an
  8-bit value: float ops between ``DQ(x)`` and a ``Q`` (constants one-element; Q/DQ
  pairs and several reads of ``x`` inside, as in a QDQ Gelu), and QLinearAdd,
  QLinearMul and earlier tables (a QOperator Gelu) -> onnxrt's ``LookupTable`` of what
  ``f`` computes for each 8-bit input (built with the nodes' own kernels, so exact).
- ``dynamic_quant_matmul_fusion``: ``Mul(Cast(MatMulInteger(DynamicQuantizeLinear(x),
  W)), x_scale * w_scale) [+ bias]`` -> com.microsoft ``DynamicQuantizeMatMul`` (or
  ``MatMulIntegerToFloat`` when the quantized ``x`` has other readers).
- ``dynamic_quant_conv_fusion``: ``[Relu](Mul(Cast(ConvInteger(x, W)), x_scale *
  w_scale) [+ bias])`` -> onnxrt's ``ConvIntegerToFloat`` (``ai.onnxrt``).
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
from onnx import TensorProto

from .patterns import MS_DOMAIN, ONNXRT_DOMAIN, GraphView, trim_inputs

__all__ = [
    "dynamic_quant_attention_fusion",
    "dynamic_quant_conv_fusion",
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
_BYTE_ELEM_TYPES = {TensorProto.INT8: np.dtype(np.int8), TensorProto.UINT8: np.dtype(np.uint8)}
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


def _pair_ok(view: GraphView, x: _Quant, w: _Quant) -> bool:
    """Whether onnxruntime has the 8-bit product of activations ``x`` and weights ``w``
    (all but int8 activations with uint8 weights), so a saved optimized model runs there."""
    return not (_int_type(view, x) == np.int8 and _int_type(view, w) == np.uint8)


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
        if not _io_ok(view, x, w, y) or not x.per_tensor or not _pair_ok(view, x, w):
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
        if not _io_ok(view, a, b) or not a.per_tensor or not _pair_ok(view, a, b):
            continue
        y = _q_after(view, mm.outputs[0], p)
        # QLinearMatMul takes b per tensor, or a constant 2-D b per column (a scale and
        # a zero point for each of its N columns, as onnxruntime's kernel does)
        if y is not None and _int_type(view, y) is not None and (b.per_tensor or _const_b_ok(view, b, 1)):
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
        if not _io_ok(view, a, b) or not (a.per_tensor and b.per_tensor) or not _pair_ok(view, a, b):
            continue
        bq = view.const(b.value)
        if bq is None or bq.ndim != 2:
            continue
        n = bq.shape[0] if int(gemm.attr("transB", 0)) else bq.shape[1]
        c = gemm.inputs[2] if len(gemm.inputs) > 2 else ""
        # QGemm scales the int32 bias with the product (alpha * (A B + C)): a bias
        # joins only at alpha 1, where Gemm's alpha A B + C is the same
        if c and (float(gemm.attr("alpha", 1.0)) != 1.0 or not _bias_fits(view, c, p, a, b, n)):
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
        fused = view.make_node("QGemm", trim_inputs(inputs), [out], gemm.name, domain=MS_DOMAIN,
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
        if not _int_type(view, a) == _int_type(view, b) == _int_type(view, y):
            continue  # one 8-bit type throughout, as onnxruntime's QLinearAdd/Mul take
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
        # MaxPool picks the largest integer, the largest value only where the scale is
        # positive (a negative one orders them the other way)
        if node.op_type == "MaxPool" and not float(x.scale_value.reshape(())) > 0:
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
#: most nodes one lookup replaces (a QDQ Gelu is eleven)
_LOOKUP_MAX_NODES = 32


#: 8-bit binary ops of com.microsoft: (A, scales and zero points, B) as QLinearAdd's
_QLINEAR_BINARY = {"QLinearAdd", "QLinearMul"}
#: the ops whose output is an 8-bit code, so where a table may end
_BYTE_OUT = {"QuantizeLinear", "QLinearAdd", "QLinearMul", "LookupTable"}


class _Region:
    """The nodes computing elementwise functions of one 8-bit tensor ``x`` alone.

    From ``x`` it takes every node whose inputs are values it already computes or
    one-element constants: per-tensor DequantizeLinear and QuantizeLinear, elementwise
    float ops (:data:`_UNARY`, :data:`_BINARY`), the 8-bit QLinearAdd and QLinearMul
    with constant scales and zero points, and ``LookupTable``. Each of its values is
    then one of 256 values, as ``x`` is, so any 8-bit value in it is a 256-entry table
    of ``x``.
    """

    def __init__(self, view: GraphView, x: str, provider):
        self.view, self.x, self.provider = view, x, provider
        self.rank = view.rank(x)
        self.fixed: dict[str, np.ndarray | None] = {}
        self.values = {x}
        self.nodes: list = []
        todo = [x]
        added: set[int] = set()
        while todo and len(self.nodes) < _LOOKUP_MAX_NODES:
            for r in view.readers(todo.pop()):
                if id(r) not in added and self._joins(r):
                    added.add(id(r))
                    self.nodes.append(r)
                    self.values.add(r.outputs[0])
                    todo.append(r.outputs[0])
        self.nodes = view.in_order(self.nodes)

    def _constant(self, name: str, kinds: str = "f") -> np.ndarray | None:
        """A one-element constant (float32, or of ``kinds``), or DQ of constants, that
        broadcasting with ``x`` leaves ``x``'s shape (no more dimensions than it has)."""
        if name not in self.fixed:
            view = self.view
            c = view.const(name)
            n = view.producers.get(name)
            if c is None and n is not None and n.op_type == "DequantizeLinear" and not n.domain:
                args = [view.const(i) if i else None for i in n.inputs]
                if all(a is not None for a, i in zip(args, n.inputs) if i):
                    c = _run_kernel(view.ctx, n, args)
            if c is not None and (c.size != 1 or (c.ndim and (self.rank or 0) < c.ndim)):
                c = None
            self.fixed[name] = c  # each name's value worked out once, whatever kinds ask
        c = self.fixed[name]
        if c is None or c.dtype.kind not in kinds or (c.dtype.kind == "f" and c.dtype != _F32):
            return None
        return c

    def _joins(self, node) -> bool:
        view = self.view
        if (not view.free(node) or node.provider != self.provider or len(node.outputs) != 1 or node.subgraphs):
            return False
        ins = node.inputs
        if node.domain == MS_DOMAIN and node.op_type in _QLINEAR_BINARY and len(ins) in (7, 8):
            if not all(view.const(ins[i]) is not None for i in (1, 4, 6)):
                return False
            if not all(view.const(ins[i]) is not None for i in (2, 5, 7) if i < len(ins) and ins[i]):
                return False
            mine = [ins[0] in self.values, ins[3] in self.values]
            return any(mine) and all(m or self._constant(ins[i], "iu") is not None for m, i in zip(mine, (0, 3)))
        if node.domain == ONNXRT_DOMAIN and node.op_type == "LookupTable":
            return len(ins) == 2 and ins[0] in self.values and view.const(ins[1]) is not None
        if node.domain != "":
            return False
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            q = _params(view, node)
            # (its scale and zero point are constants, never values of the region)
            return q is not None and q.per_tensor and ins[0] in self.values and _int_type(view, q) is not None
        if node.op_type in _UNARY:
            return len(ins) == 1 and ins[0] in self.values
        if node.op_type in _BINARY and len(ins) == 2:
            mine = [i in self.values for i in ins]
            return any(mine) and all(m or self._constant(i) is not None for m, i in zip(mine, ins))
        return False

    def upstream(self, sink) -> list:
        """The region's nodes ``sink`` depends on, ``sink`` included, in graph order."""
        inside = {n.outputs[0]: n for n in self.nodes}
        keep, todo = {id(sink)}, [sink]
        while todo:
            for i in todo.pop().inputs:
                n = inside.get(i)
                if n is not None and id(n) not in keep:
                    keep.add(id(n))
                    todo.append(n)
        return [n for n in self.nodes if id(n) in keep]

    def table(self, nodes, codes: np.ndarray) -> np.ndarray | None:
        """What ``nodes`` (ending in an 8-bit value) compute for each of ``codes``, by
        the nodes' own kernels: exactly what the graph computes."""
        view = self.view
        vals = {self.x: codes}
        try:
            for node in nodes:
                args = []
                for name in node.inputs:
                    if not name:
                        args.append(None)
                    elif name in vals:
                        args.append(vals[name])
                    else:
                        c = view.const(name)
                        args.append(c if c is not None else self._constant(name, "fiu"))
                vals[node.outputs[0]] = _run_kernel(view.ctx, node, args)
        except Exception:  # noqa: BLE001 - no table, no fusion: the graph runs as written
            return None
        v = vals[nodes[-1].outputs[0]]
        if v.shape != codes.shape or v.dtype not in _BYTE_TYPES:
            return None
        return v


def _run_kernel(ctx, node, args) -> np.ndarray:
    """``node``'s first output for ``args``, computed by the CPU provider's kernel."""
    with np.errstate(all="ignore"):  # inf and NaN are values here, as at run time
        out = ctx.cpu_registry.create(ctx.node_info(node)).run(*args)
    return np.asarray(out[0] if isinstance(out, (tuple, list)) else out)


def _worth_a_table(view: GraphView, nodes) -> bool:
    """Whether ``nodes`` hold more than one op besides Q/DQ, or one float op that
    ``qdq_binary_fusion`` does not take: a unary op, or a binary one whose constant is
    a float (not the DequantizeLinear of an 8-bit one: that pair becomes a
    QLinearAdd/QLinearMul, itself a lookup). One LookupTable is one already."""
    ops = [n for n in nodes if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    if len(ops) != 1:
        return len(ops) > 1
    op = ops[0]
    if op.domain != "":
        return False
    if op.op_type in _UNARY:
        return True
    return op.op_type not in ("Add", "Mul") or any(view.producer(i, "DequantizeLinear") is None for i in op.inputs)


#: the inputs of each op that may be an 8-bit tensor a table starts from
_ROOT_INPUTS = {("", "DequantizeLinear"): (0,), (MS_DOMAIN, "QLinearAdd"): (0, 3), (MS_DOMAIN, "QLinearMul"): (0, 3),
                (ONNXRT_DOMAIN, "LookupTable"): (0,)}


def qdq_lookup_fusion(graph, ctx) -> bool:
    """Elementwise work on one 8-bit tensor ``x`` alone ending in an 8-bit value (a
    chain such as ``Q(Erf(Div(DQ(x))))``, a whole QDQ Gelu whose ops are each quantized
    and which reads ``DQ(x)`` twice, or a QOperator Gelu of QLinearAdd and QLinearMul
    nodes) -> one 256-entry table lookup of ``x`` (onnxrt's ``LookupTable``, which a
    provider must have for the fusion to apply): an 8-bit input has 256 values, and
    the table holds what the graph computes for each."""
    view = GraphView(graph, ctx)
    seen: set[str] = set()
    for node in list(view.graph.nodes):
        for i in _ROOT_INPUTS.get((node.domain, node.op_type), ()):
            x = node.inputs[i] if i < len(node.inputs) else ""
            if not x or x in seen or not view.free(node) or view.const(x) is not None:
                continue
            seen.add(x)
            in_dt = _byte_type(view, node, i)
            if in_dt is not None:
                _fuse_region(view, _Region(view, x, node.provider), in_dt)
    return view.finish()


def _byte_type(view: GraphView, node, i: int) -> np.dtype | None:
    """The 8-bit type of ``node``'s input ``i``, or None: as inferred, else from the
    zero point that goes with it (contrib ops' outputs have no inferred type)."""
    dt = _BYTE_ELEM_TYPES.get(view.elem_type(node.inputs[i]))
    if dt is not None:
        return dt
    if node.op_type == "DequantizeLinear":
        q = _params(view, node)
        return None if q is None else _int_type(view, q)
    if node.op_type in _QLINEAR_BINARY:
        zp = view.const(node.inputs[i + 2]) if i + 2 < len(node.inputs) and node.inputs[i + 2] else None
        return zp.dtype if zp is not None and zp.dtype in _BYTE_TYPES else None
    return None


def _fuse_region(view: GraphView, region: _Region, in_dt: np.dtype) -> None:
    """Replace the largest part of ``region`` that ends in an 8-bit value read outside
    it by a table lookup of its tensor."""
    # the latest 8-bit value first: the largest table that is x's alone
    for sink in reversed([n for n in region.nodes if n.op_type in _BYTE_OUT]):
        if not view.free(sink):
            continue
        nodes = region.upstream(sink)
        if not _worth_a_table(view, nodes):
            continue
        # a DequantizeLinear of x itself that others read too (a Conv, say) stays for
        # them; any other value read outside ends the table earlier
        shared = [n for n in nodes[:-1] if any(not view.internal(o, nodes) for o in n.outputs)]
        if any(n.op_type != "DequantizeLinear" or n.inputs[0] != region.x for n in shared):
            continue
        # entry i for the code whose bit pattern is i
        table = region.table(nodes, np.arange(256, dtype=np.uint8).view(in_dt))
        if table is None:
            continue
        first = nodes[0].name
        lookup = view.make_node("LookupTable", [region.x, view.add_constant(first + "_table", table)],
                                [sink.outputs[0]], first + "_lookup", domain=ONNXRT_DOMAIN)
        kept = {id(n) for n in shared}
        if view.replace([n for n in nodes if id(n) not in kept], [lookup]):
            return


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
            inputs = trim_inputs([dql.inputs[0], ins[1], ws_name, wzp, bias])
            fused = view.make_node("DynamicQuantizeMatMul", inputs, [out], mmi.name, domain=MS_DOMAIN)
            if view.replace(whole, [fused]):
                continue
        fused = view.make_node("MatMulIntegerToFloat", trim_inputs([xq, ins[1], xs, ws_name, xzp, wzp, bias]), [out],
                               mmi.name, domain=MS_DOMAIN)
        view.replace(old, [fused])
    return view.finish()


def _channel_bias(b: np.ndarray | None, m: int, rank: int) -> bool:
    """Whether the constant ``b`` is float32 with one value a channel, shaped to add to
    an ``[N, M, ...]`` output of ``rank`` dimensions without changing its shape."""
    if b is None or b.dtype != _F32 or b.size != m:
        return False
    return b.shape in ((1, m) + (1,) * (rank - 2), (m,) + (1,) * (rank - 2))


def dynamic_quant_conv_fusion(graph, ctx) -> bool:
    """``[Relu](Mul(Cast(ConvInteger(x, W, ...)), scale) [+ bias])``, the float end of
    each dynamically quantized convolution that ``quantize_dynamic`` writes (the scale
    ``x_scale * w_scale`` one value, the bias one a channel) -> onnxrt's
    ``ConvIntegerToFloat`` (``ai.onnxrt``), which converts, scales, biases and clamps
    the int32 sums where they are made, each in float32 and rounded as the ops round
    them, instead of four passes over a float32 copy of the output."""
    view = GraphView(graph, ctx)
    for ci in view.candidates("ConvInteger"):
        p = ci.provider
        w = view.const(ci.inputs[1]) if len(ci.inputs) > 1 else None
        if w is None or w.ndim < 3 or w.dtype not in _BYTE_TYPES:
            continue
        cast = view.only_reader(ci.outputs[0], "Cast")
        if cast is None or cast.provider != p or int(cast.attr("to", 0)) != TensorProto.FLOAT:
            continue
        mul = view.only_reader(cast.outputs[0], "Mul")
        if mul is None or mul.provider != p:
            continue
        scale = _other(mul, cast.outputs[0])
        if not scale or not _scalar_scale(view, scale):
            continue
        old, out, bias = [ci, cast, mul], mul.outputs[0], ""
        add = view.only_reader(out, "Add")
        if add is not None and add.provider == p:
            b_name = _other(add, out)
            if b_name and _channel_bias(view.const(b_name), w.shape[0], w.ndim):
                bias = b_name
                old.append(add)
                out = add.outputs[0]
        relu = view.only_reader(out, "Relu")
        fuse_relu = relu is not None and relu.provider == p
        if fuse_relu:
            old.append(relu)
            out = relu.outputs[0]
        ins = list(ci.inputs) + [""] * (4 - len(ci.inputs))
        fused = view.make_node("ConvIntegerToFloat", trim_inputs(ins[:4] + [scale, bias]), [out], ci.name,
                               domain=ONNXRT_DOMAIN, relu=int(fuse_relu))
        for k, v in ci.attrs.items():
            fused.attrs[k] = v
        view.replace(old, [fused])
    return view.finish()


def _scalar_scale(view: GraphView, name: str) -> bool:
    """Whether ``name`` is one float32 value of rank 0: a constant, or the product of
    a DynamicQuantizeLinear's scale and a rank-0 constant (its weight's scale)."""
    c = view.const(name)
    if c is not None:
        return c.dtype == _F32 and c.ndim == 0
    mul = view.producer(name, "Mul")
    if mul is None or len(mul.inputs) != 2:
        return False
    kinds = []
    for i in mul.inputs:
        ic = view.const(i)
        if ic is not None:
            kinds.append(ic.dtype == _F32 and ic.ndim == 0)
        else:
            dql = view.producer(i, "DynamicQuantizeLinear")
            kinds.append(dql is not None and len(dql.outputs) > 1 and dql.outputs[1] == i)
    return all(kinds)


def dynamic_quant_attention_fusion(graph, ctx) -> bool:
    """``QAttention(DynamicQuantizeLinear(x))`` -> onnxrt's ``DynamicQuantizeAttention``
    (``ai.onnxrt``), which quantizes the float32 input itself: what
    ``onnxruntime.quantization.quantize_dynamic`` writes before every attention layer
    of a BERT model, fused as :func:`dynamic_quant_matmul_fusion` fuses it before a
    MatMul. The quantized input, its scale and its zero point must be QAttention's
    inputs 0, 3 and 6 and read nowhere else; those two inputs are left empty."""
    view = GraphView(graph, ctx)
    for att in view.candidates("QAttention", MS_DOMAIN):
        ins = list(att.inputs) + [""] * (7 - len(att.inputs))
        dql = view.producer(ins[0], "DynamicQuantizeLinear")
        if dql is None or dql.provider != att.provider or len(dql.outputs) != 3:
            continue
        # each of the three read once, where QAttention takes it, and by nothing else
        if [(i, n) for i, n in enumerate(att.inputs) if n in dql.outputs] != list(zip((0, 3, 6), dql.outputs)):
            continue
        if not all(view.internal(o, [dql, att]) for o in dql.outputs):
            continue
        inputs = [dql.inputs[0]] + ins[1:3] + [""] + ins[4:6] + [""] + ins[7:]
        fused = view.make_node("DynamicQuantizeAttention", trim_inputs(inputs), att.outputs, att.name,
                               domain=ONNXRT_DOMAIN)
        fused.attrs.update(att.attrs)
        view.replace([dql, att], [fused])
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
    # before the binary fusion, which would make the float Add and Mul of a QDQ Gelu
    # separate 8-bit ops
    reg.add("qdq_lookup_fusion", qdq_lookup_fusion, extended)
    reg.add("qdq_binary_fusion", qdq_binary_fusion, extended)
    reg.add("qdq_pool_fusion", qdq_pool_fusion, extended)
    reg.add("qdq_drop_fusion", qdq_drop_fusion, extended)
    reg.add("dynamic_quant_matmul_fusion", dynamic_quant_matmul_fusion, extended)
    reg.add("dynamic_quant_attention_fusion", dynamic_quant_attention_fusion, extended)
    # its ConvIntegerToFloat is onnxrt's own: level 3, as the other fusions into ops only
    # onnxrt runs (fusions.py)
    reg.add("dynamic_quant_conv_fusion", dynamic_quant_conv_fusion, GraphOptimizationLevel.ORT_ENABLE_LAYOUT)
    reg.add("qdq_constant_folding", qdq_constant_folding, extended)

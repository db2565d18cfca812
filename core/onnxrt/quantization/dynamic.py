"""``quantize_dynamic``: integer weights, activations quantized at run time.

Weights become int8 (or uint8) constants; each activation is quantized by a
``DynamicQuantizeLinear`` as the model runs (one per tensor, shared by its readers),
from its own range, so no calibration is needed. The layout is onnxruntime's:

- MatMul: ``MatMulInteger(DynamicQuantizeLinear(x), W)`` cast to float and scaled by
  ``x_scale * w_scale`` (onnxrt and onnxruntime fuse this into ``DynamicQuantizeMatMul``);
- Conv: ``ConvInteger`` the same way, then the bias added in float;
- Gemm (which onnxruntime's tool leaves in float): the MatMul form with ``B``
  transposed ahead of time when ``transB``, ``alpha`` folded into the scale and
  ``beta * C`` added in float.

With ``MatMulConstBOnly`` false (``extra_options``), a MatMul of two activations is
quantized too (both through ``DynamicQuantizeLinear``).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import InvalidArgument
from .graph import (GraphIndex, Names, check_graph, ensure_opset, is_valid, load_input_model, op_counts,
                    save_output_model)
from .options import check_extra_options
from .params import QParams, quantize_weight
from .plan import Role, select_nodes
from .qdq import drop_unused_initializers
from .report import QuantizationReport
from .types import QuantType, as_quant_type

__all__ = ["quantize_dynamic", "DEFAULT_DYNAMIC_OPS"]

#: The op types ``quantize_dynamic`` quantizes by default.
DEFAULT_DYNAMIC_OPS = ("MatMul", "Conv", "Gemm")
_ROLES = {"MatMul": Role((0, 1), weight=1), "Conv": Role((0,), weight=1, bias=2),
          "Gemm": Role((0,), weight=1, bias=2)}


class _Dynamic:
    def __init__(self, model: onnx.ModelProto, weight_type: QuantType, per_channel: bool, reduce_range: bool,
                 options: dict):
        self.model = model
        self.index = GraphIndex(model)
        self.names = Names(model.graph)
        self.wt = weight_type
        self.per_channel = per_channel
        self.reduce_range = reduce_range
        self.sym = bool(options.get("WeightSymmetric", weight_type == QuantType.QInt8))
        self.const_b_only = bool(options.get("MatMulConstBOnly", True))
        self.inits: list = []
        self.dql: dict[str, tuple[str, str, str]] = {}
        self.skipped: dict[str, str] = {}

    def init(self, base: str, value: np.ndarray) -> str:
        name = self.names(base)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def dynamic_input(self, t: str, out: list) -> tuple[str, str, str]:
        """``DynamicQuantizeLinear(t)``'s three outputs, written once per tensor."""
        if t not in self.dql:
            q, s, z = (self.names(f"{t}_quantized"), self.names(f"{t}_scale"), self.names(f"{t}_zero_point"))
            out.append(helper.make_node("DynamicQuantizeLinear", [t], [q, s, z],
                                        name=self.names(f"{t}_DynamicQuantizeLinear")))
            self.dql[t] = (q, s, z)
        return self.dql[t]

    def weight(self, src: str, w: np.ndarray, axis: int | None) -> tuple[str, QParams, str]:
        codes, qp = quantize_weight(w, self.wt, self.sym, axis is not None, axis or 0, self.reduce_range)
        q = self.init(f"{src}_quantized", codes)
        z = self.init(f"{q}_zero_point", np.asarray(qp.zero_point))
        return q, qp, z

    def why_not(self, node: onnx.NodeProto) -> str | None:
        for t in node.input[:1]:
            if t in self.index.types and not self.index.is_float(t):
                return f"its input {t!r} is not float32"
        w = self.index.constant(node.input[1]) if len(node.input) > 1 else None
        if node.op_type == "MatMul" and w is None and self.const_b_only:
            return "B is not a constant (MatMulConstBOnly)"
        if node.op_type in ("Conv", "Gemm") and w is None:
            return "its weight is not a constant"
        if node.op_type == "Gemm":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if attrs.get("transA", 0):
                return "transA is set"
            if len(node.input) > 2 and node.input[2] and self.index.constant(node.input[2]) is None:
                return "C is not a constant"
            if w.ndim != 2:
                return "B is not 2-D"
        has_bias = len(node.input) > 2 and node.input[2]
        if node.op_type == "Conv" and has_bias and self.index.constant(node.input[2]) is None:
            return "its bias is not a constant"
        return None

    def rewrite(self, node: onnx.NodeProto, out: list) -> None:
        op, y = node.op_type, node.output[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        xq, xs, xz = self.dynamic_input(node.input[0], out)
        w = self.index.constant(node.input[1])
        if op == "Gemm" and attrs.get("transB", 0):
            w = np.ascontiguousarray(w.T)
        if w is None:  # MatMul of two activations
            bq, bs, bz = self.dynamic_input(node.input[1], out)
            w_scale = bs
        else:
            axis = None
            if self.per_channel:
                axis = 0 if op == "Conv" else (1 if w.ndim == 2 else None)
            bq, qp, bz = self.weight(node.input[1], w, axis)
            scale = np.asarray(qp.scale, dtype=np.float32)
            if op == "Gemm":
                scale = (scale * np.float32(attrs.get("alpha", 1.0))).astype(np.float32)
            if op == "Conv" and scale.ndim == 1:
                scale = scale.reshape(1, -1, *([1] * (w.ndim - 2)))
            w_scale = self.init(f"{node.input[1]}_scale", scale)
        acc = self.names(f"{y}_quant")
        if op == "Conv":
            conv_attrs = {k: v for k, v in attrs.items()}
            out.append(helper.make_node("ConvInteger", [xq, bq, xz, bz], [acc], name=self.names(node.name + "_quant"),
                                        **conv_attrs))
        else:
            out.append(helper.make_node("MatMulInteger", [xq, bq, xz, bz], [acc],
                                        name=self.names(node.name + "_quant")))
        cast = self.names(f"{acc}_cast_output")
        out.append(helper.make_node("Cast", [acc], [cast], to=TensorProto.FLOAT, name=self.names(f"{acc}_cast")))
        scales = self.names(f"{y}_scales_mul")
        out.append(helper.make_node("Mul", [xs, w_scale], [scales], name=self.names(f"{y}_scales_mul_node")))
        bias = None
        if op in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2]:
            b = self.index.constant(node.input[2])
            if op == "Gemm":
                b = (b * np.float32(attrs.get("beta", 1.0))).astype(np.float32)
            else:
                b = b.reshape(1, -1, *([1] * (w.ndim - 2)))
            bias = self.init(f"{node.input[2]}_reshaped" if op == "Conv" else f"{node.input[2]}_scaled", b)
        scaled = self.names(f"{y}_scaled") if bias else y
        out.append(helper.make_node("Mul", [cast, scales], [scaled], name=self.names(f"{y}_scales_mul_quant")))
        if bias:
            out.append(helper.make_node("Add", [scaled, bias], [y], name=self.names(f"{y}_bias_add")))


def quantize_dynamic(
    model_input,
    model_output,
    op_types_to_quantize: Sequence[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    weight_type: QuantType = QuantType.QInt8,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    extra_options: dict[str, Any] | None = None,
) -> QuantizationReport:
    """Quantize ``model_input``'s weights to integers, its activations at run time, and
    save the model to ``model_output`` (onnxruntime's signature; see the module doc).

    :param model_input: a path, serialized bytes or an ``onnx.ModelProto``.
    :param model_output: the path to write; ``None`` only returns the model in the report.
    :param op_types_to_quantize: among MatMul, Conv and Gemm (default all three).
    :param per_channel: weights with one scale per output channel.
    :param reduce_range: 7-bit weights.
    :param weight_type: :class:`QuantType` QInt8 (default) or QUInt8.
    :param nodes_to_quantize: quantize only these nodes (by name).
    :param nodes_to_exclude: leave these nodes in float.
    :param use_external_data_format: write the weights to ``model_output + ".data"``.
    :param extra_options: ``WeightSymmetric``, ``MatMulConstBOnly`` (default true).
    :returns: a :class:`QuantizationReport` (onnxruntime returns ``None``).
    """
    wt = as_quant_type(weight_type, "weight_type")
    if wt not in (QuantType.QInt8, QuantType.QUInt8):
        raise InvalidArgument(f"quantize_dynamic writes 8-bit weights: weight_type must be QInt8 or QUInt8, not {wt}")
    options = check_extra_options(extra_options)
    original = load_input_model(model_input)
    size_before = original.ByteSize()  # the writers edit the model in place
    valid = is_valid(original)
    model = ensure_opset(original, 11)
    before = op_counts(model)
    candidates = select_nodes(model, op_types_to_quantize or DEFAULT_DYNAMIC_OPS, nodes_to_quantize,
                              nodes_to_exclude, roles=_ROLES)
    q = _Dynamic(model, wt, per_channel, reduce_range, options)
    chosen = {}
    for n in candidates:
        why = q.why_not(n)
        if why:
            q.skipped[n.name] = why
        else:
            chosen[n.name] = n
    nodes: list[onnx.NodeProto] = []
    for n in model.graph.node:
        if n.name in chosen:
            q.rewrite(n, nodes)
        else:
            nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(q.inits)
    drop_unused_initializers(model)
    check_graph(model, valid)
    if model_output is not None:
        save_output_model(model, model_output, use_external_data_format)
    return QuantizationReport(model=model, format="dynamic", before=before, after=op_counts(model),
                              quantized=sorted(chosen), skipped=q.skipped, size_before=size_before,
                              size_after=model.ByteSize(),
                              output=os.fspath(model_output) if model_output is not None else None)

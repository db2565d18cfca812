"""Which nodes and tensors a static quantization rewrites, and with which parameters.

Both writers (:mod:`.qdq` and :mod:`.qoperator`) start from a :class:`QuantPlan`: the
nodes to quantize, each quantized activation's scale and zero point (from its
calibrated range), and each weight's and bias's integer codes.

Per op type (:data:`ROLES`): which inputs are activations, which is a weight
(quantized per tensor, or per output channel), which a bias (int32 codes of scale
``input_scale * weight_scale``, zero point 0), and whether the output has its own
range or keeps its input's parameters (data movement and max pooling, which pick
values without computing new ones, so their integer codes pass through unchanged).
A ReLU right after a quantized Conv, Gemm, MatMul or Add is folded into it, as
onnxruntime does: the producer's output takes the ReLU's range, which starts at 0, so
the quantization's own clamp at the zero point is the ReLU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from ..errors import InvalidArgument
from ..ir.proto_edits import name_nodes
from .graph import GraphIndex
from .params import QParams, quantize_bias, quantize_weight, scale_zero_point
from .types import QuantType

__all__ = ["Role", "ROLES", "DEFAULT_STATIC_OPS", "QuantPlan", "calibration_tensors", "fold_relus", "make_plan"]


@dataclass(frozen=True)
class Role:
    """What a quantized op's inputs and output are."""

    activations: tuple[int, ...]
    weight: int | None = None
    bias: int | None = None
    output: str = "own"  # "own": its own range; "same": its input's parameters


ROLES: dict[str, Role] = {
    "Conv": Role((0,), weight=1, bias=2),
    "Gemm": Role((0, 1), weight=1, bias=2),
    "MatMul": Role((0, 1), weight=1),
    "Add": Role((0, 1)),
    "Mul": Role((0, 1)),
    "Relu": Role((0,)),
    "AveragePool": Role((0,)),
    "GlobalAveragePool": Role((0,)),
    "MaxPool": Role((0,), output="same"),
    "Reshape": Role((0,), output="same"),
    "Transpose": Role((0,), output="same"),
    "Flatten": Role((0,), output="same"),
    "Squeeze": Role((0,), output="same"),
    "Unsqueeze": Role((0,), output="same"),
}

#: The op types ``quantize_static`` quantizes when ``op_types_to_quantize`` is not given.
DEFAULT_STATIC_OPS = tuple(ROLES)

#: Ops a ReLU folds into.
_RELU_HOSTS = ("Conv", "Gemm", "MatMul", "Add")


@dataclass
class QuantPlan:
    """What a static quantization writes (see the module doc)."""

    model: onnx.ModelProto
    index: GraphIndex
    activation_type: QuantType
    weight_type: QuantType
    nodes: dict[str, onnx.NodeProto] = field(default_factory=dict)
    tensors: dict[str, QParams] = field(default_factory=dict)
    weights: dict[tuple[str, int], tuple[np.ndarray, QParams]] = field(default_factory=dict)
    biases: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    constants: dict[tuple[str, int], tuple[np.ndarray, QParams]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    folded_relus: list[str] = field(default_factory=list)


def _weight_axis(node: onnx.NodeProto, w: np.ndarray) -> int | None:
    """The output-channel axis of a node's weight (``None``: only per tensor)."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    if node.op_type == "MatMul":
        return 1 if w.ndim == 2 else None
    return None


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def select_nodes(model: onnx.ModelProto, op_types: Sequence[str] | None, nodes_to_quantize: Sequence[str] | None,
                 nodes_to_exclude: Sequence[str] | None, roles: Mapping[str, Role] = ROLES) -> list[onnx.NodeProto]:
    """The candidate nodes: of a known op type among ``op_types``, named in
    ``nodes_to_quantize`` when given, and not in ``nodes_to_exclude``."""
    name_nodes(model.graph)
    ops = set(op_types) if op_types else set(roles)
    unknown = sorted(ops - set(roles))
    if unknown:
        raise InvalidArgument(f"op_types_to_quantize names ops this quantizer does not handle: {unknown}; "
                              f"it handles {', '.join(sorted(roles))}")
    names = {n.name for n in model.graph.node}
    for what, given in (("nodes_to_quantize", nodes_to_quantize), ("nodes_to_exclude", nodes_to_exclude)):
        missing = sorted(set(given or ()) - names)
        if missing:
            raise InvalidArgument(f"{what} names nodes the model does not have: {missing[:10]}")
    only = set(nodes_to_quantize or ())
    exclude = set(nodes_to_exclude or ())
    return [n for n in model.graph.node
            if n.domain in ("", "ai.onnx") and n.op_type in ops and n.name not in exclude
            and (not only or n.name in only)]


def calibration_tensors(index: GraphIndex, candidates: Sequence[onnx.NodeProto]) -> list[str]:
    """The float activations (inputs and outputs) of the candidate nodes."""
    out: list[str] = []
    for n in candidates:
        role = ROLES[n.op_type]
        for i in role.activations:
            if i < len(n.input) and n.input[i] and n.input[i] not in index.initializers:
                out.append(n.input[i])
        out.extend(o for o in n.output[:1] if o)
    return [t for t in dict.fromkeys(out) if index.is_float(t) or t not in index.types]


def fold_relus(plan: "QuantPlan") -> list[str]:
    """Fold each quantized ReLU into the quantized Conv/Gemm/MatMul/Add before it (when
    it is that output's only reader): the producer writes the ReLU's output, with the
    ReLU's parameters. Returns the folded ReLUs' names; edits the plan's model."""
    index = plan.index
    graph_outputs = set(index.graph_outputs)
    folded: list[str] = []
    for relu in [n for n in plan.nodes.values() if n.op_type == "Relu"]:
        src = relu.input[0]
        prod = index.producer.get(src)
        if (prod is None or prod.name not in plan.nodes or prod.op_type not in _RELU_HOSTS
                or len(index.consumers.get(src, [])) != 1 or src in graph_outputs):
            continue
        k = list(prod.output).index(src)
        prod.output[k] = relu.output[0]
        del plan.tensors[src]
        del plan.nodes[relu.name]
        folded.append(relu.name)
    if folded:
        names = set(folded)
        keep = [n for n in plan.model.graph.node if n.name not in names]
        del plan.model.graph.node[:]
        plan.model.graph.node.extend(keep)
        # the graph now holds copies: the plan's nodes are looked up again by name
        by_name = {n.name: n for n in plan.model.graph.node}
        plan.nodes = {k: by_name[k] for k in plan.nodes}
        plan.index = GraphIndex(plan.model)
    plan.folded_relus = folded
    return folded


def make_plan(model: onnx.ModelProto, candidates: list[onnx.NodeProto], ranges: Mapping[str, tuple[float, float]],
              activation_type: QuantType, weight_type: QuantType, per_channel: bool, reduce_range: bool,
              options: Mapping[str, Any], qoperator: bool) -> QuantPlan:
    """Decide each candidate's fate and compute every parameter (see the module doc)."""
    index = GraphIndex(model)
    plan = QuantPlan(model, index, activation_type, weight_type)
    act_sym = bool(options.get("ActivationSymmetric", False))
    w_sym = bool(options.get("WeightSymmetric", weight_type in (QuantType.QInt8, QuantType.QInt16)))
    selected = {n.name for n in candidates}

    def act_params(t: str) -> QParams | None:
        if t in plan.tensors:
            return plan.tensors[t]
        if t not in ranges:
            return None
        lo, hi = ranges[t]
        s, z = scale_zero_point(lo, hi, activation_type, act_sym)
        return QParams(s, z, activation_type)

    for node in model.graph.node:
        if node.name not in selected:
            continue
        role = ROLES[node.op_type]
        why = _unfit(node, role, index, qoperator)
        if why:
            plan.skipped[node.name] = why
            continue
        out = node.output[0]
        if role.output == "same":
            src = node.input[0]
            if src not in plan.tensors:
                plan.skipped[node.name] = "its input is not quantized"
                continue
            plan.nodes[node.name] = node
            plan.tensors.setdefault(out, plan.tensors[src])
            continue
        inputs: dict[str, QParams] = {}
        weights, consts, bias = {}, {}, None
        ok = True
        positions = sorted(set(role.activations) | ({role.weight} if role.weight is not None else set()))
        for i in positions:
            if i >= len(node.input) or not node.input[i]:
                continue
            t = node.input[i]
            value = index.constant(t)
            if value is not None:
                if i == role.weight:
                    axis = _weight_axis(node, value) if per_channel else None
                    codes, qp = quantize_weight(value, weight_type, w_sym, axis is not None,
                                                axis if axis is not None else 0, reduce_range)
                    weights[i] = (codes, qp)
                else:
                    codes, qp = quantize_weight(value, activation_type, act_sym)
                    consts[i] = (codes, qp)
                continue
            qp = act_params(t)
            if qp is None:
                plan.skipped[node.name] = f"no calibrated range for its input {t!r}"
                ok = False
                break
            inputs[t] = qp
        if not ok:
            continue
        if node.op_type == "Conv" and 1 not in weights:
            plan.skipped[node.name] = "its weight is not a constant"
            continue
        out_qp = act_params(out)
        if out_qp is None:
            plan.skipped[node.name] = f"no calibrated range for its output {out!r}"
            continue
        if role.bias is not None and role.bias < len(node.input) and node.input[role.bias]:
            b = index.constant(node.input[role.bias])
            w = weights.get(role.weight)
            x_qp = inputs.get(node.input[0])
            if b is not None and w is not None and x_qp is not None and b.ndim == 1 and _attr(node, "beta", 1.0) == 1.0:
                bias = quantize_bias(b, x_qp.scale, w[1].scale)
            elif qoperator:
                plan.skipped[node.name] = "its bias cannot be quantized (not a 1-D constant, or beta is not 1)"
                continue
        plan.nodes[node.name] = node
        for t, qp in inputs.items():
            plan.tensors.setdefault(t, qp)
        plan.tensors.setdefault(out, out_qp)
        for i, w in weights.items():
            plan.weights[(node.name, i)] = w
        for i, c in consts.items():
            plan.constants[(node.name, i)] = c
        if bias is not None:
            plan.biases[(node.name, role.bias)] = bias
    return plan


def _unfit(node: onnx.NodeProto, role: Role, index: GraphIndex, qoperator: bool) -> str | None:
    """Why ``node`` cannot be quantized, or ``None``."""
    for i in role.activations:
        if i < len(node.input) and node.input[i]:
            t = node.input[i]
            if t in index.types and not index.is_float(t):
                return f"its input {t!r} is not float32"
    if node.output and node.output[0] in index.types and not index.is_float(node.output[0]):
        return "its output is not float32"
    if node.op_type == "Gemm" and qoperator and index.constant(node.input[1]) is None:
        return "QGemm needs a constant B"
    if node.op_type == "MatMul" and qoperator:
        for t in node.input[:2]:
            v = index.constant(t)
            if v is not None and v.ndim != 2:
                return "QLinearMatMul needs a 2-D constant operand"
    return None

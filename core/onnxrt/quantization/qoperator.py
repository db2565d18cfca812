"""The QOperator writer: quantized nodes become integer operators.

| float op | written as |
|---|---|
| Conv | ``QLinearConv`` (int32 bias) |
| MatMul | ``QLinearMatMul`` |
| Gemm | ``com.microsoft.QGemm`` (int32 bias, ``alpha``, ``transA``, ``transB``) |
| Add, Mul | ``com.microsoft.QLinearAdd``, ``QLinearMul`` |
| GlobalAveragePool, AveragePool | ``com.microsoft.QLinearGlobalAveragePool``, ``QLinearAveragePool`` |
| MaxPool, Reshape, Transpose, Flatten, Squeeze, Unsqueeze | the same op on the integer codes |

Each quantized tensor ``t`` is held as codes ``t_quantized`` with ``t_scale`` and
``t_zero_point``. A float reader of ``t`` (an op left in float, a graph output) gets it
from a ``DequantizeLinear`` written just before the first such reader; a quantized
op reading a float tensor gets its codes from a ``QuantizeLinear``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import MS_DOMAIN, Names, add_domain
from .params import QParams
from .plan import QuantPlan
from .qdq import drop_unused_initializers

__all__ = ["write_qoperator"]

_SAME = ("MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze")
_CONVERTED = ("Conv", "MatMul", "Gemm", "Add", "Mul", "GlobalAveragePool", "AveragePool") + _SAME


class _Writer:
    def __init__(self, plan: QuantPlan):
        self.plan = plan
        self.names = Names(plan.model.graph)
        self.inits: list = []
        self.nodes: list[onnx.NodeProto] = []
        self.codes: dict[str, str] = {}  # float tensor -> its codes
        self.params: dict[str, tuple[str, str]] = {}
        self.floats: set[str] = set(plan.index.graph_inputs) | set(plan.index.initializers)

    def qparams(self, t: str, qp: QParams) -> tuple[str, str]:
        if t not in self.params:
            s, z = self.names(f"{t}_scale"), self.names(f"{t}_zero_point")
            self.inits.append(numpy_helper.from_array(np.asarray(qp.scale, dtype=np.float32), s))
            self.inits.append(numpy_helper.from_array(np.asarray(qp.zero_point), z))
            self.params[t] = (s, z)
        return self.params[t]

    def quantized(self, t: str) -> tuple[str, str, str]:
        """(codes, scale, zero point) of activation ``t``, quantizing it here if needed."""
        s, z = self.qparams(t, self.plan.tensors[t])
        if t not in self.codes:
            q = self.names(f"{t}_quantized")
            self.nodes.append(helper.make_node("QuantizeLinear", [t, s, z], [q],
                                               name=self.names(f"{t}_QuantizeLinear")))
            self.codes[t] = q
        return self.codes[t], s, z

    def constant(self, src: str, codes: np.ndarray, qp: QParams) -> tuple[str, str, str]:
        q = self.names(f"{src}_quantized")
        self.inits.append(numpy_helper.from_array(codes, q))
        s, z = self.names(f"{q}_scale"), self.names(f"{q}_zero_point")
        self.inits.append(numpy_helper.from_array(np.asarray(qp.scale, dtype=np.float32), s))
        self.inits.append(numpy_helper.from_array(np.asarray(qp.zero_point), z))
        return q, s, z

    def operand(self, node: onnx.NodeProto, i: int) -> tuple[str, str, str]:
        key = (node.name, i)
        if key in self.plan.weights:
            return self.constant(node.input[i], *self.plan.weights[key])
        if key in self.plan.constants:
            return self.constant(node.input[i], *self.plan.constants[key])
        return self.quantized(node.input[i])

    def bias(self, node: onnx.NodeProto, i: int) -> str:
        codes, _ = self.plan.biases[(node.name, i)]
        name = self.names(f"{node.input[i]}_quantized")
        self.inits.append(numpy_helper.from_array(codes, name))
        return name

    def output(self, t: str) -> tuple[str, str, str]:
        q = self.names(f"{t}_quantized")
        self.codes[t] = q
        s, z = self.qparams(t, self.plan.tensors[t])
        return q, s, z

    def need_float(self, t: str) -> None:
        if t and t not in self.floats and t in self.codes:
            s, z = self.params[t]
            self.nodes.append(helper.make_node("DequantizeLinear", [self.codes[t], s, z], [t],
                                               name=self.names(f"{t}_DequantizeLinear")))
            self.floats.add(t)

    def convert(self, node: onnx.NodeProto) -> None:
        op = node.op_type
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        out = node.output[0]
        name = node.name + "_quant"
        if op == "Conv":
            x, w = self.operand(node, 0), self.operand(node, 1)
            ins = [*x, *w]
            y = self.output(out)
            ins += [y[1], y[2]]
            if (node.name, 2) in self.plan.biases:
                ins.append(self.bias(node, 2))
            self.nodes.append(helper.make_node("QLinearConv", ins, [y[0]], name=name, **attrs))
        elif op == "MatMul":
            a, b = self.operand(node, 0), self.operand(node, 1)
            y = self.output(out)
            self.nodes.append(helper.make_node("QLinearMatMul", [*a, *b, y[1], y[2]], [y[0]], name=name))
        elif op == "Gemm":
            a, b = self.operand(node, 0), self.operand(node, 1)
            c = self.bias(node, 2) if (node.name, 2) in self.plan.biases else ""
            y = self.output(out)
            keep = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
            self.nodes.append(helper.make_node("QGemm", [*a, *b, c, y[1], y[2]], [y[0]], name=name,
                                               domain=MS_DOMAIN, **keep))
        elif op in ("Add", "Mul"):
            a, b = self.operand(node, 0), self.operand(node, 1)
            y = self.output(out)
            self.nodes.append(helper.make_node(f"QLinear{op}", [*a, *b, y[1], y[2]], [y[0]], name=name,
                                               domain=MS_DOMAIN))
        elif op in ("GlobalAveragePool", "AveragePool"):
            x = self.operand(node, 0)
            y = self.output(out)
            extra = {"channels_last": 0} if op == "GlobalAveragePool" else {}
            self.nodes.append(helper.make_node(f"QLinear{op}", [*x, y[1], y[2]], [y[0]], name=name,
                                               domain=MS_DOMAIN, **attrs, **extra))
        else:  # integer data movement: the codes pass through with the input's parameters
            x = self.quantized(node.input[0])
            q = self.names(f"{out}_quantized")
            self.codes[out] = q
            self.params[out] = (x[1], x[2])
            self.nodes.append(helper.make_node(op, [x[0], *node.input[1:]], [q], name=name, **attrs))


def _outer_names(node: onnx.NodeProto) -> list[str]:
    """The names a node's subgraphs read (some from the outer graph)."""
    names: list[str] = []
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                names.extend(i for i in n.input if i)
                names.extend(_outer_names(n))
    return names


def write_qoperator(plan: QuantPlan) -> onnx.ModelProto:
    """The QOperator model of ``plan`` (a new ``ModelProto``)."""
    model = plan.model
    g = model.graph
    w = _Writer(plan)
    ms = False
    for node in list(g.node):
        if node.name in plan.nodes and node.op_type in _CONVERTED:
            w.convert(node)
            ms = ms or w.nodes[-1].domain == MS_DOMAIN
        else:
            for t in list(node.input) + _outer_names(node):
                w.need_float(t)
            w.nodes.append(node)
            w.floats.update(o for o in node.output if o)
    for o in g.output:
        w.need_float(o.name)
    del g.node[:]
    g.node.extend(w.nodes)
    g.initializer.extend(w.inits)
    if ms:
        add_domain(model, MS_DOMAIN, 1)
    drop_unused_initializers(model)
    return model

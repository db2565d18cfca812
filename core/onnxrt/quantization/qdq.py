"""The QDQ writer: float operators kept, with ``QuantizeLinear``/``DequantizeLinear``
pairs on their quantized tensors (onnxruntime's QDQ layout).

- an activation ``t`` is quantized once, right after its producer: the producer now
  writes ``t_QuantizeLinear_Input``, ``QuantizeLinear`` makes the codes and
  ``DequantizeLinear`` writes ``t`` again, so every reader (and a graph output of that
  name) sees the quantized value; a graph input is quantized into ``t_DequantizeLinear_Output``;
- a weight becomes an integer initializer read through ``DequantizeLinear`` (with
  ``axis`` when per channel); a bias becomes int32 codes of scale
  ``input_scale * weight_scale``.

Runtimes that fuse QDQ node units (onnxrt at level 2, onnxruntime) run these as
integer ops; a runtime that does not runs the float ops on dequantized values.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import Names
from .params import QParams
from .plan import QuantPlan

__all__ = ["write_qdq"]


def _params(plan: QuantPlan, names: Names, base: str, qp: QParams, inits: list) -> tuple[str, str]:
    s, z = names(f"{base}_scale"), names(f"{base}_zero_point")
    inits.append(numpy_helper.from_array(np.asarray(qp.scale, dtype=np.float32), s))
    inits.append(numpy_helper.from_array(np.asarray(qp.zero_point), z))
    return s, z


def write_qdq(plan: QuantPlan) -> onnx.ModelProto:
    """The QDQ model of ``plan`` (a new ``ModelProto``)."""
    model = plan.model
    g = model.graph
    names = Names(g)
    inits: list = []
    head: list[onnx.NodeProto] = []  # weight DQs and graph-input QDQ pairs
    after: dict[str, list[onnx.NodeProto]] = {}  # producer output -> its Q/DQ pair
    renamed_inputs: dict[str, str] = {}  # graph input -> its DQ output
    producer_rename: dict[str, str] = {}
    qparams: dict[str, tuple[str, str]] = {}
    graph_inputs = set(plan.index.graph_inputs)

    for t, qp in plan.tensors.items():
        s, z = _params(plan, names, t, qp, inits)
        qparams[t] = (s, z)
        q_out = names(f"{t}_QuantizeLinear_Output")
        if t in graph_inputs:
            dq_out = names(f"{t}_DequantizeLinear_Output")
            head.append(helper.make_node("QuantizeLinear", [t, s, z], [q_out], name=names(f"{t}_QuantizeLinear")))
            head.append(helper.make_node("DequantizeLinear", [q_out, s, z], [dq_out],
                                         name=names(f"{t}_DequantizeLinear")))
            renamed_inputs[t] = dq_out
        elif t in plan.index.producer:
            pre = names(f"{t}_QuantizeLinear_Input")
            producer_rename[t] = pre
            after[t] = [
                helper.make_node("QuantizeLinear", [pre, s, z], [q_out], name=names(f"{t}_QuantizeLinear")),
                helper.make_node("DequantizeLinear", [q_out, s, z], [t], name=names(f"{t}_DequantizeLinear")),
            ]

    replaced: dict[tuple[str, int], str] = {}
    shared: dict[tuple[str, int | None, bytes], str] = {}
    for (node_name, i), (codes, qp) in list(plan.weights.items()) + list(plan.constants.items()):
        node = plan.nodes[node_name]
        src = node.input[i]
        key = (src, qp.axis, np.asarray(qp.scale).tobytes())
        if key not in shared:
            q = names(f"{src}_quantized")
            inits.append(numpy_helper.from_array(codes, q))
            s, z = _params(plan, names, q, qp, inits)
            out = names(f"{src}_DequantizeLinear_Output")
            attrs = {"axis": int(qp.axis)} if qp.per_channel else {}
            head.append(helper.make_node("DequantizeLinear", [q, s, z], [out], name=names(f"{src}_DequantizeLinear"),
                                         **attrs))
            shared[key] = out
        replaced[(node_name, i)] = shared[key]
    for (node_name, i), (codes, scale) in plan.biases.items():
        node = plan.nodes[node_name]
        src = node.input[i]
        q = names(f"{src}_quantized")
        s, z = names(f"{q}_scale"), names(f"{q}_zero_point")
        inits.append(numpy_helper.from_array(codes, q))
        inits.append(numpy_helper.from_array(np.asarray(scale, dtype=np.float32), s))
        inits.append(numpy_helper.from_array(np.zeros(np.asarray(scale).shape, dtype=np.int32), z))
        out = names(f"{src}_DequantizeLinear_Output")
        attrs = {"axis": 0} if np.asarray(scale).ndim == 1 else {}
        head.append(helper.make_node("DequantizeLinear", [q, s, z], [out], name=names(f"{src}_DequantizeLinear"),
                                     **attrs))
        replaced[(node_name, i)] = out

    nodes: list[onnx.NodeProto] = list(head)
    for node in g.node:
        for i, t in enumerate(node.input):
            if (node.name, i) in replaced:
                node.input[i] = replaced[(node.name, i)]
            elif t in renamed_inputs:
                node.input[i] = renamed_inputs[t]
        tail = []
        for k, o in enumerate(node.output):
            if o in producer_rename:
                node.output[k] = producer_rename[o]
                tail.extend(after[o])
        nodes.append(node)
        nodes.extend(tail)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(inits)
    drop_unused_initializers(model)
    return model


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove the float weights no node reads any more."""
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for n in g.node:  # subgraphs read outer names too
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                used |= {i for sn in sub.node for i in sn.input}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        removed = {t.name for t in g.initializer} - {t.name for t in keep}
        del g.initializer[:]
        g.initializer.extend(keep)
        # models of IR version 3 list their initializers as inputs as well
        inputs = [v for v in g.input if v.name not in removed]
        del g.input[:]
        g.input.extend(inputs)

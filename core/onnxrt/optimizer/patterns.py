"""What fusions share: a read-only view of the graph and a safe way to replace nodes.

A fusion scans the graph once, matches small node patterns, and replaces each match
with new nodes. :class:`GraphView` answers the questions every match asks (who
produces this value, who reads it, is it a constant, is it a graph output) and
:meth:`GraphView.replace` enforces the rules every replacement must keep:

- values the pattern swallows are read by nobody outside it and are not graph outputs;
- nodes compiled into a provider's fused group are never touched;
- after partitioning, every replaced node belongs to one provider, which must have a
  kernel for every new node, and the new nodes belong to it too;
- a node is rewritten at most once per scan, so the maps a scan read stay true.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from ..run.feeds import shape_of

__all__ = ["MS_DOMAIN", "ONNXRT_DOMAIN", "GraphView", "trim_inputs"]

MS_DOMAIN = "com.microsoft"
#: onnxrt's own ops, which only its fusions make (``LookupTable``,
#: ``DynamicQuantizeAttention``)
ONNXRT_DOMAIN = "ai.onnxrt"


def trim_inputs(inputs) -> list:
    """``inputs`` without trailing empty (omitted optional) names, as a fused node
    lists them."""
    inputs = list(inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


class GraphView:
    """Producers, consumers and constants of ``graph``, as of the start of a scan."""

    def __init__(self, graph, ctx):
        self.graph = graph
        self.ctx = ctx
        self.producers = graph.producers()
        self.consumers = graph.consumers()
        self.outputs = set(graph.output_names())
        self.inputs = set(graph.input_names())
        self.frozen = {id(n) for _, cap in getattr(graph, "_fused_groups", []) for n in cap.nodes}
        self.touched: set[int] = set()
        self.changed = False
        self._order = {id(n): i for i, n in enumerate(graph.nodes)}

    # -- questions ------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant initializer (never one a feed may override)."""
        if not name or name in self.inputs:
            return None
        return self.graph.initializers.get(name)

    def scalar(self, name: str, operand: str | None = None) -> float | None:
        """A constant holding exactly one number, as a float. One of rank 2 or more is
        taken only where it cannot raise the rank of what it broadcasts with: when
        ``operand``'s rank is known and at least its own (a ``[1, 1, 1, 1, 1]``
        factor makes a rank-4 value rank 5, which a fused op would not)."""
        c = self.const(name)
        if c is None or c.size != 1 or c.dtype.kind not in "fiu":
            return None
        if c.ndim > 1 and (operand is None or (self.rank(operand) or 0) < c.ndim):
            return None
        return float(c.reshape(-1)[0])

    def is_scalar(self, name: str, value: float, rtol: float = 1e-4, operand: str | None = None) -> bool:
        """Whether ``name`` is a one-element constant equal to ``value``: exactly for a
        value float32 holds exactly and a pattern means exactly (the 2 of a square, the
        1 of ``1 + erf``, a half), within ``rtol`` for the others (``sqrt(2)``,
        ``0.044715``), which exporters write to varying precision."""
        v = self.scalar(name, operand)
        if v is None:
            return False
        if float(np.float32(value)) == value and (value * 2).is_integer():
            return v == value
        return abs(v - value) <= rtol * max(abs(value), 1e-6)

    def free(self, node) -> bool:
        """Whether ``node`` may still be matched in this scan."""
        return node is not None and id(node) not in self.touched and id(node) not in self.frozen

    def candidates(self, op_types, domain: str = ""):
        """The graph's nodes of ``op_types`` (a name or a collection of names) in
        ``domain`` that are still free, in graph order; nodes added during the scan are
        not visited, and a node is checked for freedom when its turn comes."""
        wanted = {op_types} if isinstance(op_types, str) else set(op_types)
        for node in list(self.graph.nodes):
            if node.op_type in wanted and node.domain == domain and self.free(node):
                yield node

    def producer(self, name: str, op_type: str | None = None, domain: str = ""):
        """The untouched node producing ``name`` (of ``op_type`` if given), or None."""
        n = self.producers.get(name)
        if n is None or not self.free(n):
            return None
        if op_type is not None and (n.op_type != op_type or n.domain != domain):
            return None
        return n

    def readers(self, name: str) -> list:
        """Nodes reading ``name``."""
        return self.consumers.get(name, [])

    def only_reader(self, name: str, op_type: str | None = None, domain: str = ""):
        """The single node reading ``name`` (not a graph output), or None."""
        if name in self.outputs:
            return None
        rs = self.readers(name)
        if len(rs) != 1 or not self.free(rs[0]):
            return None
        n = rs[0]
        if op_type is not None and (n.op_type != op_type or n.domain != domain):
            return None
        return n

    def internal(self, name: str, inside) -> bool:
        """Whether every reader of ``name`` is in ``inside`` and it is no graph output."""
        if name in self.outputs:
            return False
        ids = {id(n) for n in inside}
        return all(id(r) in ids for r in self.readers(name))

    def shape(self, name: str) -> list | None:
        """The known shape of ``name`` (ints, symbolic names, None), or None."""
        c = self.const(name)
        if c is not None:
            return list(c.shape)
        tp = self.graph.value_types.get(name)
        if tp is None or tp.WhichOneof("value") != "tensor_type":
            return None
        return shape_of(tp)

    def rank(self, name: str) -> int | None:
        """The known rank of ``name``, or None."""
        s = self.shape(name)
        return None if s is None else len(s)

    def elem_type(self, name: str) -> int | None:
        """The ONNX element type of ``name``, or None when unknown."""
        c = self.const(name)
        if c is not None:
            return helper.np_dtype_to_tensor_dtype(c.dtype)
        tp = self.graph.value_types.get(name)
        if tp is None or tp.WhichOneof("value") != "tensor_type":
            return None
        return tp.tensor_type.elem_type or None

    def in_order(self, nodes) -> list:
        """``nodes`` (of the graph as the scan began) in graph order."""
        return sorted(nodes, key=lambda n: self._order[id(n)])

    # -- building -------------------------------------------------------------------
    def add_constant(self, base: str, value: np.ndarray) -> str:
        """A new constant initializer; returns its name."""
        name = self.graph.unique_name(base)
        self.graph.initializers[name] = value
        self.graph.value_types[name] = helper.make_tensor_type_proto(
            helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
        return name

    def make_node(self, op_type: str, inputs, outputs, name: str, domain: str = "", **attrs):
        """A new IR node with the graph's opset for ``domain`` (1 for com.microsoft)."""
        from ..ir.graph import Node

        if domain and domain not in self.graph.opsets:
            self.graph.opsets[domain] = 1
        node = Node(op_type=op_type, domain=domain, inputs=list(inputs), outputs=list(outputs),
                    name=self.graph.unique_name(name),
                    opset=self.graph.opsets.get(domain, 1))
        for k, v in attrs.items():
            if v is not None:
                node.attrs[k] = helper.make_attribute(k, v)
        return node

    def replace(self, old: list, new: list) -> bool:
        """Replace the nodes ``old`` by ``new``, if every rule allows it.

        Values produced by ``old`` and not by ``new`` must be read only inside ``old``.
        Returns whether the replacement was made; nothing changes otherwise.
        """
        if not old or any(not self.free(n) for n in old):
            return False
        providers = {n.provider for n in old}
        if len(providers) != 1:
            return False
        provider = providers.pop()
        made = {o for n in new for o in n.outputs if o}
        for n in old:
            for o in n.outputs:
                if o and o not in made and not self.internal(o, old):
                    return False
        if provider is not None:
            for n in new:
                n.provider = provider
                if not self.ctx.provider_has_kernel(provider, n):
                    return False
        at = max(self._order[id(n)] for n in old)
        anchor = next(n for n in old if self._order[id(n)] == at)
        dropped = {id(n) for n in old}
        nodes = []
        for n in self.graph.nodes:
            if n is anchor:
                nodes.extend(new)
            if id(n) not in dropped:
                nodes.append(n)
        self.graph.nodes = nodes
        for n in old + new:
            self.touched.add(id(n))
        for n in new:
            self._order[id(n)] = at
        self.changed = True
        return True

    def bypass(self, old: list, out: str, src: str) -> bool:
        """Drop the nodes ``old``, whose result ``out`` equals ``src``: readers of
        ``out`` read ``src`` instead. Returns whether it was done."""
        if not old or any(not self.free(n) for n in old) or out in self.outputs:
            return False
        if len({n.provider for n in old}) != 1:
            return False
        readers = self.readers(out)
        for r in readers:
            if id(r) in self.frozen or out not in r.inputs or (r.subgraphs and out in r.implicit_inputs()):
                return False
        for n in old:
            for o in n.outputs:
                if o and o != out and not self.internal(o, old):
                    return False
        dropped = {id(n) for n in old}
        for r in readers:
            r.inputs = [src if i == out else i for i in r.inputs]
        self.graph.nodes = [n for n in self.graph.nodes if id(n) not in dropped]
        self.touched.update(dropped)
        self.changed = True
        return True

    def finish(self) -> bool:
        """End the scan: re-sort if anything changed; return whether it did."""
        if self.changed:
            self.graph.topological_sort()
        return self.changed

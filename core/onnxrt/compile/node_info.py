"""What a kernel learns about its node: :class:`~onnxrt.plugin.NodeInfo`, built from the IR."""

from __future__ import annotations

from collections import ChainMap
from typing import Any

from ..ir.graph import Graph, Node
from ..plugin.kernel import NodeInfo, decode_attribute

__all__ = ["NodeInfoFactory"]


class NodeInfoFactory:
    """Builds :class:`NodeInfo` for IR nodes, with types from the enclosing graphs."""

    def __init__(self, graph: Graph):
        # value names are unique across a model's scopes, so one table serves all graphs;
        # it reads each graph's own table, so the types of values a transform adds later
        # (a Cast it inserts, a fused node's output) reach the kernels built for them
        tables = []
        stack = [graph]
        while stack:
            g = stack.pop()
            tables.append(g.value_types)
            for n in g.nodes:
                stack.extend(n.all_subgraphs())
        self._types: ChainMap[str, Any] = ChainMap(*tables)

    def _types_for(self, names: list[str]) -> list:
        t = self._types
        return [t.get(n) if n else None for n in names]

    def input_types(self, node: Node) -> list:
        """The node's input ``TypeProto``s (``None`` where unknown)."""
        return self._types_for(node.inputs)

    def __call__(self, node: Node, constants: dict | None = None) -> NodeInfo:
        attrs = {k: decode_attribute(a) for k, a in node.attrs.items()}
        for k, sg in node.subgraphs.items():
            attrs[k] = sg
        return NodeInfo(
            name=node.name,
            op_type=node.op_type,
            domain=node.domain,
            opset=node.opset,
            attrs=attrs,
            inputs=list(node.inputs),
            outputs=list(node.outputs),
            input_types=self.input_types(node),
            output_types=self._types_for(node.outputs),
            constants={i: constants[n] for i, n in enumerate(node.inputs) if constants and n in constants},
            implicit_inputs=node.implicit_inputs() if node.subgraphs else [],
        )

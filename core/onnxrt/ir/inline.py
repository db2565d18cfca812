"""Expanding function ops: model-local functions and schema function bodies.

A node whose op no provider has a kernel for, but which is defined as a function
(a model-local ``FunctionProto`` or an ONNX schema with a function body, possibly
context dependent), is replaced by the function's nodes. Internal names get a
unique prefix, attribute references (``ref_attr_name``) take the calling node's
values or the function's defaults, and every inlined node keeps the opset version
of its own domain as the function imports it.
"""

from __future__ import annotations

from typing import Callable

import onnx
from onnx import AttributeProto, FunctionProto, TypeProto

from ..errors import InvalidGraph
from .graph import MAX_NESTING, Graph, Node

__all__ = ["schema_function", "inline_node", "expand_functions"]


def schema_function(node: Node, input_types: list[TypeProto | None]) -> FunctionProto | None:
    """The function body the ONNX schema gives ``node`` at its opset, if any."""
    try:
        schema = onnx.defs.get_schema(node.op_type, node.opset, node.domain)
    except Exception:
        return None
    fn = None
    if schema.has_function:
        try:
            data = schema.get_function_with_opset_version(node.opset)
            fn = data if isinstance(data, FunctionProto) else None
        except Exception:
            fn = None
        if fn is None:
            fn = schema.function_body
    elif schema.has_context_dependent_function:
        if any(t is None for t in input_types[: len(node.inputs)]):
            return None
        try:
            ctx_types = [
                (t if t is not None else TypeProto()).SerializeToString() for t in input_types
            ]
            data = schema.get_context_dependent_function_with_opset_version(
                node.opset, node.to_proto().SerializeToString(), ctx_types
            )
        except Exception:
            return None
        if not data:
            return None
        fn = FunctionProto()
        fn.ParseFromString(data)
    if fn is None or not fn.node:
        return None
    return fn


def inline_node(graph: Graph, node: Node, fn: FunctionProto, default_opsets: dict[str, int]) -> list[Node]:
    """Return the nodes that replace ``node`` by the body of ``fn``."""
    fn_opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in fn.opset_import}
    prefix = graph.unique_name(f"{node.name}") + "/"
    rename: dict[str, str] = {}
    for formal, actual in zip(fn.input, node.inputs):
        rename[formal] = actual
    for formal in list(fn.input)[len(node.inputs):]:
        rename[formal] = ""
    for formal, actual in zip(fn.output, node.outputs):
        rename[formal] = actual if actual else prefix + formal
    # attribute values for ref_attr_name: the caller's, else the function's defaults
    attr_values: dict[str, AttributeProto] = {}
    for a in fn.attribute_proto:
        attr_values[a.name] = a
    for name, a in node.attrs.items():
        attr_values[name] = a
    for name, sg in node.subgraphs.items():
        if not isinstance(sg, list):
            ap = AttributeProto(name=name, type=AttributeProto.GRAPH)
            ap.g.CopyFrom(sg.to_proto())
            attr_values[name] = ap

    def rn(name: str) -> str:
        if not name:
            return ""
        if name not in rename:
            rename[name] = prefix + name
        return rename[name]

    new_nodes: list[Node] = []
    for i, fnode in enumerate(fn.node):
        proto = onnx.NodeProto()
        proto.CopyFrom(fnode)
        _substitute_attr_refs(proto, attr_values)
        dom = "" if proto.domain in ("", "ai.onnx") else proto.domain
        opset = fn_opsets.get(dom, default_opsets.get(dom, 1))
        sub_opsets = dict(default_opsets)
        sub_opsets.update(fn_opsets)
        n = Node(
            op_type=proto.op_type,
            domain=dom,
            inputs=[rn(x) for x in proto.input],
            outputs=[rn(x) for x in proto.output],
            name=f"{prefix}{proto.name or proto.op_type + '_' + str(i)}",
            opset=opset,
        )
        for a in proto.attribute:
            if a.type == AttributeProto.GRAPH:
                sg = Graph.from_proto(_rename_graph(a.g, rn), sub_opsets, graph, depth=1)
                n.subgraphs[a.name] = sg
            elif a.type == AttributeProto.GRAPHS:
                n.subgraphs[a.name] = [
                    Graph.from_proto(_rename_graph(g, rn), sub_opsets, graph, depth=1) for g in a.graphs
                ]
            else:
                n.attrs[a.name] = a
        new_nodes.append(n)
    return new_nodes


def _rename_graph(gp: onnx.GraphProto, rn: Callable[[str], str], bound: frozenset = frozenset()) -> onnx.GraphProto:
    """Rename the free (outer-scope) names a function-body subgraph reads, at any depth:
    a name is left alone where this subgraph or one between it and the function body
    (``bound``) defines it, else it is the function's and gets renamed."""
    g = onnx.GraphProto()
    g.CopyFrom(gp)
    local = set(bound) | {vi.name for vi in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        local.update(n.output)
    scope = frozenset(local)
    for n in g.node:
        for k, x in enumerate(n.input):
            if x and x not in local:
                n.input[k] = rn(x)
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                a.g.CopyFrom(_rename_graph(a.g, rn, scope))
            elif a.type == AttributeProto.GRAPHS:
                renamed = [_rename_graph(sub, rn, scope) for sub in a.graphs]
                del a.graphs[:]
                a.graphs.extend(renamed)
    for vi in g.output:
        if vi.name not in local:
            vi.name = rn(vi.name)
    return g


def _substitute_attr_refs(proto, attr_values: dict[str, AttributeProto]) -> None:
    keep = []
    for a in proto.attribute:
        if a.ref_attr_name:
            src = attr_values.get(a.ref_attr_name)
            if src is None:
                continue  # the caller did not set it and there is no default: omit
            b = AttributeProto()
            b.CopyFrom(src)
            b.name = a.name
            keep.append(b)
        else:
            # attribute references inside subgraphs, at any depth
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                for sn in sub.node:
                    _substitute_attr_refs(sn, attr_values)
            keep.append(a)
    del proto.attribute[:]
    proto.attribute.extend(keep)


def expand_functions(
    graph: Graph,
    local_functions: dict[tuple[str, str], FunctionProto],
    has_kernel: Callable[[Node], bool],
    input_types: Callable[[Node], list],
    depth: int = 0,
) -> int:
    """Inline, repeatedly, every node that no provider can run but a function defines.

    :param has_kernel: whether some selected provider has a kernel for a node.
    :param input_types: the node's input ``TypeProto``s (``None`` where unknown).
    :return: how many nodes were expanded.
    """
    if depth > MAX_NESTING:
        raise InvalidGraph(f"functions call each other more than {MAX_NESTING} levels deep (recursion?)")
    count = 0
    for _ in range(MAX_NESTING + 1):
        changed = False
        new_nodes: list[Node] = []
        for node in graph.nodes:
            fn = None
            local = local_functions.get((node.domain, node.op_type))
            if local is not None and not has_kernel(node):
                fn = local
            elif not has_kernel(node):
                fn = schema_function(node, input_types(node))
            if fn is None:
                new_nodes.append(node)
                continue
            new_nodes.extend(inline_node(graph, node, fn, graph.opsets))
            changed = True
            count += 1
        graph.nodes = new_nodes
        if not changed:
            break
    else:
        raise InvalidGraph(f"functions call each other more than {MAX_NESTING} levels deep (recursion?)")
    for node in graph.nodes:
        for sg in node.all_subgraphs():
            count += expand_functions(sg, local_functions, has_kernel, input_types, depth + 1)
    if count:
        graph.topological_sort()
    return count

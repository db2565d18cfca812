"""Expanding function ops: model-local functions and schema function bodies.

A node whose op no provider has a kernel for, but which is defined as a function
(a model-local ``FunctionProto`` or an ONNX schema with a function body, possibly
context dependent), is replaced by the function's nodes. Internal names get a
unique prefix, attribute references (``ref_attr_name``) take the calling node's
values or the function's defaults, and every inlined node keeps the opset version
of its own domain as the function imports it.
"""

from __future__ import annotations

import functools
from typing import Callable

import onnx
from onnx import AttributeProto, FunctionProto, TypeProto

from ..errors import InvalidGraph
from .graph import MAX_NESTING, Graph, Node

__all__ = ["schema_function", "inline_node", "expand_functions", "check_function_calls", "MAX_INLINED_NODES"]

#: Inlining that would add more nodes than this to one model is refused with
#: InvalidGraph: functions that call others several times each grow the graph
#: exponentially with the depth of the calls (two that call each other twice double
#: it every round), and each node costs memory and build time.
MAX_INLINED_NODES = 1_000_000


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


@functools.lru_cache(maxsize=None)
def _may_have_function(op_type: str, domain: str, opset: int) -> bool:
    """Whether the ONNX schema of an op at an opset defines a function body."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - no schema: no function
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def inline_node(graph: Graph, node: Node, fn: FunctionProto, default_opsets: dict[str, int],
                taken: set[str] | None = None) -> list[Node]:
    """Return the nodes that replace ``node`` by the body of ``fn``.

    :param taken: the names already used in ``graph`` and its ancestors, when the
        caller keeps them (as :func:`expand_functions` does): the prefix of the new
        names is chosen against it and added to it, instead of collecting every name
        in the graph again for each call, which made inlining quadratic.
    """
    fn_opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in fn.opset_import}
    if taken is None:
        prefix = graph.unique_name(f"{node.name}") + "/"
    else:
        while True:
            cand = f"{node.name}__{next(graph._name_counter)}"
            if cand not in taken:
                break
        taken.add(cand)
        prefix = cand + "/"
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
    _budget: list[int] | None = None,
) -> int:
    """Inline, repeatedly, every node that no provider can run but a function defines.

    :param has_kernel: whether some selected provider has a kernel for a node.
    :param input_types: the node's input ``TypeProto``s (``None`` where unknown).
    :return: how many nodes were expanded.
    """
    if depth > MAX_NESTING:
        raise InvalidGraph(f"functions call each other more than {MAX_NESTING} levels deep (recursion?)")
    if _budget is None:
        _check_expansion(graph, local_functions, has_kernel)
    budget = [MAX_INLINED_NODES] if _budget is None else _budget
    count = 0
    taken: set[str] | None = None
    # the functions each inlined node came from, outermost first: a function met again
    # in its own chain of calls is recursion, refused at once (bounding only the rounds
    # let two functions that call each other twice double the graph 24 times)
    chains: dict[int, tuple] = {}
    for _ in range(MAX_NESTING + 1):
        changed = False
        new_nodes: list[Node] = []
        for node in graph.nodes:
            fn = None
            key = (node.domain, node.op_type)
            local = local_functions.get(key)
            if local is not None:
                if not has_kernel(node):
                    fn = local
            elif _may_have_function(node.op_type, node.domain, node.opset) and not has_kernel(node):
                # only ops whose schema defines a function ask the providers: asking for
                # every node cost a kernel lookup per node (a second on a 40,000-node chain)
                fn = schema_function(node, input_types(node))
            if fn is None:
                new_nodes.append(node)
                continue
            chain = chains.get(id(node), ())
            if key in chain:
                path = " -> ".join(f"{d + '.' if d else ''}{op}" for d, op in chain + (key,))
                raise InvalidGraph(f"node {node.name!r}: functions call themselves ({path}); "
                                   "recursion cannot be inlined")
            if taken is None:
                taken = _names_in_scope(graph)
            body = inline_node(graph, node, fn, graph.opsets, taken)
            budget[0] -= len(body)
            if budget[0] < 0:
                raise InvalidGraph(
                    f"node {node.name!r}: inlining the model's functions would add more than "
                    f"{MAX_INLINED_NODES} nodes (functions that call others many times)"
                )
            chain = chain + (key,)
            for n in body:
                chains[id(n)] = chain
            new_nodes.extend(body)
            changed = True
            count += 1
        graph.nodes = new_nodes
        if not changed:
            break
    else:
        raise InvalidGraph(f"functions call each other more than {MAX_NESTING} levels deep (recursion?)")
    for node in graph.nodes:
        for sg in node.all_subgraphs():
            count += expand_functions(sg, local_functions, has_kernel, input_types, depth + 1, _budget=budget)
    if count:
        graph.topological_sort()
    return count


def _check_expansion(graph: Graph, local_functions: dict[tuple[str, str], FunctionProto],
                     has_kernel: Callable[[Node], bool]) -> None:
    """:func:`check_function_calls` for the calls in ``graph`` that will be inlined."""
    if local_functions:
        check_function_calls(local_functions, (
            ((node.domain, node.op_type), node.name) for _, node in graph.walk()
            if (node.domain, node.op_type) in local_functions and not has_kernel(node)))


def check_function_calls(local_functions: dict[tuple[str, str], FunctionProto], calls) -> None:
    """Refuse, before inlining anything, local functions that call themselves and
    calls that would expand past :data:`MAX_INLINED_NODES`.

    :param calls: ``((domain, op_type), node name)`` of each call to a local function.

    Each function's expanded size is counted once from its body (a call to another
    local function counts that one's size), so a model whose functions call others
    several times is measured in time linear in its functions, not built node by
    node until the budget runs out (onnx's shape inference, which expands calls the
    same way, took minutes on such a model before this refused it).
    """
    sizes: dict[tuple[str, str], int] = {}
    active: list[tuple[str, str]] = []

    def size(key: tuple[str, str]) -> int:
        if key in sizes:
            return sizes[key]
        if key in active:
            path = " -> ".join(f"{d + '.' if d else ''}{op}" for d, op in active[active.index(key):] + [key])
            raise InvalidGraph(f"functions call themselves ({path}); recursion cannot be inlined")
        active.append(key)
        total = 0
        for n in local_functions[key].node:
            sub = ("" if n.domain == "ai.onnx" else n.domain, n.op_type)
            total += size(sub) if sub in local_functions else 1
            if total > MAX_INLINED_NODES:
                break
        active.pop()
        sizes[key] = total
        return total

    total = 0
    for key, name in calls:
        total += size(key)
        if total > MAX_INLINED_NODES:
            raise InvalidGraph(
                f"node {name!r}: inlining the model's functions would add more than "
                f"{MAX_INLINED_NODES} nodes (functions that call others many times)"
            )


def _names_in_scope(graph: Graph) -> set[str]:
    """Every value and node name of ``graph`` and of the graphs enclosing it."""
    taken = graph.defined_names() | {n.name for n in graph.nodes}
    p = graph.parent
    while p is not None:
        taken |= p.defined_names()
        p = p.parent
    return taken

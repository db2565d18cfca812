"""Kernels for the partitioned graph, handed to the planner as its steps.

Every node gets the kernel of the provider that took it, built with its device (inside
the device's ``run_scope`` when it has one, so a GPU kernel prepacks its weights on the
right device); every fused group gets the one kernel its provider compiles. Control-flow
bodies are compiled the same way, each into a :class:`Subgraph`.
"""

from __future__ import annotations

from typing import Callable

from ..errors import Fail, InvalidArgument, InvalidGraph, NotImplemented
from ..ir.graph import Graph
from ..partition.partitioner import Partition
from ..plan import Plan, PlanBuilder
from ..plugin.provider import HostDevice, device_scope, group_io

__all__ = ["Subgraph", "compile_plan"]


class Subgraph:
    """A compiled If/Loop/Scan body: call it with inputs and the outer-scope values.

    ``sub(*inputs, outer={...})`` returns the list of the body's outputs.
    """

    def __init__(self, plan: Plan, input_names: list[str], output_names: list[str], graph: Graph):
        self.plan = plan
        self.input_names = input_names
        self.output_names = output_names
        self.graph = graph

    def __call__(self, *inputs, outer: dict | None = None, ctx=None) -> list:
        feeds = dict(zip(self.input_names, inputs))
        return self.plan.run(feeds, outer, ctx)

    def __repr__(self) -> str:
        return f"<Subgraph {self.graph.name!r} {self.input_names} -> {self.output_names}>"


def compile_plan(graph: Graph, part: Partition, node_info: Callable, *, max_bytes: int, memoize_shapes: bool,
                 overridable: set[str], fused: list[dict], top: bool = True,
                 outer_constants: dict | None = None) -> Plan:
    """The plan of ``graph``: a kernel per node or fused group, in order.

    :param part: the partition of ``graph`` and its subgraphs.
    :param overridable: initializer names a feed may replace (they stay inputs).
    :param fused: receives one ``{"provider", "nodes"}`` entry per compiled group.
    :param top: ``False`` for a subgraph, whose free names are outer-scope values.
    :param outer_constants: the enclosing graphs' constant initializers: a subgraph
        holds those it reads as constants of its own (uploaded once to a device that
        reads them), not as values handed in on every call.
    """
    by_name = {p.name: p for p in part.providers}
    builder = PlanBuilder(HostDevice(), max_bytes, memoize_shapes=memoize_shapes)
    for vi in graph.inputs:
        if vi.name not in graph.initializers:
            builder.add_input(vi.name)
    for name, value in graph.initializers.items():
        builder.add_constant(name, value, overridable=name in overridable)
    outer_constants = outer_constants or {}
    if not top:
        for name in graph.free_names():
            if name in builder.vals:
                continue
            if name in outer_constants:
                builder.add_constant(name, outer_constants[name], overridable=False)
            else:
                builder.add_outer(name)
    constants = {k: v for k, v in graph.initializers.items() if k not in overridable}
    inner_constants = {**outer_constants, **constants}
    fused_nodes: dict[int, tuple] = {}
    for p, cap in part.groups_of(graph):
        for n in cap.nodes:
            fused_nodes[id(n)] = (p, cap)
    emitted: set[int] = set()

    def subgraph(sg: Graph) -> Subgraph:
        plan = compile_plan(sg, part, node_info, max_bytes=max_bytes, memoize_shapes=memoize_shapes,
                            overridable=set(sg.input_names()), fused=fused, top=False,
                            outer_constants=inner_constants)
        return Subgraph(plan, sg.input_names(), sg.output_names(), sg)

    for node in graph.nodes:
        p = by_name[node.provider]
        if id(node) in fused_nodes:
            fp, cap = fused_nodes[id(node)]
            if id(cap) in emitted:
                continue
            emitted.add(id(cap))
            with device_scope(fp.device):
                kernel = fp.compile(cap, graph, node_info)
            inputs, outputs = group_io(graph, cap.nodes)
            builder.add_step(kernel.run, inputs, outputs, fp.device, cap.fused_name or cap.nodes[0].name,
                             "FusedGroup", fp.name)
            fused.append({"provider": fp.name, "nodes": [n.name for n in cap.nodes]})
            continue
        ni = node_info(node, constants)
        bodies: list[Subgraph] = []
        for k, sg in node.subgraphs.items():
            ni.attrs[k] = [subgraph(s) for s in sg] if isinstance(sg, list) else subgraph(sg)
            bodies.extend(ni.attrs[k] if isinstance(sg, list) else [ni.attrs[k]])
        implicit = ni.implicit_inputs
        if bodies:
            # the step hands the bodies only the outer values their plans read: the
            # enclosing graphs' constants are constants of the bodies' own plans, and
            # passing them in the outer dict on every call would only cost its building
            read = {n for b in bodies for n in b.plan.outer_slots}
            implicit = [n for n in implicit if n in read]
        try:
            with device_scope(p.device):
                kernel = p.create_kernel(ni)
        except (InvalidArgument, InvalidGraph, NotImplemented):
            raise
        except Exception as e:  # noqa: BLE001
            raise Fail(f"{p.name} could not build the kernel for {ni.describe()}: {type(e).__name__}: {e}") from e
        builder.add_step(kernel.run, node.inputs, node.outputs, p.device, node.name, node.op_type, p.name,
                         implicit=implicit, domain=node.domain,
                         host_inputs=getattr(kernel, "host_inputs", frozenset()))
    return builder.build(graph.output_names())

"""Elementwise fusion: convex groups of elementwise nodes compiled into one kernel each.

:func:`group_nodes` walks the graph in topological order and lets an elementwise node
join the group of one of its producers when that keeps the group convex: no path may
leave the group and come back into it, or the fused kernel would need a value that is
only computed after it runs. Every node carries the set of groups it depends on (a
bitset), so the check is one lookup per input.

:class:`FusedKernel` is what :meth:`OpenCLExecutionProvider.compile` returns: one
:class:`~onnxrt_opencl.codegen.ElementwiseProgram` over the group, with values used only
inside the group kept in registers and never written to memory.
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.provider import Capability, group_io

from .codegen import ElementwiseProgram, EwNode
from .kernels.base import CLKernel
from .kernels.elementwise import EW_OPS

__all__ = ["group_nodes", "FusedKernel", "MAX_GROUP_NODES", "MAX_GROUP_INPUTS"]

#: a generated kernel stays readable and within every device's argument limits
MAX_GROUP_NODES = 48
MAX_GROUP_INPUTS = 24


def group_nodes(graph, claimed: list, fuse: bool = True) -> list[Capability]:
    """Capabilities for the ``claimed`` nodes of ``graph``: fused groups and single nodes."""
    claimed_ids = {id(n) for n in claimed}
    fusable = {id(n) for n in claimed if n.op_type in EW_OPS and n.domain == ""} if fuse else set()
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    pos = {id(n): k for k, n in enumerate(graph.nodes)}
    unit: dict[int, int] = {}  # node -> its group (or its own unit when not fused)
    deps: dict[int, int] = {}  # node -> bitset of the unit ids it depends on
    preds_of: dict[int, list] = {}
    members: dict[int, list] = {}  # group -> its nodes in graph order
    ids: dict[int, int] = {}  # group -> bitset of the unit ids merged into it
    next_unit = 0

    def static_shape(name):
        tp = graph.value_types.get(name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        dims = tp.tensor_type.shape.dim
        if not all(d.HasField("dim_value") for d in dims):
            return None
        return tuple(d.dim_value for d in dims)

    def valid(groups: list[int], n) -> bool:
        mask = 0
        nodes = [n]
        for g in groups:
            mask |= ids[g]
            nodes += members[g]
        if len(nodes) > MAX_GROUP_NODES:
            return False
        first = min(pos[id(m)] for m in nodes)
        produced = {o for m in nodes for o in m.outputs if o}
        if len({i for m in nodes for i in m.inputs if i and i not in produced}) > MAX_GROUP_INPUTS:
            return False
        shapes = [static_shape(m.outputs[0]) for m in nodes]
        if all(sh is not None for sh in shapes):
            try:
                np.broadcast_shapes(*shapes)
            except ValueError:
                return False  # one kernel iterates over one broadcast shape
        for m in nodes:
            for q in preds_of[id(m)]:
                if unit[id(q)] in groups:
                    continue
                # a path out of the group and back in, or an input not ready where the
                # session runs the group (at its first node)
                if deps[id(q)] & mask or pos[id(q)] > first:
                    return False
        return True

    for n in graph.nodes:
        names = [i for i in n.inputs if i]
        if n.subgraphs:
            names += n.implicit_inputs()
        preds = [producer[i] for i in names if i in producer]
        preds_of[id(n)] = preds
        d = 0
        for p in preds:
            d |= deps[id(p)] | (1 << unit[id(p)])
        deps[id(n)] = d
        chosen: list[int] = []
        if id(n) in fusable:
            cands = [g for g in dict.fromkeys(unit[id(p)] for p in preds) if g in members]
            if cands and valid(cands, n):
                chosen = cands
            else:
                # the latest groups first: their inputs are the likeliest to be ready
                for g in sorted(cands, key=lambda g: -max(pos[id(m)] for m in members[g])):
                    if valid(chosen + [g], n):
                        chosen.append(g)
        if chosen:
            target = chosen[0]
            for g in chosen[1:]:
                for m in members.pop(g):
                    unit[id(m)] = target
                    members[target].append(m)
                ids[target] |= ids.pop(g)
            unit[id(n)] = target
            members[target].append(n)
        else:
            unit[id(n)] = next_unit
            if id(n) in fusable:
                members[next_unit] = [n]
                ids[next_unit] = 1 << next_unit
            next_unit += 1
    caps = []
    emitted: set[int] = set()
    for n in graph.nodes:
        if id(n) not in claimed_ids:
            continue
        g = unit[id(n)]
        if g in members and len(members[g]) > 1:
            if g not in emitted:
                emitted.add(g)
                nodes = sorted(members[g], key=lambda m: pos[id(m)])
                caps.append(Capability(nodes, f"OpenCLFused_{len(emitted) - 1}_{nodes[0].name}"))
        else:
            caps.append(Capability([n]))
    return caps


class FusedKernel(CLKernel):
    """A fused group of elementwise nodes: one generated kernel launch per run."""

    def __init__(self, capability: Capability, graph, node_info, device):
        self.nodes = list(capability.nodes)
        self.name = capability.fused_name or self.nodes[0].name
        self.device = device
        inputs, outputs = group_io(graph, self.nodes)
        chain = [EwNode(n.op_type, list(n.inputs), list(n.outputs[:1]), dict(node_info(n).attrs), n.name)
                 for n in self.nodes]
        self.program = ElementwiseProgram(chain, inputs, outputs, device.rt)

    def run(self, *inputs):
        return self.program.run(*inputs)

    def __repr__(self) -> str:
        return f"<FusedKernel {self.name!r}: {' -> '.join(n.op_type for n in self.nodes)}>"

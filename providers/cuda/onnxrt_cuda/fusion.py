"""Elementwise fusion: convex groups of elementwise nodes, each one generated CuPy kernel.

:func:`group_nodes` walks the graph in topological order. The session runs a fused
group at the position of its first node, so an elementwise node may join the group of
one of its producers only when every other input of the node is produced before that
group's first node. That one rule also keeps groups convex: a value computed from the
group cannot be produced before the group runs.

:class:`FusedKernel` is what :meth:`CUDAExecutionProvider.compile` returns. It builds
one ``cupy.ElementwiseKernel`` per input-dtype signature. When an intermediate value
the group must return has a smaller shape than the group's iteration space (one
kernel writes every output over the whole space), it runs the chain node by node with
CuPy instead.
"""

from __future__ import annotations

import threading

import numpy as np
from onnxrt.plugin.provider import Capability

from .codegen import EwNode, EwProgram

__all__ = ["MAX_GROUP_INPUTS", "MAX_GROUP_NODES", "FusedKernel", "group_nodes"]

#: keeps generated kernels readable and their argument lists short
MAX_GROUP_NODES = 64
MAX_GROUP_INPUTS = 32


def group_nodes(graph, claimed: list, fusable_ids: set[int], prefix: str = "CUDAFused") -> list[Capability]:
    """Capabilities for the ``claimed`` nodes: fused groups of ``fusable_ids`` and single nodes."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    pos = {id(n): k for k, n in enumerate(graph.nodes)}
    group_of: dict[int, int] = {}
    members: dict[int, list] = {}
    first: dict[int, int] = {}
    for n in graph.nodes:
        if id(n) not in fusable_ids:
            continue
        names = [i for i in n.inputs if i]
        preds = [producer[i] for i in names if i in producer]
        joined = None
        for p in preds:
            g = group_of.get(id(p))
            if g is None or g == joined:
                continue
            others = [q for q in preds if group_of.get(id(q)) != g]
            if (all(pos[id(q)] < first[g] for q in others) and len(members[g]) < MAX_GROUP_NODES
                    and _n_inputs(members[g] + [n]) <= MAX_GROUP_INPUTS):
                joined = g
                break
        if joined is None:
            joined = len(members)
            members[joined] = []
            first[joined] = pos[id(n)]
        members[joined].append(n)
        group_of[id(n)] = joined
    caps = []
    emitted: set[int] = set()
    claimed_ids = {id(n) for n in claimed}
    for n in graph.nodes:
        if id(n) not in claimed_ids:
            continue
        g = group_of.get(id(n))
        if g is None:
            caps.append(Capability([n]))
        elif g not in emitted:
            emitted.add(g)
            nodes = members[g]
            caps.append(Capability(nodes, f"{prefix}_{len(emitted) - 1}_{nodes[0].name}"))
    return caps


def _n_inputs(nodes: list) -> int:
    produced = {o for m in nodes for o in m.outputs if o}
    return len({i for m in nodes for i in m.inputs if i and i not in produced})


class FusedKernel:
    """A group (or one node) of elementwise ops run as one generated CuPy kernel."""

    def __init__(self, nodes: list, inputs: list[str], outputs: list[str], attrs_of, name: str, cupy):
        self.name = name
        self.cp = cupy
        chain = [EwNode(n.op_type, list(n.inputs), list(n.outputs[:1]), dict(attrs_of(n)), n.name) for n in nodes]
        self.program = EwProgram(chain, inputs, outputs)
        self._kernels: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def _kernel(self, dtypes: tuple):
        k = self._kernels.get(dtypes)
        if k is None:
            with self._lock:
                k = self._kernels.get(dtypes)
                if k is None:
                    in_p, out_p, body, name = self.program.source(list(dtypes))
                    k = self.cp.ElementwiseKernel(in_p, out_p, body, name, return_tuple=True)
                    self._kernels[dtypes] = k
        return k

    def run(self, *inputs):
        """Compute the group's outputs from its inputs (CuPy arrays)."""
        cp = self.cp
        arrays = [cp.asarray(a) for a in inputs]
        shapes = self.program.shapes([a.shape for a in arrays])
        try:
            full = tuple(np.broadcast_shapes(*[a.shape for a in arrays])) if arrays else ()
        except ValueError:
            # branches of one group over different shapes (a scale computed once and
            # applied to two tensors of different shapes): no single iteration space
            full = None
        if any(shapes[o] != full for o in self.program.outputs):
            return tuple(self.program.evaluate(cp, arrays))
        return tuple(self._kernel(tuple(a.dtype for a in arrays))(*arrays))

    def __repr__(self) -> str:
        return f"<FusedKernel {self.name!r}: {' -> '.join(n.op_type for n in self.program.chain)}>"

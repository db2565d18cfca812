"""The partitioner: which provider runs each node, which nodes are fused, and why.

Providers are asked in priority order. Each sees a :class:`GraphView` of the graph
whose :attr:`~GraphView.candidates` are the nodes it may take (nobody has them yet,
and, for a device provider, they are not shape computations the CPU should keep),
and answers :meth:`~onnxrt.plugin.ExecutionProvider.get_capability`. The policy is
the core's, applied the same way to every provider:

- shape computations (:func:`~onnxrt.partition.cpu_preferred.cpu_preferred_nodes`)
  stay on the host, as onnxruntime's ``GetCpuPreferredNodes`` keeps them;
- nodes with subgraphs (If, Loop, Scan) stay on the host unless a device provider
  says it runs them (``runs_control_flow``);
- a ``Constant`` whose value is read on the host stays there: a device provider
  would upload it only for the plan to copy it back;
- a provider whose ``get_capability`` raises takes nothing (logged), and the session
  goes on with the others.

Every refusal is recorded with its reason in the :class:`Partition` the later stages
take as an argument; nothing is stored on the graph but each node's ``provider``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import NotImplemented
from ..ir.graph import Graph, Node
from .cpu_preferred import cpu_preferred_nodes

__all__ = ["GraphView", "Partition", "partition", "SHAPE_KEPT", "CONSTANT_KEPT", "CONTROL_FLOW_KEPT"]

logger = logging.getLogger("onnxrt")

#: the reasons the core's policy gives for a refusal
SHAPE_KEPT = "shape computation kept on the CPU"
CONSTANT_KEPT = "a Constant whose value is read on the CPU stays there"
CONTROL_FLOW_KEPT = "nodes with subgraphs run on the CPU"


class GraphView:
    """A graph as one provider sees it while partitioning.

    Everything of the :class:`~onnxrt.ir.Graph` reads through (``nodes`` in topological
    order, ``initializers``, ``value_types``, ``output_names()`` ...); :attr:`candidates`
    are the nodes this provider may take, in topological order.
    """

    __slots__ = ("graph", "candidates", "_ids")

    def __init__(self, graph: Graph, candidates: list[Node]):
        self.graph = graph
        self.candidates = candidates
        self._ids = {id(n) for n in candidates}

    def is_candidate(self, node: Node) -> bool:
        """Whether this provider may take ``node``."""
        return id(node) in self._ids

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)


@dataclass
class Partition:
    """The partitioner's result for a graph and all its subgraphs.

    :ivar providers: the session's providers in priority order.
    :ivar groups: per graph (keyed by ``id(graph)``), the ``(provider, Capability)``
        pairs of nodes that run as one compiled kernel.
    :ivar refusals: per node (``id(node)``), provider name -> why that provider did not
        take it, for the refusals the core decided (policy, failed providers).
    :ivar reasons: main-graph node name -> the report's reason text (why each
        higher-priority provider did not take it; empty when the first one did).
    """

    providers: list
    groups: dict[int, list[tuple[Any, Any]]] = field(default_factory=dict)
    refusals: dict[int, dict[str, str]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def groups_of(self, graph: Graph) -> list[tuple[Any, Any]]:
        """The fused groups of ``graph`` (one of the partitioned graphs)."""
        return self.groups.get(id(graph), [])

    def report(self, graph: Graph) -> list[dict]:
        """One row per node of ``graph`` as it runs: ``node``, ``op_type``, ``provider``,
        ``reason``. A node a later transform made (Conv + Relu fused into one) keeps the
        reason recorded for the node whose name it took."""
        return [{"node": n.name, "op_type": n.op_type, "provider": n.provider,
                 "reason": self.reasons.get(n.name, "")} for n in graph.nodes]


def partition(graph: Graph, providers: list, node_info: Callable) -> Partition:
    """Assign every node of ``graph`` and of its subgraphs to one of ``providers``.

    :param providers: :class:`~onnxrt.plugin.ExecutionProvider` instances in priority
        order; the last one (the CPU provider) must be able to run everything.
    :param node_info: ``node -> NodeInfo``.
    :raises NotImplemented: when no provider can run some node, with every provider's reason.
    """
    result = Partition(list(providers))
    _partition_graph(graph, result, node_info, top=True)
    return result


def _partition_graph(graph: Graph, result: Partition, node_info: Callable, top: bool) -> None:
    providers = result.providers
    for node in graph.nodes:
        node.provider = None
    # only a device provider would take shape computations off the host
    preferred = cpu_preferred_nodes(graph) if any(not p.device.is_host for p in providers) else set()
    groups: list[tuple[Any, Any]] = []
    taken_by: dict[int, int] = {}
    for pi, p in enumerate(providers):
        device = not p.device.is_host
        free = [n for n in graph.nodes if n.provider is None]
        if not free:
            break
        if device:
            offered = []
            for n in free:
                if id(n) in preferred:
                    _refuse(result, n, p, SHAPE_KEPT)
                elif n.subgraphs and not p.runs_control_flow:
                    _refuse(result, n, p, CONTROL_FLOW_KEPT)
                else:
                    offered.append(n)
            free = offered
        view = GraphView(graph, free)
        try:
            caps = p.get_capability(view, node_info)
        except Exception as e:  # noqa: BLE001 - a broken provider must not break the session
            logger.warning("%s.get_capability failed: %s", p.name, e)
            for n in free:
                _refuse(result, n, p, f"get_capability failed: {type(e).__name__}: {e}")
            continue
        taken: list[tuple[Any, list[Node]]] = []
        for cap in caps:
            nodes = [n for n in cap.nodes if n.provider is None]
            held = [n for n in nodes if not view.is_candidate(n)]
            if held:
                # a group is taken whole or not at all: its kernel computes every node
                for n in held:
                    _refuse(result, n, p, SHAPE_KEPT if id(n) in preferred else "not a candidate")
                continue
            if nodes:
                taken.append((cap, nodes))
        if device:
            taken = _keep_host_constants(graph, taken, p, result)
        for cap, nodes in taken:
            for n in nodes:
                n.provider = p.name
                taken_by[id(n)] = pi
            if len(nodes) > 1 or cap.fused_name:
                cap.nodes = nodes
                groups.append((p, cap))
    missing = [n for n in graph.nodes if n.provider is None]
    if missing:
        n = missing[0]
        ni = node_info(n)
        reasons = "; ".join(f"{p.name}: {_reason(result, n, p, ni)}" for p in providers)
        raise NotImplemented(
            f"no provider can run {n.op_type} node {n.name!r} "
            f"(domain {n.domain or 'ai.onnx'!r}, opset {n.opset}): {reasons}"
        )
    result.groups[id(graph)] = groups
    if top:
        for node in graph.nodes:
            ni = node_info(node)
            why = "; ".join(f"{p.name}: {_reason(result, node, p, ni)}" for p in providers[:taken_by[id(node)]])
            result.reasons[node.name] = why
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("node %s (%s) -> %s %s", node.name, node.op_type, node.provider,
                             f"({why})" if why else "")
    for node in graph.nodes:
        for sg in node.all_subgraphs():
            _partition_graph(sg, result, node_info, top=False)


def _refuse(result: Partition, node: Node, provider, why: str) -> None:
    result.refusals.setdefault(id(node), {})[provider.name] = why


def _reason(result: Partition, node: Node, provider, ni) -> str:
    """Why ``provider`` did not take ``node``: the core's recorded reason, else the provider's."""
    why = result.refusals.get(id(node), {}).get(provider.name)
    return why if why is not None else provider.refusal_reason(ni)


def _keep_host_constants(graph: Graph, taken: list, provider, result: Partition) -> list:
    """Drop the Constant nodes among a device provider's ``taken`` whose value is read on
    the host (by a node it did not take, a subgraph, or as a graph output)."""
    ids = {id(n) for _, nodes in taken for n in nodes}
    readers: dict[str, list] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
        if n.subgraphs:
            for i in n.implicit_inputs():
                readers.setdefault(i, []).append(None)
    outputs = set(graph.output_names())
    kept = []
    for cap, nodes in taken:
        stay = []
        for n in nodes:
            # only a Constant taken alone: a fused group reads its value inside itself
            if len(nodes) == 1 and n.op_type == "Constant" and n.domain == "":
                users = readers.get(n.outputs[0], [])
                if n.outputs[0] in outputs or not users or any(u is None or id(u) not in ids for u in users):
                    _refuse(result, n, provider, CONSTANT_KEPT)
                    continue
            stay.append(n)
        if stay:
            kept.append((cap, stay))
    return kept

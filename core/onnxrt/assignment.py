"""Which provider runs which nodes, in onnxruntime's form: ``OrtEpAssignedSubgraph``.

``InferenceSession.get_provider_graph_assignment_info()`` answers only for sessions
built with the config entry ``session.record_ep_graph_assignment_info`` set to ``"1"``,
as in onnxruntime. A group of nodes a provider fused and compiled into one kernel is one
subgraph; every other node is a subgraph of its own. onnxrt's own
``get_provider_assignment()`` says the same per node, with each refusal's reason.
"""

from __future__ import annotations

from .errors import Fail

__all__ = ["CONFIG_KEY", "OrtEpAssignedNode", "OrtEpAssignedSubgraph", "assigned_subgraphs"]

CONFIG_KEY = "session.record_ep_graph_assignment_info"


class OrtEpAssignedNode:
    """One node of an assigned subgraph: ``domain``, ``op_type`` and ``name``."""

    def __init__(self, domain: str, op_type: str, name: str):
        self.domain = domain
        self.op_type = op_type
        self.name = name

    def __repr__(self) -> str:
        return f"OrtEpAssignedNode({self.domain}:{self.op_type}/{self.name})"


class OrtEpAssignedSubgraph:
    """Nodes one provider runs together: ``ep_name`` and :meth:`get_nodes`."""

    def __init__(self, ep_name: str, nodes: list[OrtEpAssignedNode]):
        self.ep_name = ep_name
        self._nodes = nodes

    def get_nodes(self) -> list[OrtEpAssignedNode]:
        """The subgraph's nodes."""
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"OrtEpAssignedSubgraph({self.ep_name}, {len(self._nodes)} nodes)"


def assigned_subgraphs(built, session_options) -> list[OrtEpAssignedSubgraph]:
    """The main graph's assignment as subgraphs; an error unless the session recorded it."""
    if session_options._config.get(CONFIG_KEY, "0").strip() != "1":
        raise Fail(f"Session configuration entry '{CONFIG_KEY}' must be set to \"1\" to retrieve "
                   "the provider graph assignment info")
    graph = built.graph
    by_name = {n.name: n for n in graph.nodes}
    grouped: dict[str, int] = {}
    out: list[OrtEpAssignedSubgraph] = []
    for group in built.fused:
        nodes = [by_name[n] for n in group["nodes"] if n in by_name]
        if not nodes:
            continue
        for n in nodes:
            grouped[n.name] = len(out)
        out.append(OrtEpAssignedSubgraph(group["provider"],
                                         [OrtEpAssignedNode(n.domain or "", n.op_type, n.name) for n in nodes]))
    for n in graph.nodes:
        if n.name in grouped:
            continue
        out.append(OrtEpAssignedSubgraph(n.provider, [OrtEpAssignedNode(n.domain or "", n.op_type, n.name)]))
    return out

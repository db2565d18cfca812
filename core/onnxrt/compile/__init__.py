"""Stage 6, compile: a kernel for every node (a compiled one for every fused group),
handed to the planner as the plan's steps. :mod:`.node_info` tells kernels about their
nodes; :mod:`.compiler` builds the kernels and the plans of graphs and subgraphs."""

from .compiler import Subgraph, compile_plan
from .node_info import NodeInfoFactory

__all__ = ["Subgraph", "compile_plan", "NodeInfoFactory"]

"""Stage 4, partition: which provider runs each node, and why the others do not.

:mod:`.partitioner` asks the providers in priority order and applies the core's
policy; :mod:`.cpu_preferred` finds the shape computations that stay on the CPU.
"""

from .cpu_preferred import SHAPE_SOURCES, cpu_preferred_nodes
from .partitioner import CONSTANT_KEPT, CONTROL_FLOW_KEPT, SHAPE_KEPT, GraphView, Partition, partition

__all__ = ["cpu_preferred_nodes", "SHAPE_SOURCES", "GraphView", "Partition", "partition",
           "SHAPE_KEPT", "CONSTANT_KEPT", "CONTROL_FLOW_KEPT"]

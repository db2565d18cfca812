"""Stage 4, partition: which provider runs each node, and why the others do not."""

from .cpu_preferred import SHAPE_SOURCES, cpu_preferred_nodes

__all__ = ["cpu_preferred_nodes", "SHAPE_SOURCES"]

"""The CPU provider's kernel registry; kernel modules register into it with ``@op``."""

from onnxrt.plugin.kernel import KernelRegistry

REGISTRY = KernelRegistry()
op = REGISTRY.op

__all__ = ["REGISTRY", "op"]

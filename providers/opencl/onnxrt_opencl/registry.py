"""The OpenCL provider's kernel registry; kernel modules register into it with ``@op``.

Kernels registered here are :class:`onnxrt_opencl.kernels.base.CLKernel` subclasses. Use
``types=`` and ``accepts=`` to refuse nodes a kernel cannot run (a dtype, an attribute):
the node then falls back to the CPU provider and the refusal reason is recorded.
"""

from onnxrt.plugin.kernel import KernelRegistry

REGISTRY = KernelRegistry()
op = REGISTRY.op

__all__ = ["REGISTRY", "op"]

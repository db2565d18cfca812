"""The CPU execution provider: numpy kernels for every operator."""

from __future__ import annotations

from onnxrt.plugin.kernel import KernelRegistry
from onnxrt.plugin.provider import ExecutionProvider

__all__ = ["CPUExecutionProvider"]


class CPUExecutionProvider(ExecutionProvider):
    """Runs every ONNX operator on the host with numpy, and the hottest ones
    (convolutions, pooling, activations) through optional compiled kernels
    (``onnxrt_cpu.native``) where they were built.

    It comes last in every session, so it must run whatever the other providers
    leave. Its kernels are also used for constant folding.
    """

    name = "CPUExecutionProvider"
    aliases = ("cpu",)
    priority = 0
    option_types = {}

    @classmethod
    def details(cls) -> str:
        """Whether the compiled kernels (``onnxrt_cpu.native``) are loaded, and their
        BLAS, or why not."""
        from . import native

        st = native.status()
        if not st["loaded"]:
            return f"numpy kernels only: compiled kernels {st['reason']}"
        if not st["blas"]:
            return f"compiled kernels loaded; convolutions on numpy ({st['blas_reason']})"
        import os

        return f"compiled kernels loaded, products through {os.path.basename(st['blas'])}"

    @classmethod
    def build_registry(cls) -> KernelRegistry:
        from . import kernels
        from .registry import REGISTRY

        kernels.load_all()
        reg = KernelRegistry()
        reg.update(REGISTRY)
        return reg

"""The entry point onnxrt loads: registers the CPU provider."""

from onnxrt import hookimpl

from .provider import CPUExecutionProvider


@hookimpl
def onnxrt_register_providers(registry):
    """Add :class:`CPUExecutionProvider`."""
    registry.add_provider(CPUExecutionProvider)

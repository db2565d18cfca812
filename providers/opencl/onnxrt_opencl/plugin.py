"""The entry point onnxrt loads: registers the OpenCL provider."""

from onnxrt import hookimpl

from .provider import OpenCLExecutionProvider


@hookimpl
def onnxrt_register_providers(registry):
    """Add :class:`OpenCLExecutionProvider`."""
    registry.add_provider(OpenCLExecutionProvider)

"""The entry point onnxrt loads: registers the CUDA provider (available or not)."""

from onnxrt import hookimpl

from .provider import CUDAExecutionProvider


@hookimpl
def onnxrt_register_providers(registry):
    """Add :class:`CUDAExecutionProvider`; it reports itself unavailable without a GPU."""
    registry.add_provider(CUDAExecutionProvider)

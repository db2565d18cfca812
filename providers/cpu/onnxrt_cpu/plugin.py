"""The entry point onnxrt loads: registers the CPU provider and its graph rewrites."""

from onnxrt import hookimpl

from .provider import CPUExecutionProvider


@hookimpl
def onnxrt_register_providers(registry):
    """Add :class:`CPUExecutionProvider`."""
    registry.add_provider(CPUExecutionProvider)


@hookimpl
def onnxrt_register_transformers(registry):
    """Add the expansion of the training op ``Gradient`` into backward nodes."""
    from .gradient import expand_gradient

    registry.add("expand_gradient", expand_gradient, level=0, phase="expand")
